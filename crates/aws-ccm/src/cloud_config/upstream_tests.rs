use super::*;
use crate::cloud_config::{CloudConfig, CloudConfigError};
use std::path::Path;

fn parse(key: &str, value: &str) -> Result<CloudConfig, CloudConfigError> {
    let text = format!("[Global]\n{key} = {value}\n");
    CloudConfig::parse(&text, Path::new("/etc/kubernetes/cloud.conf"))
}

#[test]
fn every_value_class_is_taken_as_its_row_says() {
    for k in CLASSES {
        let at = format!("{} = {:?}", k.key, k.value);
        let got = parse(k.key, k.value);
        match k.here {
            Takes::FailsAtStart => {
                let e = got.err().unwrap_or_else(|| panic!("{at}: started"));
                let shown = e.to_string();
                assert!(
                    shown.contains("cloud.conf:2:") && shown.contains(k.key),
                    "{at}: {shown}"
                );
            }
            Takes::FailsLater => panic!("{at}: no row here fails later"),
            here => {
                let cfg = got.unwrap_or_else(|e| panic!("{at}: {e}"));
                let refused = cfg.nlb_refusals.iter().any(|r| r.key == k.key);
                assert_eq!(
                    refused,
                    here == Takes::FailsNlbs,
                    "{at}: {:?}",
                    cfg.nlb_refusals
                );
                let shared = cfg.shared_probe_refusals.iter().any(|r| r.key == k.key);
                assert_eq!(shared, here == Takes::FailsShared, "{at}");
                assert_eq!(
                    !cfg.tolerated.is_empty(),
                    here == Takes::Skips,
                    "{at}: {:?}",
                    cfg.tolerated
                );
                if matches!(here, Takes::Ignores | Takes::Skips) {
                    let mut plain = cfg.clone();
                    plain.tolerated.clear();
                    assert_eq!(plain, CloudConfig::default(), "{at}: not as if unset");
                }
                if here == Takes::Uses {
                    assert_ne!(cfg, CloudConfig::default(), "{at}: not used");
                }
            }
        }
    }
}

#[test]
fn every_global_key_has_value_classes_and_a_difference_says_why() {
    assert_eq!(keys_without_classes(), Vec::<&str>::new());
    for k in CLASSES {
        assert!(
            k.here == k.go || !k.why.is_empty(),
            "{} {:?}",
            k.key,
            k.value
        );
    }
}

#[test]
fn cloud_config_doc_matches_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/cloud-config.md");
    let page = std::fs::read_to_string(path).expect("docs/cloud-config.md is readable");
    let begin = page.find(DOC_BEGIN).expect("the begin marker");
    let end = page.find(DOC_END).expect("the end marker") + DOC_END.len();
    if std::env::var_os("UPDATE_README").is_some() {
        let updated = format!("{}{}{}", &page[..begin], doc_section(), &page[end..]);
        std::fs::write(path, updated).expect("docs/cloud-config.md is writable");
        return;
    }
    assert_eq!(
        &page[begin..end],
        doc_section(),
        "docs/cloud-config.md drifted from cloud_config/upstream.rs; regenerate it with \
         `UPDATE_README=1 cargo test -p aws-ccm --lib cloud_config_doc`"
    );
}
