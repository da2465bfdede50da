//! The table of resources the test server serves, and everything that is
//! derived from it: discovery documents, list strategies for patches and
//! server-side apply, and the field selectors each resource supports.
//!
//! Storage is generic JSON; the table carries the few per-resource facts the
//! real registry strategies encode in Go code.

use serde_json::{Value, json};

/// How a list field merges in a strategic merge patch
/// (the `patchStrategy`/`patchMergeKey` struct tags of the Go types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SmpList {
    /// No patch strategy: the list in the patch replaces the stored one.
    Replace,
    /// `patchStrategy:"merge"` on a list of primitives: set union.
    MergePrimitive,
    /// `patchStrategy:"merge" patchMergeKey:"<key>"` on a list of objects.
    MergeKey(&'static str),
}

/// How a list field is treated by server-side apply
/// (the `+listType`/`+listMapKey` markers of the Go types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SsaList {
    /// `+listType=atomic`: owned and replaced as a whole.
    Atomic,
    /// `+listType=set`: each primitive value is owned on its own.
    Set,
    /// `+listType=map` with these `+listMapKey`s: each item is owned on its own.
    Map(&'static [&'static str]),
}

/// One list field: its path as dot-joined object keys from the root (list
/// items are traversed without adding a segment), and its two strategies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ListRule {
    pub path: &'static str,
    pub smp: SmpList,
    pub ssa: SsaList,
}

const fn rule(path: &'static str, smp: SmpList, ssa: SsaList) -> ListRule {
    ListRule { path, smp, ssa }
}

/// List rules shared by every resource (they live in ObjectMeta).
const META_RULES: &[ListRule] = &[
    rule("metadata.finalizers", SmpList::MergePrimitive, SsaList::Set),
    rule(
        "metadata.ownerReferences",
        SmpList::MergeKey("uid"),
        SsaList::Map(&["uid"]),
    ),
];

const NODE_RULES: &[ListRule] = &[
    rule("spec.taints", SmpList::Replace, SsaList::Atomic),
    rule("spec.podCIDRs", SmpList::MergePrimitive, SsaList::Set),
    // NodeAddress lists carry a merge key for patches but are atomic for
    // apply because the kubelet may report several addresses of one type.
    rule(
        "status.addresses",
        SmpList::MergeKey("type"),
        SsaList::Atomic,
    ),
    rule(
        "status.conditions",
        SmpList::MergeKey("type"),
        SsaList::Map(&["type"]),
    ),
    rule("status.images", SmpList::Replace, SsaList::Atomic),
    rule("status.volumesAttached", SmpList::Replace, SsaList::Atomic),
    rule("status.volumesInUse", SmpList::Replace, SsaList::Atomic),
];

const SERVICE_RULES: &[ListRule] = &[
    rule(
        "spec.ports",
        SmpList::MergeKey("port"),
        SsaList::Map(&["port", "protocol"]),
    ),
    rule("spec.clusterIPs", SmpList::Replace, SsaList::Atomic),
    rule("spec.externalIPs", SmpList::Replace, SsaList::Atomic),
    rule("spec.ipFamilies", SmpList::Replace, SsaList::Atomic),
    rule(
        "spec.loadBalancerSourceRanges",
        SmpList::Replace,
        SsaList::Atomic,
    ),
    rule(
        "status.loadBalancer.ingress",
        SmpList::Replace,
        SsaList::Atomic,
    ),
    rule(
        "status.conditions",
        SmpList::MergeKey("type"),
        SsaList::Map(&["type"]),
    ),
];

const POD_RULES: &[ListRule] = &[
    rule(
        "spec.containers",
        SmpList::MergeKey("name"),
        SsaList::Map(&["name"]),
    ),
    rule(
        "spec.initContainers",
        SmpList::MergeKey("name"),
        SsaList::Map(&["name"]),
    ),
    rule(
        "spec.volumes",
        SmpList::MergeKey("name"),
        SsaList::Map(&["name"]),
    ),
    rule("spec.tolerations", SmpList::Replace, SsaList::Atomic),
    rule(
        "spec.containers.env",
        SmpList::MergeKey("name"),
        SsaList::Map(&["name"]),
    ),
    rule(
        "spec.containers.ports",
        SmpList::MergeKey("containerPort"),
        SsaList::Map(&["containerPort", "protocol"]),
    ),
    rule(
        "status.conditions",
        SmpList::MergeKey("type"),
        SsaList::Map(&["type"]),
    ),
    rule("status.podIPs", SmpList::MergeKey("ip"), SsaList::Atomic),
    rule(
        "status.containerStatuses",
        SmpList::Replace,
        SsaList::Atomic,
    ),
];

const NAMESPACE_RULES: &[ListRule] = &[
    rule("spec.finalizers", SmpList::Replace, SsaList::Atomic),
    rule(
        "status.conditions",
        SmpList::MergeKey("type"),
        SsaList::Map(&["type"]),
    ),
];

const VALIDATING_WEBHOOK_RULES: &[ListRule] = &[
    rule(
        "webhooks",
        SmpList::MergeKey("name"),
        SsaList::Map(&["name"]),
    ),
    rule("webhooks.rules", SmpList::Replace, SsaList::Atomic),
    rule(
        "webhooks.admissionReviewVersions",
        SmpList::Replace,
        SsaList::Atomic,
    ),
];

const ENDPOINTS_RULES: &[ListRule] = &[rule("subsets", SmpList::Replace, SsaList::Atomic)];

const ENDPOINT_SLICE_RULES: &[ListRule] = &[
    rule("endpoints", SmpList::Replace, SsaList::Atomic),
    rule("ports", SmpList::Replace, SsaList::Atomic),
];

/// Field selectors of core/v1 events (label → JSON path).
const CORE_EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject.kind", "involvedObject.kind"),
    ("involvedObject.namespace", "involvedObject.namespace"),
    ("involvedObject.name", "involvedObject.name"),
    ("involvedObject.uid", "involvedObject.uid"),
    ("involvedObject.apiVersion", "involvedObject.apiVersion"),
    (
        "involvedObject.resourceVersion",
        "involvedObject.resourceVersion",
    ),
    ("involvedObject.fieldPath", "involvedObject.fieldPath"),
    ("reason", "reason"),
    ("reportingComponent", "reportingComponent"),
    ("source", "source.component"),
    ("type", "type"),
];

/// Field selectors of events.k8s.io/v1 events: label → JSON path in the
/// stored (core/v1) form.
const EVENTS_V1_FIELDS: &[(&str, &str)] = &[
    ("regarding.kind", "involvedObject.kind"),
    ("regarding.namespace", "involvedObject.namespace"),
    ("regarding.name", "involvedObject.name"),
    ("regarding.uid", "involvedObject.uid"),
    ("regarding.apiVersion", "involvedObject.apiVersion"),
    (
        "regarding.resourceVersion",
        "involvedObject.resourceVersion",
    ),
    ("regarding.fieldPath", "involvedObject.fieldPath"),
    ("reason", "reason"),
    ("reportingController", "reportingComponent"),
    ("type", "type"),
];

/// events.k8s.io/v1 field names → core/v1 field names (the two APIs serve
/// one storage; the conversion is a rename of top-level fields).
const EVENTS_V1_RENAMES: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

const POD_FIELDS: &[(&str, &str)] = &[
    ("spec.nodeName", "spec.nodeName"),
    ("spec.restartPolicy", "spec.restartPolicy"),
    ("spec.schedulerName", "spec.schedulerName"),
    ("spec.serviceAccountName", "spec.serviceAccountName"),
    ("spec.hostNetwork", "spec.hostNetwork"),
    ("status.phase", "status.phase"),
    ("status.podIP", "status.podIP"),
    ("status.nominatedNodeName", "status.nominatedNodeName"),
];

/// What the server knows about one resource. The booleans mirror the
/// registry strategy of the real resource.
#[derive(Debug)]
pub(crate) struct ResourceDef {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource: the main resource never writes `.status`
    /// and `/status` never writes anything but `.status` and metadata.
    pub status_subresource: bool,
    /// Has a spec, so `metadata.generation` is tracked.
    pub generation: bool,
    /// PUT on a missing object creates it (`AllowCreateOnUpdate`).
    pub allow_create_on_update: bool,
    /// DELETE answers with the deleted object rather than a `Status`
    /// (`ReturnDeletedObject` in the Go registry).
    pub return_deleted_object: bool,
    pub short_names: &'static [&'static str],
    /// Resource-specific field selector labels, each with its JSON path.
    pub fields: &'static [(&'static str, &'static str)],
    pub lists: &'static [ListRule],
    /// Another resource (group, plural) whose storage this one serves in
    /// its own form, as events.k8s.io/v1 serves core/v1 events.
    pub storage: Option<(&'static str, &'static str)>,
    /// Top-level field renames (this resource's name, storage name).
    pub renames: &'static [(&'static str, &'static str)],
}

impl ResourceDef {
    /// `v1` or `group/version`, as in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`, as the real server names a resource in messages.
    pub fn group_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `Kind` or `Kind.group`, as used in "is invalid" messages.
    pub fn group_kind(&self) -> String {
        if self.group.is_empty() {
            self.kind.to_string()
        } else {
            format!("{}.{}", self.kind, self.group)
        }
    }

    /// The list rule for a dotted path, metadata rules first.
    pub fn list_rule(&self, path: &str) -> Option<&'static ListRule> {
        META_RULES
            .iter()
            .chain(self.lists.iter())
            .find(|r| r.path == path)
    }

    /// The JSON path behind a field selector label, if this resource supports it.
    pub fn field_path(&self, label: &str) -> Option<&'static str> {
        match label {
            "metadata.name" => Some("metadata.name"),
            "metadata.namespace" => Some("metadata.namespace"),
            _ => self
                .fields
                .iter()
                .find(|(l, _)| *l == label)
                .map(|(_, p)| *p),
        }
    }

    fn verbs(&self) -> Vec<&'static str> {
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

/// Every resource the server serves.
pub(crate) static RESOURCES: &[ResourceDef] = &[
    ResourceDef {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        status_subresource: true,
        generation: false,
        allow_create_on_update: false,
        return_deleted_object: true,
        short_names: &["ns"],
        fields: &[("status.phase", "status.phase")],
        lists: NAMESPACE_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status_subresource: true,
        generation: true,
        allow_create_on_update: false,
        return_deleted_object: false,
        short_names: &["no"],
        fields: &[("spec.unschedulable", "spec.unschedulable")],
        lists: NODE_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        status_subresource: true,
        generation: true,
        allow_create_on_update: false,
        return_deleted_object: true,
        short_names: &["svc"],
        fields: &[
            ("spec.clusterIP", "spec.clusterIP"),
            ("spec.type", "spec.type"),
        ],
        lists: SERVICE_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: true,
        return_deleted_object: false,
        short_names: &["ep"],
        fields: &[],
        lists: ENDPOINTS_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: true,
        return_deleted_object: false,
        short_names: &["ev"],
        fields: CORE_EVENT_FIELDS,
        lists: &[],
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: false,
        return_deleted_object: false,
        short_names: &["cm"],
        fields: &[],
        lists: &[],
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: false,
        return_deleted_object: true,
        short_names: &["sa"],
        fields: &[],
        lists: &[],
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status_subresource: true,
        generation: true,
        allow_create_on_update: false,
        return_deleted_object: true,
        short_names: &["po"],
        fields: POD_FIELDS,
        lists: POD_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: true,
        return_deleted_object: false,
        short_names: &["ev"],
        fields: EVENTS_V1_FIELDS,
        lists: &[],
        storage: Some(("", "events")),
        renames: EVENTS_V1_RENAMES,
    },
    ResourceDef {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: true,
        return_deleted_object: false,
        short_names: &[],
        fields: &[],
        lists: &[],
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        status_subresource: false,
        generation: false,
        allow_create_on_update: false,
        return_deleted_object: false,
        short_names: &[],
        fields: &[],
        lists: ENDPOINT_SLICE_RULES,
        storage: None,
        renames: &[],
    },
    ResourceDef {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        singular: "validatingwebhookconfiguration",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
        status_subresource: false,
        generation: true,
        allow_create_on_update: false,
        return_deleted_object: false,
        short_names: &[],
        fields: &[],
        lists: VALIDATING_WEBHOOK_RULES,
        storage: None,
        renames: &[],
    },
];

/// Index of the namespaces resource in [`RESOURCES`].
pub(crate) const NAMESPACES: usize = 0;

/// Index of validatingwebhookconfigurations in [`RESOURCES`].
pub(crate) fn validating_webhooks() -> usize {
    find(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
    )
    .expect("the resource table serves validatingwebhookconfigurations")
}

/// Finds a resource by group, version and plural.
pub(crate) fn find(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The resource whose storage holds `res`'s objects (itself, or the one it
/// is an alternative form of).
pub(crate) fn storage_index(res: usize) -> usize {
    match RESOURCES[res].storage {
        Some((group, plural)) => RESOURCES
            .iter()
            .position(|r| r.group == group && r.plural == plural)
            .unwrap_or(res),
        None => res,
    }
}

fn rename(v: &Value, from_storage: bool, def: &ResourceDef, target: &ResourceDef) -> Value {
    let mut out = v.clone();
    if let Some(m) = out.as_object_mut() {
        for (view, stored) in def.renames {
            let (from, to) = if from_storage {
                (stored, view)
            } else {
                (view, stored)
            };
            if let Some(x) = m.remove(*from) {
                m.insert((*to).to_string(), x);
            }
        }
        m.insert("apiVersion".into(), json!(target.api_version()));
        m.insert("kind".into(), json!(target.kind));
    }
    out
}

/// A stored object in `def`'s form, or None when it is stored that way.
pub(crate) fn to_view(def: &ResourceDef, stored: &Value) -> Option<Value> {
    def.storage.map(|_| rename(stored, true, def, def))
}

/// An object in `res`'s form converted to its stored form.
pub(crate) fn to_storage(res: usize, v: Value) -> Value {
    let def = &RESOURCES[res];
    match def.storage {
        Some(_) => rename(&v, false, def, &RESOURCES[storage_index(res)]),
        None => v,
    }
}

/// Finds a resource by `apiVersion` and `kind`, as found in a manifest.
pub(crate) fn find_kind(api_version: &str, kind: &str) -> Option<usize> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.kind == kind)
}

/// The groups other than core, in table order, each with its one version.
fn groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES.iter().filter(|r| !r.group.is_empty()) {
        if !out.iter().any(|(g, _)| *g == r.group) {
            out.push((r.group, r.version));
        }
    }
    out
}

/// The `APIVersions` document served at `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(group: &str, version: &str) -> Value {
    let gv = format!("{group}/{version}");
    json!({
        "name": group,
        "versions": [{"groupVersion": gv, "version": version}],
        "preferredVersion": {"groupVersion": gv, "version": version},
    })
}

/// The `APIGroupList` document served at `/apis`.
pub(crate) fn group_list() -> Value {
    let groups: Vec<Value> = groups().into_iter().map(|(g, v)| group_doc(g, v)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The `APIGroup` document served at `/apis/<group>`, if the group exists.
pub(crate) fn group(group: &str) -> Option<Value> {
    groups()
        .into_iter()
        .find(|(g, _)| *g == group)
        .map(|(g, v)| {
            let mut doc = group_doc(g, v);
            doc["kind"] = json!("APIGroup");
            doc["apiVersion"] = json!("v1");
            doc
        })
}

/// The `APIResourceList` served at `/api/v1` or `/apis/<group>/<version>`.
pub(crate) fn resource_list(group: &str, version: &str) -> Option<Value> {
    let defs: Vec<&ResourceDef> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if defs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in &defs {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs(),
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        resources.push(doc);
        if r.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let group_version = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }))
}

/// The media type of aggregated discovery (`apidiscovery.k8s.io/v2`).
pub(crate) const AGGREGATED_DISCOVERY: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The aggregated discovery document served at `/api` (core) or `/apis`
/// (every other group) when the client asks for it.
pub(crate) fn aggregated(core: bool) -> Value {
    let mut names: Vec<&str> = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group.is_empty() == core) {
        if !names.contains(&r.group) {
            names.push(r.group);
        }
    }
    let items: Vec<Value> = names
        .into_iter()
        .map(|group| {
            let defs: Vec<&ResourceDef> = RESOURCES.iter().filter(|r| r.group == group).collect();
            let version = defs.first().map(|d| d.version).unwrap_or("v1");
            let resources: Vec<Value> = defs
                .iter()
                .map(|r| {
                    let kind = json!({"group": r.group, "version": r.version, "kind": r.kind});
                    let mut doc = json!({
                        "resource": r.plural,
                        "responseKind": kind,
                        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": r.singular,
                        "verbs": r.verbs(),
                    });
                    if !r.short_names.is_empty() {
                        doc["shortNames"] = json!(r.short_names);
                    }
                    if r.status_subresource {
                        doc["subresources"] = json!([{"subresource": "status", "responseKind": kind, "verbs": ["get", "patch", "update"]}]);
                    }
                    doc
                })
                .collect();
            json!({
                "metadata": {"name": group},
                "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
            })
        })
        .collect();
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apiserver_table_lookups() {
        assert_eq!(RESOURCES[NAMESPACES].plural, "namespaces");
        let lease = find("coordination.k8s.io", "v1", "leases").map(|i| &RESOURCES[i]);
        assert_eq!(
            lease.map(|r| r.group_resource()).as_deref(),
            Some("leases.coordination.k8s.io")
        );
        assert_eq!(
            find_kind("v1", "Node").map(|i| RESOURCES[i].plural),
            Some("nodes")
        );
        assert_eq!(
            find_kind("events.k8s.io/v1", "Event").map(|i| RESOURCES[i].group),
            Some("events.k8s.io")
        );
        let node = &RESOURCES[find("", "v1", "nodes").unwrap_or(0)];
        assert_eq!(
            node.list_rule("spec.taints").map(|r| r.smp),
            Some(SmpList::Replace)
        );
        assert_eq!(
            node.list_rule("metadata.finalizers").map(|r| r.ssa),
            Some(SsaList::Set)
        );
        assert_eq!(node.field_path("spec.providerID"), None);
        let ev = find("events.k8s.io", "v1", "events").unwrap_or(0);
        let core = storage_index(ev);
        assert_eq!(
            (RESOURCES[core].group, RESOURCES[core].plural),
            ("", "events")
        );
        let view = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "regarding": {"name": "n"}, "note": "x"});
        let stored = to_storage(ev, view.clone());
        assert_eq!(
            stored,
            json!({"apiVersion": "v1", "kind": "Event", "involvedObject": {"name": "n"}, "message": "x"})
        );
        assert_eq!(to_view(&RESOURCES[ev], &stored), Some(view));
        assert_eq!(to_view(&RESOURCES[core], &stored), None);
    }

    #[test]
    fn apiserver_discovery_documents() {
        let core = resource_list("", "v1").unwrap_or_default();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
            .unwrap_or_default();
        assert!(names.contains(&"nodes/status"));
        assert!(names.contains(&"configmaps"));
        assert!(group("coordination.k8s.io").is_some());
        assert!(group("admissionregistration.k8s.io").is_some());
        assert_eq!(group_list()["groups"].as_array().map(Vec::len), Some(4));
    }
}
