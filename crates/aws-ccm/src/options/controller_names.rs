//! Controller names and the `--controllers` flag that selects them.
//!
//! Names and aliases follow k8s.io/cloud-provider so upstream manifests keep
//! working: `*` enables every controller that is on by default, `-name`
//! disables one, a bare `name` enables one (e.g. `*,-route,tagging`).

use std::collections::BTreeSet;
use std::fmt;

/// Every controller this binary knows, by its canonical (upstream) name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ControllerName {
    CloudNode,
    CloudNodeLifecycle,
    Service,
    Route,
    NodeIpam,
    Tagging,
}

impl ControllerName {
    pub(crate) const ALL: [ControllerName; 6] = [
        ControllerName::CloudNode,
        ControllerName::CloudNodeLifecycle,
        ControllerName::Service,
        ControllerName::Route,
        ControllerName::NodeIpam,
        ControllerName::Tagging,
    ];

    fn canonical(self) -> &'static str {
        match self {
            ControllerName::CloudNode => "cloud-node-controller",
            ControllerName::CloudNodeLifecycle => "cloud-node-lifecycle-controller",
            ControllerName::Service => "service-lb-controller",
            ControllerName::Route => "node-route-controller",
            ControllerName::NodeIpam => "node-ipam-controller",
            ControllerName::Tagging => "tagging-controller",
        }
    }

    /// Short names accepted by upstream (`cloud-node`, `service`, `route`, ...).
    fn alias(self) -> &'static str {
        match self {
            ControllerName::CloudNode => "cloud-node",
            ControllerName::CloudNodeLifecycle => "cloud-node-lifecycle",
            ControllerName::Service => "service",
            ControllerName::Route => "route",
            ControllerName::NodeIpam => "nodeipam",
            ControllerName::Tagging => "tagging",
        }
    }

    /// Off unless `--controllers` names them: the tagging controller, as
    /// upstream; and node IPAM, which upstream's CCM does not have at all
    /// (kube-controller-manager allocates pod CIDRs there, and deployments
    /// such as kOps pass `--allocate-node-cidrs=true` to both, so `*` turning
    /// it on would start a second allocator on a swap).
    fn enabled_by_default(self) -> bool {
        !matches!(self, ControllerName::Tagging | ControllerName::NodeIpam)
    }

    pub(crate) fn parse(name: &str) -> Option<ControllerName> {
        ControllerName::ALL
            .into_iter()
            .find(|c| c.canonical() == name || c.alias() == name)
    }
}

impl fmt::Display for ControllerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.canonical())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "--controllers: unknown controller {name:?}; known controllers: {known} (prefix with - to disable, * for all defaults)"
)]
pub struct UnknownController {
    name: String,
    known: String,
}

/// Resolves a `--controllers` list into the set of controllers to run.
pub(crate) fn select(list: &[String]) -> Result<BTreeSet<ControllerName>, UnknownController> {
    let unknown = |name: &str| UnknownController {
        name: name.to_string(),
        known: ControllerName::ALL.map(|c| c.alias()).join(", "),
    };
    let mut explicit_on = BTreeSet::new();
    let mut explicit_off = BTreeSet::new();
    let mut star = false;
    for item in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if item == "*" {
            star = true;
        } else if let Some(name) = item.strip_prefix('-') {
            explicit_off.insert(ControllerName::parse(name).ok_or_else(|| unknown(name))?);
        } else {
            explicit_on.insert(ControllerName::parse(item).ok_or_else(|| unknown(item))?);
        }
    }
    let on = |c: &ControllerName| explicit_on.contains(c) || (star && c.enabled_by_default());
    Ok(ControllerName::ALL
        .into_iter()
        .filter(|c| !explicit_off.contains(c) && on(c))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> Result<BTreeSet<ControllerName>, UnknownController> {
        select(&s.split(',').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn star_is_every_default_controller() {
        let all = sel("*").unwrap();
        assert!(all.contains(&ControllerName::CloudNode));
        assert!(all.contains(&ControllerName::Route));
        assert!(!all.contains(&ControllerName::Tagging));
    }

    #[test]
    fn node_ipam_runs_only_when_named() {
        for list in ["*", "", "*,-route", "cloud-node,service,route"] {
            assert!(
                !sel(list).unwrap().contains(&ControllerName::NodeIpam),
                "{list:?} must not run node IPAM"
            );
        }
        for list in ["*,nodeipam", "nodeipam", "route,node-ipam-controller"] {
            assert!(
                sel(list).unwrap().contains(&ControllerName::NodeIpam),
                "{list:?} runs node IPAM"
            );
        }
        assert!(
            !sel("*,nodeipam,-nodeipam")
                .unwrap()
                .contains(&ControllerName::NodeIpam)
        );
    }

    #[test]
    fn upstream_syntax_with_aliases_and_canonical_names() {
        let s = sel("*,-route,tagging").unwrap();
        assert!(!s.contains(&ControllerName::Route));
        assert!(s.contains(&ControllerName::Tagging));
        assert!(s.contains(&ControllerName::Service));
        let s = sel("cloud-node-controller,service").unwrap();
        assert_eq!(
            s,
            BTreeSet::from([ControllerName::CloudNode, ControllerName::Service])
        );
        // Disabling wins over enabling, whatever the order.
        assert!(sel("-service,service").unwrap().is_empty());
    }

    #[test]
    fn unknown_names_are_errors_that_list_the_known_ones() {
        let err = sel("*,-rout").unwrap_err().to_string();
        assert!(
            err.contains("\"rout\"") && err.contains("route") && err.contains("--controllers"),
            "{err}"
        );
    }
}
