// Not kube-runtime's Controller: nodes due at once share one batched CreateTags/DeleteTags (split in halves on unknown instances), and deletions need the last seen providerID, not one reconcile per object.
//! The tagging controller (off by default, as upstream): puts the `--tags`
//! on each node's EC2 instance, and takes them off when the node is deleted.
//!
//! * A node is tagged once it has a providerID (the cloud-node controller
//!   sets it) and lacks the label `k8s.io/cloud-provider-aws=<checksum of
//!   the tags>`, upstream's label and checksum, so nodes the Go CCM tagged
//!   stay tagged and unchanged nodes cost no AWS call, before or after a
//!   restart.
//! * Nodes that need tags at the same time share one `CreateTags` (up to
//!   1,000 instances per call, EC2's limit). EC2 fails the whole call when
//!   one instance is unknown; the batch is then split in halves until the
//!   unknown ones are isolated. A node whose instance is not found is
//!   retried with backoff a few times, then skipped (until it changes).
//! * On deletion the tags are removed (`DeleteTags`, batched the same way,
//!   matching values only, so a tag someone changed since is left alone),
//!   using the providerID of the last state seen of the node. No finalizer:
//!   a finalizer would make every node deletion wait on this optional
//!   controller (stuck nodes if it is disabled, or after a swap back to the
//!   Go CCM). The price, shared with upstream: a node deleted while no CCM
//!   runs keeps its tags on the instance.
//! * A node whose providerID names a zone of another Region is neither
//!   tagged nor untagged: its instance is not in this Region (a call would
//!   only fail with not-found), and that Region's CCM tags it.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::LazyLock;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::{FutureExt, StreamExt};
use kube::ResourceExt;
use kube::api::Api;
use md5::{Digest, Md5};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ControllerContext;
use super::node::changes::{Changes, node_changes};
use super::node::identity;
use super::schedule::{Wake, sleep, wait};
use crate::backoff::Backoff;
use crate::provider::Cloud;
use crate::provider::instances::{Instances, MAX_TAG_RESOURCES};
use crate::provider::{CloudError, CloudResult};

/// Upstream's label recording which tag set a node's instance carries.
pub const TAGGED_LABEL: &str = "k8s.io/cloud-provider-aws";
/// How long changes are gathered before a pass, so a burst shares calls.
const GATHER: Duration = Duration::from_millis(250);
/// Retries of a node whose instance is not found (EC2 may not list a
/// brand-new instance yet) before it is skipped.
const NOT_FOUND_ATTEMPTS: u32 = 5;
/// Retries of other failures before an item is dropped.
const MAX_ATTEMPTS: u32 = 10;
const RETRY: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(300));

static INITIAL_TAGGING_DELAY: LazyLock<Histogram> = LazyLock::new(|| {
    let h = Histogram::new(exponential_buckets(1.0, 4.0, 6));
    // Upstream's name, spelling included, so dashboards keep working.
    crate::metrics::register(
        "tagging_controller_inital_node_tagging_delay_seconds",
        "Latency (in seconds) between node creation and its first successful tagging by TaggingController.",
        h.clone(),
    );
    h
});

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct WorkItemErrorLabels {
    error_type: String,
    instance_id: String,
}

/// Upstream's `cloudprovider_aws_tagging_controller_work_item_errors_total`
/// with its labels: `total_errors` on each failure that is retried,
/// `errors_after_retries_exhausted` when the node is given up.
static WORK_ITEM_ERRORS: LazyLock<Family<WorkItemErrorLabels, Counter>> = LazyLock::new(|| {
    let family = Family::default();
    crate::metrics::register(
        "cloudprovider_aws_tagging_controller_work_item_errors",
        "any error in dequeueing the work queue and processing workItem (upstream's name and labels)",
        family.clone(),
    );
    family
});

fn record_work_item_error(error_type: &str, instance_id: &str) {
    WORK_ITEM_ERRORS
        .get_or_create(&WorkItemErrorLabels {
            error_type: error_type.to_string(),
            instance_id: instance_id.to_string(),
        })
        .inc();
}

/// Upstream's checksum of a tag set: MD5 of the sorted `k=v` pairs joined
/// by commas, in hex.
pub fn tags_checksum(tags: &[(String, String)]) -> String {
    let mut pairs: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    hex::encode(Md5::digest(pairs.join(",").as_bytes()))
}

/// The instance to tag for `node`, if it needs tagging, in `region`, the
/// CCM's.
pub fn needs_tagging(node: &Node, checksum: &str, region: &str) -> Option<String> {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(TAGGED_LABEL))
        .is_some_and(|v| v == checksum);
    if labelled {
        return None;
    }
    ours(node, region)
}

/// The instance of `node` when it is in `region`, the CCM's.
fn ours(node: &Node, region: &str) -> Option<String> {
    match crate::ids::node_outside_region(node, region) {
        Some(_) => None,
        None => identity::instance_id_of(node),
    }
}

/// The node has the tagging label, whatever its checksum.
fn carries_label(node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    labels.is_some_and(|l| l.contains_key(TAGGED_LABEL))
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Retry {
    attempts: u32,
    not_found: u32,
    due: Instant,
}

impl Retry {
    fn now(now: Instant) -> Retry {
        Retry {
            attempts: 0,
            not_found: 0,
            due: now,
        }
    }

    /// Counts a failure and backs off; true when the retries are exhausted.
    fn failed(&mut self, now: Instant, not_found: bool) -> bool {
        self.attempts += 1;
        self.not_found += u32::from(not_found);
        self.due = now + RETRY.after(self.attempts);
        self.not_found >= NOT_FOUND_ATTEMPTS || self.attempts >= MAX_ATTEMPTS
    }
}

/// A node waiting to be tagged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TagItem {
    pub node: String,
    pub instance: String,
    /// The node had no tagging label at all (for the initial-delay metric).
    pub initial: bool,
    pub created_ms: Option<i64>,
}

/// The controller's bookkeeping: what is waiting, what was given up. Pure;
/// the I/O is in [`Tagger`].
pub struct Pending {
    /// The CCM's Region: Nodes of another are not this controller's.
    region: String,
    tag: BTreeMap<String, (TagItem, Retry)>,
    untag: BTreeMap<String, Retry>,
    /// Nodes skipped after their instance was not found, by (uid, instance):
    /// not retried until the node is replaced or its providerID changes.
    skipped: HashMap<String, (Option<String>, String)>,
    /// Instances this process tagged, so a node deleted before its label
    /// landed still gets untagged.
    tagged: HashSet<String>,
    /// Instances of the nodes that exist (by node name).
    live: HashMap<String, String>,
}

impl Pending {
    pub fn new(region: &str) -> Pending {
        Pending {
            region: region.to_string(),
            tag: BTreeMap::new(),
            untag: BTreeMap::new(),
            skipped: HashMap::new(),
            tagged: HashSet::new(),
            live: HashMap::new(),
        }
    }

    /// Takes in what the informer saw.
    pub fn observe(&mut self, changes: &Changes, checksum: &str, now: Instant) {
        for node in &changes.deleted {
            let name = node.name_any();
            self.tag.remove(&name);
            self.skipped.remove(&name);
            self.live.remove(&name);
        }
        for node in &changes.applied {
            let name = node.name_any();
            match identity::instance_id_of(node) {
                Some(id) => self.live.insert(name.clone(), id),
                None => self.live.remove(&name),
            };
            let Some(instance) = needs_tagging(node, checksum, &self.region) else {
                self.tag.remove(&name);
                continue;
            };
            if self.skipped.get(&name) == Some(&(node.metadata.uid.clone(), instance.clone())) {
                continue;
            }
            self.skipped.remove(&name);
            let item = TagItem {
                node: name.clone(),
                initial: !carries_label(node),
                created_ms: node
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_millisecond()),
                instance,
            };
            match self.tag.get_mut(&name) {
                // Keep the backoff of an item already waiting for the same instance.
                Some((old, _)) if old.instance == item.instance => *old = item,
                _ => {
                    self.tag.insert(name, (item, Retry::now(now)));
                }
            }
        }
        for node in &changes.deleted {
            let Some(instance) = ours(node, &self.region) else {
                continue;
            };
            // Another node may stand on the same instance (re-registered
            // under a new name): its tags stay.
            let still_used = self.live.values().any(|id| id == &instance);
            if (carries_label(node) || self.tagged.contains(&instance)) && !still_used {
                self.untag
                    .entry(instance)
                    .or_insert_with(|| Retry::now(now));
            }
        }
    }

    /// Items due now.
    pub fn due(&self, now: Instant) -> (Vec<TagItem>, Vec<String>) {
        let tag = self.tag.values().filter(|(_, r)| r.due <= now);
        let untag = self.untag.iter().filter(|(_, r)| r.due <= now);
        let tag = tag.map(|(item, _)| item.clone()).collect();
        (tag, untag.map(|(id, _)| id.clone()).collect())
    }

    /// Every key waiting (a node to tag, an instance to untag), with its retry.
    fn retries(&self) -> impl Iterator<Item = (&String, &Retry)> {
        (self.tag.iter().map(|(k, (_, r))| (k, r))).chain(self.untag.iter())
    }

    /// Every node waiting to be tagged and every instance waiting to be
    /// untagged, and those of them due at `now`.
    fn keys(&self, now: Instant) -> (HashSet<&str>, Vec<String>) {
        let due = self.retries().filter(|(_, r)| r.due <= now);
        let all = self.retries().map(|(k, _)| k.as_str()).collect();
        (all, due.map(|(k, _)| k.clone()).collect())
    }

    /// When the next retry is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.retries().map(|(_, r)| r.due).min()
    }

    fn tag_done(&mut self, node: &str, instance: &str) {
        self.tagged.insert(instance.to_string());
        if self
            .tag
            .get(node)
            .is_some_and(|(item, _)| item.instance == instance)
        {
            self.tag.remove(node);
        }
    }

    /// Records a failed tag; returns true when the node is now skipped.
    fn tag_failed(
        &mut self,
        node: &str,
        uid: Option<String>,
        not_found: bool,
        now: Instant,
    ) -> bool {
        let given_up = (self.tag.get_mut(node)).is_some_and(|(_, r)| r.failed(now, not_found));
        if given_up && let Some((item, _)) = self.tag.remove(node) {
            self.skipped.insert(node.to_string(), (uid, item.instance));
        }
        given_up
    }

    fn untag_done(&mut self, instance: &str) {
        self.untag.remove(instance);
        self.tagged.remove(instance);
    }

    /// Records a failed untag; returns true when it is dropped.
    fn untag_failed(&mut self, instance: &str, now: Instant) -> bool {
        let given_up = (self.untag.get_mut(instance)).is_some_and(|r| r.failed(now, false));
        if given_up {
            self.untag.remove(instance);
        }
        given_up
    }
}

/// Applies a tag operation to `ids` in calls of at most 1,000 instances;
/// a call failing with not-found, or refused by IAM (which refuses the
/// whole call for one instance it denies, e.g. one tagged only with the
/// legacy `KubernetesCluster`), is split in halves until the unknown or
/// denied instances are isolated. Every ID gets its own outcome.
pub async fn in_batches<F, Fut>(ids: &[String], mut call: F) -> HashMap<String, CloudResult<()>>
where
    F: FnMut(Vec<String>) -> Fut,
    Fut: std::future::Future<Output = CloudResult<()>>,
{
    let mut out = HashMap::new();
    let mut work: Vec<Vec<String>> = ids
        .chunks(MAX_TAG_RESOURCES)
        .map(<[String]>::to_vec)
        .collect();
    while let Some(part) = work.pop() {
        match call(part.clone()).await {
            Ok(()) => out.extend(part.into_iter().map(|id| (id, Ok(())))),
            Err(err) if (err.is_not_found() || err.is_denied()) && part.len() > 1 => {
                let (a, b) = part.split_at(part.len() / 2);
                work.push(b.to_vec());
                work.push(a.to_vec());
            }
            Err(err) => out.extend(part.into_iter().map(|id| (id, Err(err.clone())))),
        }
    }
    out
}

struct Tagger<I: Instances> {
    kube: kube::Client,
    cloud: I,
    tags: Vec<(String, String)>,
    checksum: String,
    workers: usize,
    nodes: kube::runtime::reflector::Store<Node>,
    events: super::events::Events,
    cluster_id: String,
}

impl<I: Instances> Tagger<I> {
    /// A Warning on the Node whose instance IAM refuses to tag, naming the
    /// tag the policy needs on it.
    async fn warn_denied(&self, item: &TagItem, err: &CloudError) {
        let fix = format!(
            "IAM refused tagging instance {}: the policy lets the CCM tag only instances carrying \
             kubernetes.io/cluster/{id}; tag the instance so, or render the policy with \
             iam/render.sh policy {id} --legacy-cluster-tag if it carries only KubernetesCluster={id} ({err})",
            item.instance,
            id = self.cluster_id,
        );
        tracing::warn!(node = %item.node, instance = %item.instance, error = %err, "tagging refused by IAM");
        self.events
            .warning(
                &super::route::publish::node_ref(&item.node),
                "InstanceUnauthorized",
                fix,
            )
            .await;
    }

    /// Does everything due; the outcome goes back into `pending`.
    async fn pass(&self, pending: &mut Pending) {
        let now = Instant::now();
        let (tag, untag) = pending.due(now);
        if !tag.is_empty() {
            self.tag(pending, tag).await;
        }
        if !untag.is_empty() {
            let results = in_batches(&untag, |ids| async move {
                self.cloud.delete_tags(&ids, &self.tags).await
            })
            .await;
            for (instance, result) in results {
                match result {
                    Ok(()) => {
                        tracing::info!(%instance, tags = ?self.tags, "removed tags from the instance of a deleted node");
                        pending.untag_done(&instance);
                    }
                    // Gone already: nothing to untag.
                    Err(err) if err.is_not_found() => pending.untag_done(&instance),
                    Err(err) => {
                        if pending.untag_failed(&instance, Instant::now()) {
                            tracing::error!(%instance, error = %err, "giving up removing tags from the instance of a deleted node");
                        } else {
                            tracing::warn!(%instance, error = %err, "removing tags failed; retrying");
                        }
                    }
                }
            }
        }
    }

    async fn tag(&self, pending: &mut Pending, items: Vec<TagItem>) {
        let ids: BTreeSet<String> = items.iter().map(|i| i.instance.clone()).collect();
        let ids: Vec<String> = ids.into_iter().collect();
        let results = in_batches(&ids, |ids| async move {
            self.cloud.create_tags(&ids, &self.tags).await
        })
        .await;
        let mut labels = Vec::new();
        for item in items {
            match results.get(&item.instance) {
                Some(Ok(())) => labels.push(item),
                Some(Err(err)) => {
                    let uid = self
                        .nodes
                        .find(|n| n.metadata.name.as_deref() == Some(&item.node))
                        .and_then(|n| n.metadata.uid.clone());
                    if err.is_denied() {
                        self.warn_denied(&item, err).await;
                    }
                    if pending.tag_failed(&item.node, uid, err.is_not_found(), Instant::now()) {
                        record_work_item_error("errors_after_retries_exhausted", &item.instance);
                        tracing::warn!(node = %item.node, instance = %item.instance, error = %err, "skipping node: tagging its instance kept failing");
                    } else {
                        record_work_item_error("total_errors", &item.instance);
                        tracing::warn!(node = %item.node, instance = %item.instance, error = %err, "tagging failed; retrying");
                    }
                }
                None => {}
            }
        }
        let api: Api<Node> = Api::all(self.kube.clone());
        let checksum = self.checksum.clone();
        let labelled: Vec<(TagItem, Result<(), kube::Error>)> = futures::stream::iter(labels)
            .map(|item| {
                let api = api.clone();
                let patch = json!({"metadata": {"labels": {TAGGED_LABEL: checksum}}});
                async move {
                    let result = super::merge_patch(&api, &item.node, patch)
                        .await
                        .map(|_| ());
                    (item, result)
                }
            })
            .buffer_unordered(self.workers)
            .collect()
            .await;
        for (item, result) in labelled {
            match result {
                Ok(()) => {
                    tracing::info!(node = %item.node, instance = %item.instance, tags = ?self.tags, "tagged the node's instance");
                    if item.initial
                        && let Some(created) = item.created_ms
                    {
                        INITIAL_TAGGING_DELAY.observe(super::node::seconds_since(created));
                    }
                    pending.tag_done(&item.node, &item.instance);
                }
                // Deleted meanwhile: the deletion untags.
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    pending.tagged.insert(item.instance.clone());
                    pending.tag.remove(&item.node);
                }
                Err(err) => {
                    pending.tagged.insert(item.instance.clone());
                    tracing::warn!(node = %item.node, error = %err, "labelling the node failed; retrying");
                    pending.tag_failed(&item.node, None, false, Instant::now());
                }
            }
        }
    }
}

/// Runs the controller until `stop` is cancelled.
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    let tags = ctx.options.tags.clone();
    if tags.is_empty() {
        // Refused at start-up; kept as a guard.
        tracing::error!("the tagging controller needs --tags; it does nothing");
        stop.cancelled().await;
        return;
    }
    LazyLock::force(&INITIAL_TAGGING_DELAY);
    let tagger = Tagger {
        kube: ctx.kube.clone(),
        cloud: ctx.provider.clone(),
        checksum: tags_checksum(&tags),
        tags,
        workers: ctx.options.options.concurrent_node_syncs.max(4) as usize,
        nodes: ctx.nodes.clone(),
        events: super::events::Events::new(ctx.kube.clone(), "tagging-controller"),
        cluster_id: ctx.cluster_id.clone(),
    };
    let mut pending = Pending::new(&ctx.region);
    // client-go's workqueue metrics under the Go controller's queue name.
    let queue = super::schedule::workqueue::Queue::new("tagging-controller");
    let mut changes = Box::pin(node_changes(ctx.nodes.clone(), &ctx.node_feed));
    let mut first = true;
    tracing::info!(tags = ?tagger.tags, checksum = %tagger.checksum, "tagging controller started");
    loop {
        match wait(&stop, pending.next_due(), changes.next()).await {
            Wake::Stopped | Wake::Changed(None) => return,
            Wake::Due => {}
            Wake::Changed(Some(batch)) => {
                pending.observe(&batch, &tagger.checksum, Instant::now());
                // Gather the rest of a burst before calling AWS.
                if sleep(&stop, GATHER).await == Wake::Stopped {
                    return;
                }
                while let Some(Some(more)) = changes.next().now_or_never() {
                    pending.observe(&more, &tagger.checksum, Instant::now());
                }
            }
        }
        let (to_tag, to_untag) = pending.due(Instant::now());
        let (waiting, due) = pending.keys(Instant::now());
        waiting.iter().for_each(|k| queue.due(k));
        queue.keep_only(&waiting);
        let work: Vec<_> = due.iter().map(|k| queue.take(k)).collect();
        tagger.pass(&mut pending).await;
        drop(work);
        let (still, _) = pending.keys(Instant::now());
        due.iter()
            .filter(|k| still.contains(k.as_str()))
            .for_each(|_| queue.retry());
        if first || !to_tag.is_empty() || !to_untag.is_empty() {
            tracing::info!(
                nodes = ctx.nodes.len(),
                tagged = to_tag.len(),
                untagged = to_untag.len(),
                initial = first,
                "tagging pass"
            );
            first = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::NodeSpec;
    use crate::provider::instances::fake::{FakeInstances, instance};
    use kube::api::ObjectMeta;
    use std::sync::Arc;

    fn tags() -> Vec<(String, String)> {
        vec![
            ("team".to_string(), "infra".to_string()),
            ("env".to_string(), "prod".to_string()),
        ]
    }

    #[test]
    fn the_checksum_is_upstreams() {
        // md5("env=prod,team=infra"), as the Go controller computes it.
        assert_eq!(tags_checksum(&tags()), "989e2561173a4631deab2764f8360f16");
        let mut reversed = tags();
        reversed.reverse();
        assert_eq!(tags_checksum(&reversed), tags_checksum(&tags()));
    }

    fn node(name: &str, uid: &str, provider_id: Option<&str>, label: Option<&str>) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                labels: label.map(|v| BTreeMap::from([(TAGGED_LABEL.to_string(), v.to_string())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn applied(nodes: Vec<Arc<Node>>) -> Changes {
        Changes {
            applied: nodes,
            deleted: vec![],
        }
    }

    #[test]
    fn only_nodes_with_a_provider_id_and_a_stale_label_are_tagged() {
        let sum = tags_checksum(&tags());
        let now = Instant::now();
        let mut p = Pending::new("us-east-1");
        p.observe(
            &applied(vec![
                node("new", "1", Some("aws:///us-east-1a/i-1"), None),
                node("done", "2", Some("aws:///us-east-1a/i-2"), Some(&sum)),
                node("old-tags", "3", Some("aws:///us-east-1a/i-3"), Some("0ld")),
                node("uninitialized", "4", None, None),
                node("fargate", "5", Some("aws:///us-east-1a/fargate-ip-1"), None),
                node("eu", "6", Some("aws:///eu-west-1a/i-6"), None),
                node("local-zone", "7", Some("aws:///us-east-1-bos-1a/i-7"), None),
            ]),
            &sum,
            now,
        );
        let (tag, untag) = p.due(now);
        let mut got: Vec<(&str, &str, bool)> = tag
            .iter()
            .map(|i| (i.node.as_str(), i.instance.as_str(), i.initial))
            .collect();
        got.sort();
        // Another Region's Node is not tagged; a Local Zone is this Region.
        assert_eq!(
            got,
            [
                ("local-zone", "i-7", true),
                ("new", "i-1", true),
                ("old-tags", "i-3", false)
            ]
        );
        assert!(untag.is_empty());
        // Nor untagged when deleted, labelled or not.
        let eu = node("eu", "6", Some("aws:///eu-west-1a/i-6"), Some(&sum));
        p.observe(
            &Changes {
                applied: vec![],
                deleted: vec![eu],
            },
            &sum,
            now,
        );
        assert!(p.due(now).1.is_empty());
    }

    #[test]
    fn deleted_nodes_are_untagged_unless_never_tagged_or_still_in_use() {
        let sum = tags_checksum(&tags());
        let now = Instant::now();
        let mut p = Pending::new("us-east-1");
        let tagged = node("a", "1", Some("aws:///us-east-1a/i-1"), Some(&sum));
        let never = node("b", "2", Some("aws:///us-east-1a/i-2"), None);
        let moved = node("c", "3", Some("aws:///us-east-1a/i-3"), Some(&sum));
        let successor = node("c2", "4", Some("aws:///us-east-1a/i-3"), Some(&sum));
        p.observe(
            &applied(vec![
                tagged.clone(),
                never.clone(),
                moved.clone(),
                successor,
            ]),
            &sum,
            now,
        );
        p.observe(
            &Changes {
                applied: vec![],
                deleted: vec![tagged, never, moved],
            },
            &sum,
            now,
        );
        let (tag, untag) = p.due(now);
        assert!(tag.is_empty(), "{tag:?}");
        assert_eq!(untag, ["i-1"]);
    }

    #[test]
    fn not_found_instances_are_retried_with_backoff_then_skipped() {
        let sum = tags_checksum(&tags());
        let mut now = Instant::now();
        let mut p = Pending::new("us-east-1");
        let n = node("n", "1", Some("aws:///us-east-1a/i-9"), None);
        p.observe(&applied(vec![n.clone()]), &sum, now);
        for attempt in 1..=NOT_FOUND_ATTEMPTS {
            assert_eq!(p.due(now).0.len(), 1, "attempt {attempt} is due");
            let skipped = p.tag_failed("n", Some("1".into()), true, now);
            assert_eq!(skipped, attempt == NOT_FOUND_ATTEMPTS);
            assert!(p.due(now).0.is_empty(), "backing off");
            now += RETRY.cap;
        }
        // Skipped: a new version of the same node does not bring it back...
        p.observe(&applied(vec![n]), &sum, now);
        assert!(p.due(now).0.is_empty());
        // ...a replacement node does.
        p.observe(
            &applied(vec![node("n", "2", Some("aws:///us-east-1a/i-9"), None)]),
            &sum,
            now,
        );
        assert_eq!(p.due(now).0.len(), 1);
    }

    #[tokio::test]
    async fn batches_split_around_instances_iam_denies() {
        // AWS refuses the whole call when IAM denies one of its instances.
        let denied_id = "i-3";
        let ids: Vec<String> = (0..8).map(|i| format!("i-{i}")).collect();
        let mut calls = 0;
        let results = in_batches(&ids, |batch| {
            calls += 1;
            async move {
                if batch.iter().any(|id| id == denied_id) {
                    Err(CloudError::new(
                        "ec2:CreateTags",
                        crate::provider::ErrorKind::Denied,
                        "UnauthorizedOperation: not authorized to perform ec2:CreateTags",
                    ))
                } else {
                    Ok(())
                }
            }
        })
        .await;
        assert!(
            results[denied_id]
                .as_ref()
                .is_err_and(CloudError::is_denied)
        );
        assert!(
            ids.iter()
                .filter(|id| *id != denied_id)
                .all(|id| results[id].is_ok())
        );
        assert_eq!(calls, 7, "8 -> 4 + 4 -> 2 + 2 -> 1 + 1");
    }

    #[tokio::test]
    async fn batches_split_around_unknown_instances() {
        let cloud = FakeInstances::new();
        let ids: Vec<String> = (0..8).map(|i| format!("i-{i}")).collect();
        for (n, id) in ids.iter().enumerate() {
            if n != 5 {
                cloud.add(instance(id, &format!("10.0.0.{n}")));
            }
        }
        let results = in_batches(&ids, |batch| {
            let cloud = cloud.clone();
            async move { cloud.create_tags(&batch, &tags()).await }
        })
        .await;
        assert_eq!(results.len(), 8);
        assert!(results["i-5"].as_ref().is_err_and(CloudError::is_not_found));
        assert!(
            ids.iter()
                .filter(|id| *id != "i-5")
                .all(|id| results[id].is_ok())
        );
        assert_eq!(
            cloud.tags_of("i-0").get("team").map(String::as_str),
            Some("infra")
        );
        // 1 failed call of 8, then halves: 4 + 4(fails) -> 2 + 2(fails) -> 1 + 1(fails).
        assert_eq!(cloud.calls().create_tags.len(), 7);

        // One call when every instance exists, up to EC2's limit per call.
        let cloud = FakeInstances::new();
        let many: Vec<String> = (0..1500).map(|i| format!("i-{i}")).collect();
        for id in &many {
            cloud.add(instance(id, "10.0.0.1"));
        }
        let results = in_batches(&many, |batch| {
            let cloud = cloud.clone();
            async move { cloud.create_tags(&batch, &tags()).await }
        })
        .await;
        assert!(results.values().all(Result::is_ok));
        let calls = cloud.calls().create_tags;
        assert_eq!(calls.iter().map(Vec::len).collect::<Vec<_>>(), [500, 1000]);
    }
}

#[cfg(test)]
mod metric_tests {
    #[test]
    fn work_item_errors_use_upstreams_name_and_labels() {
        super::record_work_item_error("total_errors", "i-0123");
        let text = crate::metrics::encode();
        let line = "cloudprovider_aws_tagging_controller_work_item_errors_total{error_type=\"total_errors\",instance_id=\"i-0123\"} 1";
        assert!(text.contains(line), "{line} in {text}");
    }
}
