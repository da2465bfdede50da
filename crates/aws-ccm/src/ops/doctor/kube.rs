//! What Kubernetes shows: Nodes still waiting for the CCM, kubelets not
//! started with `--cloud-provider=external`, the RBAC the CCM needs
//! (SelfSubjectAccessReview, answered for this kubeconfig's user), a second
//! pod CIDR allocator, and the leader Lease.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use super::{Check, Context, first};
use crate::controllers::cached_node::Node;
use crate::controllers::node::plan::{UNINITIALIZED_TAINT, is_uninitialized};
use crate::controllers::node_ipam;
use crate::ops::short_age;
use crate::options::controller_names::ControllerName;

/// How long a Node may wait for initialization before it is a failure (the
/// alert's threshold, docs/operations.md).
const UNINITIALIZED_FAIL_AFTER: Duration = Duration::from_secs(300);

/// Every Node, in pages.
pub(crate) async fn list_nodes(kube: &kube::Client) -> anyhow::Result<Vec<Node>> {
    let mut nodes = Vec::new();
    let api = Api::all(kube.clone());
    let listed = crate::controllers::cached_node::list_all(&api, |page| nodes.extend(page)).await;
    listed.map_err(|e| anyhow::anyhow!("listing Nodes: {e}"))?;
    Ok(nodes)
}

/// Since when a Node carries the uninitialized taint: its `timeAdded`,
/// else the Node's creation (the kubelet registers with the taint).
fn tainted_since(node: &Node) -> Option<(Timestamp, &'static str)> {
    let taint = node
        .spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == UNINITIALIZED_TAINT)?;
    match &taint.time_added {
        Some(t) => Some((t.0, "taint timeAdded")),
        None => Some((node.metadata.creation_timestamp.as_ref()?.0, "Node created")),
    }
}

fn age(now: Timestamp, then: Timestamp) -> Duration {
    Duration::from_secs(u64::try_from(now.as_second() - then.as_second()).unwrap_or(0))
}

/// Nodes waiting for the CCM, and Nodes whose kubelet is not external.
pub(crate) fn node_checks(nodes: &[Node], now: Timestamp) -> Vec<Check> {
    let mut out = Vec::new();
    let mut not_external = Vec::new();
    for node in nodes {
        let name = node.name_any();
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        if is_uninitialized(node) {
            let (since, from) = tainted_since(node).unwrap_or((now, "now"));
            let waited = age(now, since);
            let detail = format!(
                "Node {name} has carried {UNINITIALIZED_TAINT} for {} ({from})",
                short_age(waited)
            );
            let fix = format!(
                "see why the CCM does not initialize it: kubectl get events --field-selector involvedObject.name={name}, and the instances check above"
            );
            let check = Check::of("kubernetes", "uninitialized Nodes");
            out.push(if waited >= UNINITIALIZED_FAIL_AFTER {
                check.fail(detail, fix)
            } else {
                check.warn(detail, fix)
            });
        } else if provider_id.is_none_or(str::is_empty) {
            not_external.push(name);
        }
    }
    if out.is_empty() {
        out.push(
            Check::of("kubernetes", "uninitialized Nodes")
                .pass(format!("none of {} Nodes waits for the CCM", nodes.len())),
        );
    }
    let kubelets = Check::of("kubernetes", "kubelets with --cloud-provider=external");
    out.push(if not_external.is_empty() {
        kubelets.pass("every Node has a providerID or waits for the CCM")
    } else {
        kubelets.fail(
            format!(
                "no providerID and no {UNINITIALIZED_TAINT} taint, so the CCM will never initialize them: {}",
                first(&not_external, 10)
            ),
            "start their kubelets with --cloud-provider=external (it registers the Node with the uninitialized taint), then delete the Node so that it registers again",
        )
    });
    out
}

/// Where a rule applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Cluster-wide.
    Cluster,
    /// The leader election namespace (`--leader-elect-resource-namespace`).
    LeaseNamespace,
    /// The Lease itself (`--leader-elect-resource-name`).
    Lease,
    /// `kube-system/extension-apiserver-authentication`.
    AuthConfigMap,
    /// The target record beside the Lease (`<Lease name>-targets`).
    TargetRecord,
}

/// One request the CCM makes: (verb, resource as kubectl names it,
/// `resource[/subresource][.group]`, where).
type Need = (&'static str, &'static str, Place);

/// Every request the CCM makes, as manifests/base/rbac.yaml grants it (a
/// unit test keeps the two equal both ways).
pub(crate) const CCM_NEEDS: &[Need] = &[
    ("get", "nodes", Place::Cluster),
    ("list", "nodes", Place::Cluster),
    ("watch", "nodes", Place::Cluster),
    ("patch", "nodes", Place::Cluster),
    ("delete", "nodes", Place::Cluster),
    ("patch", "nodes/status", Place::Cluster),
    ("list", "services", Place::Cluster),
    ("watch", "services", Place::Cluster),
    ("patch", "services", Place::Cluster),
    ("patch", "services/status", Place::Cluster),
    ("create", "events", Place::Cluster),
    ("patch", "events", Place::Cluster),
    (
        "create",
        "leases.coordination.k8s.io",
        Place::LeaseNamespace,
    ),
    ("get", "leases.coordination.k8s.io", Place::Lease),
    ("update", "leases.coordination.k8s.io", Place::Lease),
    ("get", "configmaps", Place::AuthConfigMap),
    ("create", "configmaps", Place::LeaseNamespace),
    ("get", "configmaps", Place::TargetRecord),
    ("update", "configmaps", Place::TargetRecord),
    (
        "create",
        "tokenreviews.authentication.k8s.io",
        Place::Cluster,
    ),
    (
        "create",
        "subjectaccessreviews.authorization.k8s.io",
        Place::Cluster,
    ),
];

/// The review's attributes of one need, with the options' Lease.
pub(crate) fn attributes(need: &Need, opts: &crate::options::Options) -> ResourceAttributes {
    let (verb, what, place) = *need;
    let (resource, group) = what.split_once('.').unwrap_or((what, ""));
    let (resource, subresource) =
        (resource.split_once('/')).map_or((resource, None), |(r, s)| (r, Some(s)));
    let lease_ns = || Some(opts.leader_elect_resource_namespace.clone());
    let (namespace, name) = match place {
        Place::Cluster => (None, None),
        Place::LeaseNamespace => (lease_ns(), None),
        Place::Lease => (lease_ns(), Some(opts.leader_elect_resource_name.clone())),
        Place::TargetRecord => (
            lease_ns(),
            Some(crate::target_record::configmap_name(
                &opts.leader_elect_resource_name,
            )),
        ),
        Place::AuthConfigMap => (
            Some("kube-system".to_string()),
            Some("extension-apiserver-authentication".to_string()),
        ),
    };
    ResourceAttributes {
        verb: Some(verb.into()),
        group: Some(group.into()),
        resource: Some(resource.into()),
        subresource: subresource.map(str::to_string),
        namespace,
        name,
        ..Default::default()
    }
}

/// The need as kubectl would name it, with where it applies.
fn describe((verb, what, _): &Need, a: &ResourceAttributes) -> String {
    match (&a.namespace, &a.name) {
        (Some(ns), Some(name)) => format!("{verb} {what} {ns}/{name}"),
        (Some(ns), None) => format!("{verb} {what} in {ns}"),
        _ => format!("{verb} {what}"),
    }
}

/// The CCM's RBAC, as SelfSubjectAccessReviews answer it for this
/// kubeconfig's user (run with the CCM's service account to check it).
pub(crate) async fn rbac_checks(ctx: &Context) -> Vec<Check> {
    let api: Api<SelfSubjectAccessReview> = Api::all(ctx.kube.clone());
    let mut denied = Vec::new();
    for need in CCM_NEEDS {
        let attrs = attributes(need, &ctx.validated.options);
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(attrs.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) if answer.status.as_ref().is_some_and(|s| s.allowed) => {}
            Ok(_) => denied.push(describe(need, &attrs)),
            Err(e) => {
                return vec![Check::of("kubernetes", "the CCM's RBAC").fail(
                    format!("SelfSubjectAccessReview failed: {e}"),
                    "the kubeconfig's user needs create on selfsubjectaccessreviews.authorization.k8s.io (every authenticated user has it through system:basic-user)",
                )];
            }
        }
    }
    let check = Check::of("kubernetes", "the CCM's RBAC (this kubeconfig's user)");
    let verdict = if denied.is_empty() {
        check.pass(format!(
            "all {} requests the CCM makes are allowed",
            CCM_NEEDS.len()
        ))
    } else {
        check.fail(
            format!("denied: {}", first(&denied, 20)),
            "kubectl apply -f manifests/base/rbac.yaml (it binds the roles to kube-system/cloud-controller-manager); run the doctor with that service account's token to check its RBAC",
        )
    };
    vec![verdict]
}

/// A second pod CIDR allocator, by node IPAM's own start-up test.
pub(crate) fn ipam_check(ctx: &Context, nodes: &[Node]) -> Check {
    let v = &ctx.validated;
    let check = Check::of("kubernetes", "one pod CIDR allocator");
    let runs = v.options.allocate_node_cidrs && v.controllers.contains(&ControllerName::NodeIpam);
    let Some(config) = v.node_cidr_allocation.as_ref().filter(|_| runs) else {
        return check.skip(
            "node IPAM is off (it needs --allocate-node-cidrs=true and nodeipam in --controllers)",
        );
    };
    let (other, overlaps) = node_ipam::start_up_signs(config, nodes);
    if let Some(other) = other {
        return check.fail(
            format!(
                "node {} holds {:?} outside --cluster-cidr",
                other.node, other.cidrs
            ),
            other.to_string(),
        );
    }
    if !overlaps.is_empty() {
        let lines: Vec<String> = overlaps
            .iter()
            .map(|(node, cidrs)| format!("{node} holds {cidrs:?}, held by another Node too"))
            .collect();
        return check.fail(
            first(&lines, 10),
            "two allocators gave one CIDR twice: turn off --allocate-node-cidrs on kube-controller-manager (or drop nodeipam from --controllers here), then recreate the Nodes listed",
        );
    }
    check.pass(format!(
        "every pod CIDR of {} Nodes lies in --cluster-cidr, none twice",
        nodes.len()
    ))
}

/// The leader Lease: its holder, and how long ago it was renewed.
pub(crate) async fn lease_check(ctx: &Context, now: Timestamp) -> Check {
    let o = &ctx.validated.options;
    let ns = &o.leader_elect_resource_namespace;
    let name = &o.leader_elect_resource_name;
    let check = Check::of("kubernetes", format!("leader Lease {ns}/{name}"));
    if !o.leader_elect {
        return check.skip("--leader-elect=false");
    }
    let api: Api<Lease> = Api::namespaced(ctx.kube.clone(), ns);
    let lease = match api.get_opt(name).await {
        Ok(Some(l)) => l,
        Ok(None) => {
            return check.fail(
                "no Lease: no CCM has ever led with these flags",
                format!("check that the CCM runs (kubectl -n kube-system get pods) with --leader-elect-resource-name={name} --leader-elect-resource-namespace={ns}"),
            );
        }
        Err(e) => {
            return check.fail(
                format!("reading the Lease failed: {e}"),
                format!(
                    "the kubeconfig's user needs get on leases.coordination.k8s.io {ns}/{name}"
                ),
            );
        }
    };
    let spec = lease.spec.unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    let renewed = spec.renew_time.map(|t| age(now, t.0));
    match renewed {
        Some(a) if !holder.is_empty() && a <= o.leader_elect_lease_duration => {
            check.pass(format!("held by {holder}, renewed {} ago", short_age(a)))
        }
        _ => check.fail(
            format!(
                "no leader: holder {holder:?}, renewed {} ago, longer than --leader-elect-lease-duration={}",
                renewed.map_or("never".to_string(), short_age),
                short_age(o.leader_elect_lease_duration)
            ),
            "the CCM is not running or cannot renew: kubectl -n kube-system logs for the cloud-controller-manager pods",
        ),
    }
}
