// On the keyed scheduler (schedule/keyed.rs), not kube-runtime's Controller: nodes due at once share one batched CreateTags/DeleteTags (split in halves on unknown instances), and deletions need the last seen providerID, not one reconcile per object.
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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use md5::{Digest, Md5};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::ControllerContext;
use super::node::changes::{Changes, node_changes};
use super::node::identity;
use super::schedule::keyed::{Class, Keyed, Outcome, Taken, Workers};
use crate::backoff::Backoff;
use crate::provider::Cloud;
use crate::provider::instances::{Instances, MAX_TAG_RESOURCES};
use crate::provider::{CloudError, CloudResult};

/// Upstream's label recording which tag set a node's instance carries.
pub(crate) const TAGGED_LABEL: &str = "k8s.io/cloud-provider-aws";
/// Failures in a row of a node whose instance is not found (EC2 may not
/// list a brand-new instance yet) before it is skipped.
const NOT_FOUND_ATTEMPTS: u32 = 5;
/// Failures in a row of any other kind before a key is given up.
const MAX_ATTEMPTS: u32 = 10;
/// The queue's backoff between those failures.
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
pub(crate) fn needs_tagging(node: &Node, checksum: &str, region: &str) -> Option<String> {
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

/// A key of the controller's queue: a Node to tag, or the instance of a
/// deleted Node to untag. Spelled with a prefix, as a Node may be named
/// after its instance.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Tag(String),
    Untag(String),
}

impl Key {
    fn spelled(&self) -> String {
        match self {
            Key::Tag(node) => format!("tag/{node}"),
            Key::Untag(instance) => format!("untag/{instance}"),
        }
    }

    fn parse(key: &str) -> Option<Key> {
        match key.split_once('/')? {
            ("tag", node) => Some(Key::Tag(node.to_string())),
            ("untag", instance) => Some(Key::Untag(instance.to_string())),
            _ => None,
        }
    }
}

/// What a Node change makes of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Trigger {
    /// Due now.
    Add(Key),
    /// Moot: the Node is gone or needs no tags any more.
    Forget(Key),
}

/// A node to tag now.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TagItem {
    node: String,
    instance: String,
    /// The node had no tagging label at all (for the initial-delay metric).
    initial: bool,
    created_ms: Option<i64>,
}

/// What the controller remembers between works: which Node changes make
/// a key due, and what a failed work leaves. Pure; the queue holds when,
/// the I/O is in [`Tagger`].
struct Book {
    /// The CCM's Region: Nodes of another are not this controller's.
    region: String,
    checksum: String,
    /// Nodes skipped after their tagging kept failing, by (uid, instance):
    /// not retried until the node is replaced or its providerID changes.
    skipped: HashMap<String, (Option<String>, String)>,
    /// Nodes whose tagging failed and waits for the queue's retry, with the
    /// instance it tried: a change of the Node (a status update) does not
    /// hasten the retry, a new instance does.
    retrying: HashMap<String, String>,
    /// Instances this process tagged, so a node deleted before its label
    /// landed still gets untagged.
    tagged: HashSet<String>,
    /// Instances of the nodes that exist (by node name).
    live: HashMap<String, String>,
}

impl Book {
    pub(crate) fn new(region: &str, checksum: &str) -> Book {
        Book {
            region: region.to_string(),
            checksum: checksum.to_string(),
            skipped: HashMap::new(),
            retrying: HashMap::new(),
            tagged: HashSet::new(),
            live: HashMap::new(),
        }
    }

    /// Takes in what the informer saw; returns what it makes of the keys,
    /// in order.
    pub(crate) fn observe(&mut self, changes: &Changes) -> Vec<Trigger> {
        let mut out = Vec::new();
        for node in &changes.deleted {
            let name = node.name_any();
            self.skipped.remove(&name);
            self.retrying.remove(&name);
            self.live.remove(&name);
            out.push(Trigger::Forget(Key::Tag(name)));
        }
        for node in &changes.applied {
            let name = node.name_any();
            match identity::instance_id_of(node) {
                Some(id) => self.live.insert(name.clone(), id),
                None => self.live.remove(&name),
            };
            let Some(instance) = needs_tagging(node, &self.checksum, &self.region) else {
                self.retrying.remove(&name);
                out.push(Trigger::Forget(Key::Tag(name)));
                continue;
            };
            if self.skipped.get(&name) == Some(&(node.metadata.uid.clone(), instance.clone())) {
                continue;
            }
            self.skipped.remove(&name);
            if self.retrying.get(&name) == Some(&instance) {
                continue;
            }
            self.retrying.remove(&name);
            out.push(Trigger::Add(Key::Tag(name)));
        }
        for node in &changes.deleted {
            let Some(instance) = ours(node, &self.region) else {
                continue;
            };
            // Another node may stand on the same instance (re-registered
            // under a new name): its tags stay.
            let still_used = self.live.values().any(|id| id == &instance);
            if (carries_label(node) || self.tagged.contains(&instance)) && !still_used {
                out.push(Trigger::Add(Key::Untag(instance)));
            }
        }
        out
    }

    /// What to tag for `node` now, if it still needs it and is not skipped.
    pub(crate) fn item(&self, node: &Node) -> Option<TagItem> {
        let name = node.name_any();
        let instance = needs_tagging(node, &self.checksum, &self.region)?;
        if self.skipped.get(&name) == Some(&(node.metadata.uid.clone(), instance.clone())) {
            return None;
        }
        Some(TagItem {
            node: name,
            initial: !carries_label(node),
            created_ms: node
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_millisecond()),
            instance,
        })
    }

    /// Records a failed tag of `item`, its `failures`-th in a row; returns
    /// true when it is given up: skipped until the node changes.
    fn tag_failed(
        &mut self,
        item: &TagItem,
        uid: Option<String>,
        failures: u32,
        not_found: bool,
    ) -> bool {
        // EC2 may not list a brand-new instance yet; a few tries settle it.
        let limit = if not_found {
            NOT_FOUND_ATTEMPTS
        } else {
            MAX_ATTEMPTS
        };
        if failures >= limit {
            self.retrying.remove(&item.node);
            self.skipped
                .insert(item.node.clone(), (uid, item.instance.clone()));
            true
        } else {
            self.retrying
                .insert(item.node.clone(), item.instance.clone());
            false
        }
    }

    fn tag_done(&mut self, item: &TagItem) {
        self.tagged.insert(item.instance.clone());
        self.retrying.remove(&item.node);
    }

    fn untag_done(&mut self, instance: &str) {
        self.tagged.remove(instance);
    }
}

/// Applies a tag operation to `ids` in calls of at most 1,000 instances;
/// a call failing with not-found, or refused by IAM (which refuses the
/// whole call for one instance it denies, e.g. one tagged only with the
/// legacy `KubernetesCluster`), is split in halves until the unknown or
/// denied instances are isolated. Every ID gets its own outcome.
async fn in_batches<F, Fut>(ids: &[String], mut call: F) -> HashMap<String, CloudResult<()>>
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
    workers: usize,
    nodes: kube::runtime::reflector::Store<Node>,
    book: Mutex<Book>,
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

    /// One work of the queue: tags and untags every key of `batch` in
    /// shared calls; an outcome per key, in order.
    async fn work(&self, batch: Vec<Taken>) -> Vec<Outcome> {
        let mut outcomes = vec![Outcome::Done; batch.len()];
        let mut tag = Vec::new();
        let mut untag = Vec::new();
        for (i, taken) in batch.iter().enumerate() {
            match Key::parse(&taken.key) {
                Some(Key::Tag(name)) => {
                    let node = self.nodes.get(&ObjectRef::new(&name));
                    // Gone or labelled meanwhile: nothing to do.
                    let item = node.as_ref().and_then(|n| self.book.lock().item(n));
                    if let (Some(node), Some(item)) = (node, item) {
                        tag.push((i, item, node.metadata.uid.clone(), taken.failures));
                    }
                }
                Some(Key::Untag(instance)) => untag.push((i, instance, taken.failures)),
                None => {}
            }
        }
        let (tagged, untagged) = (tag.len(), untag.len());
        if !tag.is_empty() {
            self.tag(tag, &mut outcomes).await;
        }
        if !untag.is_empty() {
            self.untag(untag, &mut outcomes).await;
        }
        if tagged + untagged > 0 {
            tracing::info!(
                nodes = self.nodes.len(),
                tagged,
                untagged,
                initial = false,
                "tagging pass"
            );
        }
        outcomes
    }

    async fn tag(
        &self,
        items: Vec<(usize, TagItem, Option<String>, u32)>,
        outcomes: &mut [Outcome],
    ) {
        let ids: BTreeSet<String> = items.iter().map(|(_, i, ..)| i.instance.clone()).collect();
        let ids: Vec<String> = ids.into_iter().collect();
        let results = in_batches(&ids, |ids| async move {
            self.cloud.create_tags(&ids, &self.tags).await
        })
        .await;
        let mut labels = Vec::new();
        for (i, item, uid, failures) in items {
            match results.get(&item.instance) {
                Some(Ok(())) => labels.push((i, item)),
                Some(Err(err)) => {
                    if err.is_denied() {
                        self.warn_denied(&item, err).await;
                    }
                    let failures = failures.saturating_add(1);
                    let given_up =
                        (self.book.lock()).tag_failed(&item, uid, failures, err.is_not_found());
                    if given_up {
                        record_work_item_error("errors_after_retries_exhausted", &item.instance);
                        tracing::warn!(node = %item.node, instance = %item.instance, error = %err, failures, "skipping node until it changes: tagging its instance kept failing");
                    } else {
                        record_work_item_error("total_errors", &item.instance);
                        tracing::warn!(node = %item.node, instance = %item.instance, error = %err, failures, "tagging failed; retrying");
                        outcomes[i] = Outcome::Retry;
                    }
                }
                None => outcomes[i] = Outcome::Retry,
            }
        }
        let api: Api<Node> = Api::all(self.kube.clone());
        let checksum = self.book.lock().checksum.clone();
        let labelled: Vec<(usize, TagItem, Result<(), kube::Error>)> =
            futures::stream::iter(labels)
                .map(|(i, item)| {
                    let api = api.clone();
                    let patch = json!({"metadata": {"labels": {TAGGED_LABEL: checksum}}});
                    async move {
                        let result = super::merge_patch(&api, &item.node, patch)
                            .await
                            .map(|_| ());
                        (i, item, result)
                    }
                })
                .buffer_unordered(self.workers)
                .collect()
                .await;
        for (i, item, result) in labelled {
            // Tagged either way: a deletion from now on untags it.
            self.book.lock().tagged.insert(item.instance.clone());
            match result {
                Ok(()) => {
                    tracing::info!(node = %item.node, instance = %item.instance, tags = ?self.tags, "tagged the node's instance");
                    if item.initial
                        && let Some(created) = item.created_ms
                    {
                        INITIAL_TAGGING_DELAY.observe(super::node::seconds_since(created));
                    }
                    self.book.lock().tag_done(&item);
                }
                // Deleted meanwhile: the deletion untags.
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(err) => {
                    tracing::warn!(node = %item.node, error = %err, "labelling the node failed; retrying");
                    self.book
                        .lock()
                        .retrying
                        .insert(item.node.clone(), item.instance.clone());
                    outcomes[i] = Outcome::Retry;
                }
            }
        }
    }

    async fn untag(&self, instances: Vec<(usize, String, u32)>, outcomes: &mut [Outcome]) {
        let ids: Vec<String> = instances.iter().map(|(_, id, _)| id.clone()).collect();
        let results = in_batches(&ids, |ids| async move {
            self.cloud.delete_tags(&ids, &self.tags).await
        })
        .await;
        for (i, instance, failures) in instances {
            match results.get(&instance) {
                Some(Ok(())) => {
                    tracing::info!(%instance, tags = ?self.tags, "removed tags from the instance of a deleted node");
                    self.book.lock().untag_done(&instance);
                }
                // Gone already: nothing to untag.
                Some(Err(err)) if err.is_not_found() => self.book.lock().untag_done(&instance),
                Some(Err(err)) if failures.saturating_add(1) >= MAX_ATTEMPTS => {
                    tracing::error!(%instance, error = %err, "giving up removing tags from the instance of a deleted node");
                }
                Some(Err(err)) => {
                    tracing::warn!(%instance, error = %err, "removing tags failed; retrying");
                    outcomes[i] = Outcome::Retry;
                }
                None => outcomes[i] = Outcome::Retry,
            }
        }
    }
}

/// Runs the controller until `stop` is cancelled: the node feed's changes
/// make keys due ([`Book::observe`]), and the queue hands every due key to
/// one work at a time, up to EC2's 1,000 instances per call, so a burst
/// that arrives while a call is out shares the next one.
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    let tags = ctx.options.tags.clone();
    if tags.is_empty() {
        // Refused at start-up; kept as a guard.
        tracing::error!("the tagging controller needs --tags; it does nothing");
        stop.cancelled().await;
        return;
    }
    LazyLock::force(&INITIAL_TAGGING_DELAY);
    let checksum = tags_checksum(&tags);
    tracing::info!(tags = ?tags, checksum = %checksum, "tagging controller started");
    let tagger = Arc::new(Tagger {
        kube: ctx.kube.clone(),
        cloud: ctx.provider.clone(),
        tags,
        workers: ctx.options.options.concurrent_node_syncs.max(4) as usize,
        nodes: ctx.nodes.clone(),
        book: Mutex::new(Book::new(&ctx.region, &checksum)),
        events: super::events::Events::new(ctx.kube.clone(), "tagging-controller"),
        cluster_id: ctx.cluster_id.clone(),
    });
    // The Go controller's queue name, for `workqueue_*`.
    let queue = Keyed::new("tagging-controller", RETRY);
    let triggers = {
        let (tagger, queue) = (tagger.clone(), queue.clone());
        let mut changes = Box::pin(node_changes(ctx.nodes.clone(), &ctx.node_feed));
        async move {
            // The first diff is every Node there is: a fresh leader's.
            let mut class = Class::Adoption;
            while let Some(batch) = changes.next().await {
                let triggers = tagger.book.lock().observe(&batch);
                if class == Class::Adoption {
                    let due = triggers.iter().filter(|t| matches!(t, Trigger::Add(_)));
                    tracing::info!(
                        nodes = tagger.nodes.len(),
                        due = due.count(),
                        initial = true,
                        "tagging pass"
                    );
                }
                for trigger in triggers {
                    match trigger {
                        Trigger::Add(key) => queue.add(&key.spelled(), class),
                        Trigger::Forget(key) => queue.forget(&key.spelled()),
                    }
                }
                class = Class::UserWaits;
            }
        }
    };
    let work = queue.run(&stop, Workers::batches(MAX_TAG_RESOURCES), move |batch| {
        let tagger = tagger.clone();
        async move { tagger.work(batch).await }
    });
    let triggers = async {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = triggers => {}
        }
    };
    tokio::join!(work, triggers);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::NodeSpec;
    use crate::provider::instances::fake::{FakeInstances, instance};
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

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
        let mut b = Book::new("us-east-1", &sum);
        let triggers = b.observe(&applied(vec![
            node("new", "1", Some("aws:///us-east-1a/i-1"), None),
            node("done", "2", Some("aws:///us-east-1a/i-2"), Some(&sum)),
            node("old-tags", "3", Some("aws:///us-east-1a/i-3"), Some("0ld")),
            node("uninitialized", "4", None, None),
            node("fargate", "5", Some("aws:///us-east-1a/fargate-ip-1"), None),
            node("eu", "6", Some("aws:///eu-west-1a/i-6"), None),
            node("local-zone", "7", Some("aws:///us-east-1-bos-1a/i-7"), None),
        ]));
        let mut got = added(&triggers);
        got.sort();
        // Another Region's Node is not tagged; a Local Zone is this Region.
        assert_eq!(
            got,
            [
                Key::Tag("local-zone".into()),
                Key::Tag("new".into()),
                Key::Tag("old-tags".into())
            ]
        );
        let item = b.item(&node(
            "old-tags",
            "3",
            Some("aws:///us-east-1a/i-3"),
            Some("0ld"),
        ));
        assert_eq!(
            item.map(|i| (i.instance, i.initial)),
            Some(("i-3".to_string(), false))
        );
        // Labelled meanwhile: moot.
        assert_eq!(
            b.item(&node("new", "1", Some("aws:///us-east-1a/i-1"), Some(&sum))),
            None
        );
        // Nor untagged when deleted, labelled or not.
        let eu = node("eu", "6", Some("aws:///eu-west-1a/i-6"), Some(&sum));
        let triggers = b.observe(&Changes {
            applied: vec![],
            deleted: vec![eu],
        });
        assert_eq!(triggers, [Trigger::Forget(Key::Tag("eu".into()))]);
    }

    fn added(triggers: &[Trigger]) -> Vec<Key> {
        let adds = triggers.iter().filter_map(|t| match t {
            Trigger::Add(k) => Some(k.clone()),
            Trigger::Forget(_) => None,
        });
        adds.collect()
    }

    #[test]
    fn keys_are_spelled_apart_for_a_node_named_after_its_instance() {
        for key in [Key::Tag("i-1".into()), Key::Untag("i-1".into())] {
            assert_eq!(Key::parse(&key.spelled()), Some(key));
        }
        assert_ne!(
            Key::Tag("i-1".into()).spelled(),
            Key::Untag("i-1".into()).spelled()
        );
    }

    #[test]
    fn deleted_nodes_are_untagged_unless_never_tagged_or_still_in_use() {
        let sum = tags_checksum(&tags());
        let mut b = Book::new("us-east-1", &sum);
        let tagged = node("a", "1", Some("aws:///us-east-1a/i-1"), Some(&sum));
        let never = node("b", "2", Some("aws:///us-east-1a/i-2"), None);
        let moved = node("c", "3", Some("aws:///us-east-1a/i-3"), Some(&sum));
        let successor = node("c2", "4", Some("aws:///us-east-1a/i-3"), Some(&sum));
        b.observe(&applied(vec![
            tagged.clone(),
            never.clone(),
            moved.clone(),
            successor,
        ]));
        let triggers = b.observe(&Changes {
            applied: vec![],
            deleted: vec![tagged, never, moved],
        });
        assert_eq!(added(&triggers), [Key::Untag("i-1".into())]);
        // A deleted node's tag key is moot.
        assert!(triggers.contains(&Trigger::Forget(Key::Tag("b".into()))));
    }

    #[test]
    fn failed_nodes_are_retried_by_the_queue_a_few_times_then_skipped() {
        let sum = tags_checksum(&tags());
        let mut b = Book::new("us-east-1", &sum);
        let n = node("n", "1", Some("aws:///us-east-1a/i-9"), None);
        assert_eq!(
            added(&b.observe(&applied(vec![n.clone()]))),
            [Key::Tag("n".into())]
        );
        let item = b.item(&n).expect("needs tags");
        for failures in 1..=NOT_FOUND_ATTEMPTS {
            let skipped = b.tag_failed(&item, Some("1".into()), failures, true);
            assert_eq!(skipped, failures == NOT_FOUND_ATTEMPTS);
            if !skipped {
                // Its retry is the queue's: a status update of the node
                // does not make it due sooner.
                assert!(added(&b.observe(&applied(vec![n.clone()]))).is_empty());
            }
        }
        // Skipped: a new version of the same node does not bring it back...
        assert!(added(&b.observe(&applied(vec![n.clone()]))).is_empty());
        assert_eq!(b.item(&n), None);
        // ...a replacement node does.
        let replaced = node("n", "2", Some("aws:///us-east-1a/i-9"), None);
        assert_eq!(
            added(&b.observe(&applied(vec![replaced]))),
            [Key::Tag("n".into())]
        );

        // Other failures are given up later.
        let other = node("o", "3", Some("aws:///us-east-1a/i-8"), None);
        let item = b.item(&other).expect("needs tags");
        assert!(!b.tag_failed(&item, None, MAX_ATTEMPTS - 1, false));
        // A new instance is due at once, whatever the backoff of the old one.
        let moved = node("o", "3", Some("aws:///us-east-1a/i-7"), None);
        assert_eq!(
            added(&b.observe(&applied(vec![moved]))),
            [Key::Tag("o".into())]
        );
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
