//! Values for property tests: what users write where the CCM reads text.

use proptest::prelude::*;

/// Values users write in annotations, right and wrong: numbers, booleans,
/// lists, key=value pairs, CIDRs, ARNs, whitespace and arbitrary text.
pub fn annotation_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        "(true|false|TRUE|yes|0|1)",
        "[a-z0-9=,:/. -]{0,40}",
        "([a-z]{1,8}=[a-z0-9]{0,8},?){1,4}",
        "([0-9]{1,3}\\.){3}[0-9]{1,3}(/[0-9]{1,3})?(,([0-9]{1,3}\\.){3}[0-9]{1,3}/[0-9]{1,2}){0,2}",
        "arn:aws:[a-z]{0,10}:[a-z0-9-]{0,12}:[0-9]{0,12}:[a-z/0-9-]{0,20}",
        "(sg|subnet|eipalloc)-[0-9a-f]{0,17}(,(sg|subnet|eipalloc)-[0-9a-f]{0,17}){0,2}",
        "\\PC{0,30}",
    ]
}
