//! `target-node-labels`: parsing and matching as upstream's
//! `getKeyValuePropertiesFromAnnotation` and `filterTargetNodes`.

use std::collections::BTreeMap;

use super::{labels_match, parse_key_values};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn parsing_keeps_bare_keys_and_empty_values_as_empty() {
    assert_eq!(parse_key_values("pool"), map(&[("pool", "")]));
    assert_eq!(parse_key_values("pool="), map(&[("pool", "")]));
    assert_eq!(parse_key_values("pool=web"), map(&[("pool", "web")]));
    assert_eq!(
        parse_key_values("pool=web,gpu,zone="),
        map(&[("pool", "web"), ("gpu", ""), ("zone", "")])
    );
}

#[test]
fn parsing_trims_around_pairs_but_not_inside_them() {
    // Upstream trims the whole value and each pair, never the two sides of
    // `=`: `a = b` is the key `a ` with the value ` b`.
    assert_eq!(
        parse_key_values("  pool=web , gpu  ,"),
        map(&[("pool", "web"), ("gpu", "")])
    );
    assert_eq!(parse_key_values("a = b"), map(&[("a ", " b")]));
    // Blank pairs and pairs without a key are skipped; a later pair wins;
    // anything after a second `=` is dropped.
    assert_eq!(parse_key_values(",,=x, "), map(&[]));
    assert_eq!(parse_key_values("k=1,k=2"), map(&[("k", "2")]));
    assert_eq!(parse_key_values("k=v=w"), map(&[("k", "v")]));
}

#[test]
fn a_key_without_a_value_matches_any_value_of_that_label() {
    let node = map(&[("pool", "web"), ("gpu", "true")]);
    for annotation in ["pool", "pool=", " pool ", "pool,gpu", "pool=,gpu="] {
        assert!(
            labels_match(&node, &parse_key_values(annotation)),
            "{annotation:?} must select a node labelled pool=web,gpu=true"
        );
    }
    assert!(!labels_match(
        &map(&[("gpu", "true")]),
        &parse_key_values("pool")
    ));
    assert!(!labels_match(&map(&[]), &parse_key_values("pool=")));
}

#[test]
fn a_key_with_a_value_matches_only_that_value_and_every_pair_must_hold() {
    let node = map(&[("pool", "web"), ("gpu", "true")]);
    assert!(labels_match(&node, &parse_key_values("pool=web")));
    assert!(labels_match(&node, &parse_key_values("pool=web,gpu")));
    assert!(!labels_match(&node, &parse_key_values("pool=db")));
    assert!(!labels_match(&node, &parse_key_values("pool=web,zone")));
    assert!(!labels_match(
        &node,
        &parse_key_values("pool=web,gpu=false")
    ));
    // No annotation (or one with no pairs) selects every node.
    assert!(labels_match(&map(&[]), &parse_key_values("")));
}
