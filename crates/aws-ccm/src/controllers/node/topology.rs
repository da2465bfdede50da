//! The `topology.k8s.aws/network-node-layer-N` labels, added after
//! initialization and off the workers' path.
//!
//! Upstream asks for an instance's network nodes while it initializes the
//! node, and keeps a node of a type expected to have a topology tainted
//! until AWS answers. Here the question never holds a taint: a node is
//! initialized as soon as `DescribeInstances` has answered, and then put in
//! the [`Labeller`]'s queue, one key per node, whose work ([`run`]) asks
//! the questions and writes the labels that come back.
//!
//! **Batched by what is waiting, not by a window.** AWS throttles
//! `DescribeInstanceTopology` hard, so a join must cost about one call per
//! [`MAX_TOPOLOGY_IDS`] nodes whatever the machine's speed. The queue runs
//! behind the cloud-node controller's ([`Workers::behind`]): it takes keys
//! once that queue has nothing due and nothing in progress, one batch of
//! up to [`MAX_TOPOLOGY_IDS`] in flight at a time, the next taking every
//! question that queued meanwhile, until every due one is asked: the nodes
//! of a join gather while the join lasts, however long it lasts, and the
//! labels follow its last initialization without taking the API budget
//! the join's own writes need. A window of
//! time (it once was one second) counted the machine's speed instead: a
//! slower join spread over more windows, and 122 joining nodes cost 43
//! calls where 2 do. [`MAX_GATHER`] only bounds how late labels come behind
//! a controller that never rests.
//!
//! A failed question (AWS down, throttled past its deadline, an API that
//! hangs) is the work's [`Outcome::Retry`]: the queue asks it again after
//! its backoff ([`RETRY`]), in a later batch of this queue. A retry never
//! occupies a worker of the cloud-node controller, so nodes that join
//! meanwhile are initialized at full speed. (It once did: with the API
//! failing, 100 joining nodes waited minutes behind the retries of nodes
//! already initialized.)
//!
//! A node that already has layer 1 keeps its labels and costs no call, as
//! upstream. Which instances are asked, and what is remembered, is the
//! cloud's business (see `aws::instances::topology`). An initialized node
//! without layer 1 whose `node.kubernetes.io/instance-type` is expected to
//! have a topology (cloud.conf `SupportedTopologyInstanceTypePattern`) is
//! queued too, so the labels also come after a restart; the cloud
//! remembers empty answers for a day, so this costs at most one question
//! per node per day.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use kube::ResourceExt;
use parking_lot::Mutex;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Shared, plan};
use crate::controllers::cached_node::Node;
use crate::controllers::schedule::keyed::{Class, Keyed, Outcome, Taken, Workers};
use crate::ids::{is_instance_id, node_instance_id};
use crate::provider::instances::{Instances, MAX_TOPOLOGY_IDS};

/// The wait after a failed question: 5 s, doubled per failure, to 5 min.
const RETRY: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
/// The longest the due questions wait for the cloud-node controller to
/// rest: a bound on how late the labels come, not a batching window (a
/// join that rests sooner is asked sooner).
const MAX_GATHER: Duration = Duration::from_secs(60);

/// What to ask about a node: its instance ID and instance type.
type Question = (String, Option<String>);

/// Nodes waiting for their network-node labels: the queue of their names,
/// and what to ask for each.
pub(super) struct Labeller {
    queue: Keyed,
    questions: Mutex<HashMap<String, Question>>,
}

impl Labeller {
    pub(super) fn new() -> Labeller {
        Labeller {
            // No Go queue to name it after: upstream asks inline, while
            // the taint holds the node.
            queue: Keyed::new("network-node-labels", RETRY),
            questions: Mutex::default(),
        }
    }

    /// Queues `node`'s question unless it is queued already, which keeps
    /// its place (and its backoff, after a failure).
    pub(super) fn ask(
        &self,
        node: &str,
        instance_id: &str,
        instance_type: Option<&str>,
        class: Class,
    ) {
        let mut questions = self.questions.lock();
        if questions.contains_key(node) {
            return;
        }
        let question = (instance_id.to_string(), instance_type.map(str::to_string));
        questions.insert(node.to_string(), question);
        drop(questions);
        self.queue.add(node, class);
    }

    pub(super) fn forget(&self, node: &str) {
        self.questions.lock().remove(node);
        self.queue.forget(node);
    }

    fn contains(&self, node: &str) -> bool {
        self.questions.lock().contains_key(node)
    }

    fn question(&self, node: &str) -> Option<Question> {
        self.questions.lock().get(node).cloned()
    }

    /// `node` is labelled: a later ask is a new question.
    fn answered(&self, node: &str) {
        self.questions.lock().remove(node);
    }
}

fn instance_type_label(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(plan::LABEL_INSTANCE_TYPE))
        .map(String::as_str)
}

/// For an initialized node the controller sees (start-up, a change):
/// queues it when it lacks layer 1, is not queued, and its instance type
/// is expected to have a topology.
pub(super) fn queue_initialized<I: Instances>(node: &Node, shared: &Shared<I>) {
    if plan::is_uninitialized(node) || !plan::wants_network_nodes(node) {
        return;
    }
    let name = node.name_any();
    let instance_type = instance_type_label(node);
    if shared.topology.contains(&name)
        || !instance_type.is_some_and(|t| shared.cloud.expects_topology(t))
    {
        return;
    }
    // Another Region's instance: that Region's CCM asks about it.
    if crate::ids::node_outside_region(node, &shared.region).is_some() {
        return;
    }
    let id = node_instance_id(node).ok().flatten();
    if let Some(id) = id.filter(|id| is_instance_id(id)) {
        (shared.topology).ask(&name, &id, instance_type, Class::Background);
    }
}

/// Asks the due questions, a batch of [`MAX_TOPOLOGY_IDS`] at a time (the
/// cloud sends each batch's questions as one call), behind the cloud-node
/// controller's queue `nodes`, until `stop`.
pub(super) async fn run<I: Instances>(
    shared: Arc<Shared<I>>,
    nodes: Keyed,
    stop: CancellationToken,
) {
    let queue = shared.topology.queue.clone();
    let workers = Workers::batches(MAX_TOPOLOGY_IDS).behind(&nodes, MAX_GATHER);
    queue
        .run(&stop, workers, move |batch: Vec<Taken>| {
            let shared = shared.clone();
            async move { futures::future::join_all(batch.iter().map(|t| label(&shared, t))).await }
        })
        .await
}

/// One node: the question, then the labels.
async fn label<I: Instances>(shared: &Shared<I>, taken: &Taken) -> Outcome {
    let name = &taken.key;
    // Forgotten meanwhile (the node is gone): nothing to ask.
    let Some((id, instance_type)) = shared.topology.question(name) else {
        return Outcome::Done;
    };
    let failures = taken.failures + 1;
    let nodes = match (shared.cloud)
        .network_nodes(&id, instance_type.as_deref())
        .await
    {
        Ok(nodes) => nodes.unwrap_or_default(),
        Err(err) => {
            tracing::warn!(node = %name, instance = %id, error = %err, failures, "reading the instance's network topology failed; the topology.k8s.aws/network-node-layer-N labels are added once AWS answers");
            return Outcome::Retry;
        }
    };
    match write_labels(shared, name, &id, &nodes).await {
        Ok(()) => {
            shared.topology.answered(name);
            Outcome::Done
        }
        Err(err) => {
            tracing::warn!(node = %name, error = %err, failures, "writing the network-node labels failed; retrying");
            Outcome::Retry
        }
    }
}

/// Writes the labels `nodes` give, on the node as the API server has it
/// now (the shared cache may not show our initializing write yet), guarded
/// by its resourceVersion.
async fn write_labels<I: Instances>(
    shared: &Shared<I>,
    name: &str,
    id: &str,
    nodes: &[String],
) -> Result<(), kube::Error> {
    if nodes.is_empty() {
        return Ok(());
    }
    let api = shared.api();
    let Some(node) = api.get_opt(name).await? else {
        return Ok(());
    };
    let labels = plan::network_node_labels(&node, nodes);
    if labels.is_empty() {
        return Ok(());
    }
    tracing::info!(node = %name, instance = %id, ?labels, "adding network-node labels");
    let patch = json!({"metadata": {
        "resourceVersion": node.resource_version(),
        "labels": labels,
    }});
    match crate::controllers::merge_patch(&api, name, patch).await {
        // Gone meanwhile: nothing to label.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn idle(labeller: &Labeller) -> bool {
        labeller.queue.idle().now_or_never().is_some()
    }

    /// A queued question keeps its place (and, after a failure, its
    /// backoff): asking again neither replaces nor re-adds it; a forgotten
    /// node leaves the queue, and an answered one may be asked anew.
    #[tokio::test(start_paused = true)]
    async fn a_question_is_queued_once_and_forgetting_it_leaves_the_queue() {
        let labeller = Labeller::new();
        assert!(idle(&labeller));
        labeller.ask("n", "i-1", Some("p4d.24xlarge"), Class::UserWaits);
        assert!(!idle(&labeller), "due at once");
        labeller.ask("n", "i-2", None, Class::Background);
        assert_eq!(
            labeller.question("n"),
            Some(("i-1".to_string(), Some("p4d.24xlarge".to_string())))
        );
        labeller.forget("n");
        assert!(!labeller.contains("n"));
        assert!(idle(&labeller), "nothing due once forgotten");
        labeller.ask("m", "i-3", None, Class::Background);
        labeller.answered("m");
        assert!(!labeller.contains("m"));
        labeller.ask("m", "i-4", None, Class::Background);
        assert_eq!(labeller.question("m"), Some(("i-4".to_string(), None)));
    }
}
