//! The `topology.k8s.aws/network-node-layer-N` labels, added after
//! initialization and off the workers' path.
//!
//! Upstream asks for an instance's network nodes while it initializes the
//! node, and keeps a node of a type expected to have a topology tainted
//! until AWS answers. Here the question never holds a taint: a node is
//! initialized as soon as `DescribeInstances` has answered, and then put in
//! this [`Queue`]. One task ([`run`]) asks the questions and writes the
//! labels that come back.
//!
//! **Batched by what is waiting, not by a window.** AWS throttles
//! `DescribeInstanceTopology` hard, so a join must cost about one call per
//! [`MAX_TOPOLOGY_IDS`] nodes whatever the machine's speed. The task asks
//! once the cloud-node controller has nothing due and nothing in progress
//! (its queue is [`idle`]), one call's worth at a time, until every due
//! question is asked: the nodes of a join gather while the join lasts,
//! however long it lasts, and the labels follow its last initialization
//! without taking the API budget the join's own writes need. A window of
//! time (it once was one second) counted the machine's speed instead: a
//! slower join spread over more windows, and 122 joining nodes cost 43
//! calls where 2 do. [`MAX_GATHER`] only bounds how late labels come behind
//! a controller that never rests.
//!
//! A failed question (AWS down, throttled past its deadline, an API that
//! hangs) is asked again with backoff ([`RETRY`]) from the same task: a
//! retry never occupies a worker of the cloud-node controller, so nodes
//! that join meanwhile are initialized at full speed. (It once did: with
//! the API failing, 100 joining nodes waited minutes behind the retries of
//! nodes already initialized.)
//!
//! A node that already has layer 1 keeps its labels and costs no call, as
//! upstream. Which instances are asked, and what is remembered, is the
//! cloud's business (see `aws::instances::topology`). An initialized node
//! without layer 1 whose `node.kubernetes.io/instance-type` is expected to
//! have a topology (cloud.conf `SupportedTopologyInstanceTypePattern`) is
//! queued too, so the labels also come after a restart; the cloud
//! remembers empty answers for a day, so this costs at most one question
//! per node per day.
//!
//! [`idle`]: crate::controllers::schedule::workqueue::Queue::idle

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use kube::ResourceExt;
use parking_lot::Mutex;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Shared, plan};
use crate::controllers::cached_node::Node;
use crate::controllers::schedule::workqueue;
use crate::controllers::schedule::{Wake, wait};
use crate::ids::{is_instance_id, node_instance_id};
use crate::provider::instances::{Instances, MAX_TOPOLOGY_IDS};

/// The wait after a failed question: 5 s, doubled per failure, to 5 min.
const RETRY: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
/// The longest the due questions wait for the cloud-node controller to
/// rest: a bound on how late the labels come, not a batching window (a
/// join that rests sooner is asked sooner).
const MAX_GATHER: Duration = Duration::from_secs(60);

/// One queued node: which instance to ask about, failures so far, and
/// when it is due (`None` while its question is in flight).
struct Entry {
    instance_id: String,
    instance_type: Option<String>,
    attempts: u32,
    due: Option<Instant>,
}

/// A due question: node name, instance ID, instance type.
type Question = (String, String, Option<String>);

/// Nodes waiting for their network-node labels.
#[derive(Default)]
pub(super) struct Queue {
    nodes: Mutex<HashMap<String, Entry>>,
    wake: Notify,
}

impl Queue {
    /// Queues `node` (due now) unless it is queued already, which keeps
    /// its backoff.
    pub(super) fn ask(&self, node: &str, instance_id: &str, instance_type: Option<&str>) {
        let mut nodes = self.nodes.lock();
        if nodes.contains_key(node) {
            return;
        }
        nodes.insert(
            node.to_string(),
            Entry {
                instance_id: instance_id.to_string(),
                instance_type: instance_type.map(str::to_string),
                attempts: 0,
                due: Some(Instant::now()),
            },
        );
        drop(nodes);
        self.wake.notify_one();
    }

    pub(super) fn forget(&self, node: &str) {
        self.nodes.lock().remove(node);
    }

    fn contains(&self, node: &str) -> bool {
        self.nodes.lock().contains_key(node)
    }

    /// Records a failure; the wait before the next question.
    fn failed(&self, node: &str) -> Duration {
        let mut nodes = self.nodes.lock();
        let Some(entry) = nodes.get_mut(node) else {
            return Duration::ZERO;
        };
        entry.attempts += 1;
        let delay = RETRY.after(entry.attempts);
        entry.due = Some(Instant::now() + delay);
        delay
    }

    /// How many questions are due at `now`, and when the next one not yet
    /// due is.
    fn due(&self, now: Instant) -> (usize, Option<Instant>) {
        let mut count = 0;
        let mut next: Option<Instant> = None;
        for entry in self.nodes.lock().values() {
            match entry.due {
                Some(at) if at <= now => count += 1,
                Some(at) => next = Some(next.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        (count, next)
    }

    /// Up to `max` of the questions due at `now`, marked in flight.
    fn take_due(&self, now: Instant, max: usize) -> Vec<Question> {
        let mut nodes = self.nodes.lock();
        let due = nodes
            .iter_mut()
            .filter(|(_, e)| e.due.is_some_and(|at| at <= now));
        due.take(max)
            .map(|(name, entry)| {
                entry.due = None;
                let (id, ty) = (entry.instance_id.clone(), entry.instance_type.clone());
                (name.clone(), id, ty)
            })
            .collect()
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
        shared.topology.ask(&name, &id, instance_type);
    }
}

/// Asks the due questions, one call's worth at a time, once the cloud-node
/// controller (`nodes`, its queue) rests, until `stop`.
pub(super) async fn run<I: Instances>(
    shared: Arc<Shared<I>>,
    nodes: workqueue::Queue,
    stop: CancellationToken,
) {
    let topology = &shared.topology;
    loop {
        let (due, next) = topology.due(Instant::now());
        if due == 0 {
            if wait(&stop, next, topology.wake.notified()).await == Wake::Stopped {
                return;
            }
            continue;
        }
        let until = Instant::now() + MAX_GATHER;
        if wait(&stop, Some(until), nodes.idle()).await == Wake::Stopped {
            return;
        }
        let round = topology.take_due(Instant::now(), MAX_TOPOLOGY_IDS);
        let asked = futures::future::join_all(round.into_iter().map(|q| label(&shared, q)));
        if wait(&stop, None, asked).await == Wake::Stopped {
            return;
        }
    }
}

/// One node: the question, then the labels; on failure, again later.
async fn label<I: Instances>(shared: &Shared<I>, (name, id, instance_type): Question) {
    let nodes = match (shared.cloud)
        .network_nodes(&id, instance_type.as_deref())
        .await
    {
        Ok(nodes) => nodes.unwrap_or_default(),
        Err(err) => {
            let delay = shared.topology.failed(&name);
            tracing::warn!(node = %name, instance = %id, error = %err, retry_in = ?delay, "reading the instance's network topology failed; the topology.k8s.aws/network-node-layer-N labels are added once AWS answers");
            return;
        }
    };
    match write_labels(shared, &name, &id, &nodes).await {
        Ok(()) => shared.topology.forget(&name),
        Err(err) => {
            let delay = shared.topology.failed(&name);
            tracing::warn!(node = %name, error = %err, retry_in = ?delay, "writing the network-node labels failed; retrying");
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

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_doubling_up_to_the_cap_and_are_forgotten() {
        let q = Queue::default();
        q.ask("n", "i-1", Some("p4d.24xlarge"));
        assert_eq!(q.due(Instant::now()), (1, None));
        let due = q.take_due(Instant::now(), MAX_TOPOLOGY_IDS);
        assert_eq!(due.len(), 1);
        assert_eq!(q.due(Instant::now()), (0, None), "in flight: not due again");
        assert!(q.take_due(Instant::now(), MAX_TOPOLOGY_IDS).is_empty());
        assert_eq!(q.failed("n"), RETRY.first);
        assert_eq!(q.failed("n"), RETRY.first * 2);
        assert_eq!(q.failed("n"), RETRY.first * 4);
        for _ in 0..40 {
            q.failed("n");
        }
        assert_eq!(q.failed("n"), RETRY.cap);
        let next = Some(Instant::now() + RETRY.cap);
        assert_eq!(q.due(Instant::now()), (0, next), "waiting out its backoff");
        assert!(q.take_due(Instant::now(), MAX_TOPOLOGY_IDS).is_empty());
        // Asking again keeps the backoff.
        q.ask("n", "i-1", Some("p4d.24xlarge"));
        assert!(q.take_due(Instant::now(), MAX_TOPOLOGY_IDS).is_empty());
        tokio::time::advance(RETRY.cap).await;
        let due = q.take_due(Instant::now(), MAX_TOPOLOGY_IDS);
        assert_eq!(
            due,
            vec![("n".into(), "i-1".into(), Some("p4d.24xlarge".into()))]
        );
        q.forget("n");
        assert!(!q.contains("n"));
        assert_eq!(
            q.failed("n"),
            Duration::ZERO,
            "a forgotten node is not requeued"
        );
        assert!(!q.contains("n"));
    }
}
