//! Finding nodes' instances with as few AWS calls as possible.
//!
//! * [`Prefetcher`]: lookups for uninitialized nodes start as soon as the
//!   node is seen, so a join burst becomes a handful of batched
//!   `DescribeInstances` calls whatever the number of workers
//!   (`--concurrent-node-syncs` bounds the writes to the API server, not the
//!   reads from AWS). When they are sent is a keyed queue's
//!   ([`crate::controllers::schedule::keyed`]) with one key, "lookups
//!   waiting": due once the first waiting lookup has waited the gathering
//!   time, and never worked twice at once, so lookups seen while a batch is
//!   in flight go together in the next one. Once a burst holds
//!   [`SWEEP_FROM`] lookups, its batches read the cached cluster sweep
//!   instead (1,000 instances per call, one read per sweep lifetime).
//!   A lookup by name that finds nothing goes on by the node's addresses
//!   ([`Search`], [`super::by_address`]) in the same batch, so those
//!   lookups are batched too.
//! * [`SweepIndex`]: the shared cluster sweep indexed by instance ID and
//!   private DNS name, for the periodic controllers.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::by_address;
use super::identity::Lookup;
use crate::backoff::Backoff;
use crate::controllers::cached_node::Node;
use crate::controllers::schedule::keyed::{Class, Keyed, Outcome, Workers};
use crate::provider::instances::{Found, Instance, InstanceState, Instances};
use crate::provider::{CloudError, CloudResult};

/// One lookup, straight to the cloud (coalesced there with concurrent ones).
pub(crate) async fn lookup<I: Instances>(cloud: &I, lookup: &Lookup) -> Found {
    match lookup {
        Lookup::ById(id) => cloud.instance_by_id(id).await,
        Lookup::ByPrivateDns(name) => cloud.instance_by_private_dns(name).await,
    }
}

/// What a node's instance is looked up by: its [`Lookup`], and for a
/// lookup by name the node's addresses, asked when the name finds no
/// instance ([`super::by_address`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Search {
    lookup: Lookup,
    pub(crate) addresses: Vec<Ipv4Addr>,
}

impl Search {
    /// `lookup` for `node`, with the node's addresses when it falls back.
    pub(crate) fn for_node(node: &Node, lookup: Lookup) -> Search {
        let addresses = match by_address::falls_back(&lookup) {
            true => by_address::node_addresses(node),
            false => Vec::new(),
        };
        Search { lookup, addresses }
    }
}

impl From<Lookup> for Search {
    fn from(lookup: Lookup) -> Search {
        Search {
            lookup,
            addresses: Vec::new(),
        }
    }
}

impl From<&Lookup> for Search {
    fn from(lookup: &Lookup) -> Search {
        lookup.clone().into()
    }
}

/// What a [`Search`] found: its lookup's answer and, when the lookup fell
/// back, every live instance having one of the addresses (`None`: not
/// asked, because the lookup found an instance, failed, or does not fall
/// back, or the node has no address).
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) found: Found,
    pub(crate) by_address: Option<CloudResult<Vec<Instance>>>,
}

/// One search, straight to the cloud: the lookup, then the addresses when
/// the lookup found nothing (all at once, coalesced there with other
/// nodes' lookups).
async fn search<I: Instances>(cloud: &I, search: &Search) -> Answer {
    let found = lookup(cloud, &search.lookup).await;
    fall_back(cloud, search, found).await
}

/// `search`'s address step, after its lookup answered `found`.
async fn fall_back<I: Instances>(cloud: &I, search: &Search, found: Found) -> Answer {
    let wanted = matches!(found, Ok(None))
        && by_address::falls_back(&search.lookup)
        && !search.addresses.is_empty();
    if !wanted {
        return Answer {
            found,
            by_address: None,
        };
    }
    Answer {
        found,
        by_address: Some(by_addresses(cloud, &search.addresses).await),
    }
}

/// Every live instance having one of `addresses` as its primary private
/// address, all asked at once (coalesced at the door with other lookups).
pub(crate) async fn by_addresses<I: Instances>(
    cloud: &I,
    addresses: &[Ipv4Addr],
) -> CloudResult<Vec<Instance>> {
    let asked = addresses
        .iter()
        .map(|ip| cloud.instances_by_private_ip(*ip));
    let answers = futures::future::join_all(asked).await;
    (answers.into_iter())
        .collect::<CloudResult<Vec<Vec<Instance>>>>()
        .map(|lists| lists.into_iter().flatten().collect())
}

/// A node's search, started: its answer, once its batch is sent.
struct Pending {
    search: Search,
    answer: oneshot::Receiver<Answer>,
}

#[derive(Default)]
struct State {
    pending: HashMap<String, Pending>,
    /// Lookups not sent yet, each with where its answer goes (closed when
    /// the node's lookup was cancelled or replaced: then it is not sent).
    waiting: Vec<(Search, oneshot::Sender<Answer>)>,
    /// The burst the last lookups belong to: when it began, and its count.
    burst: Option<(Instant, Arc<Burst>)>,
}

/// The one key of the prefetch queue.
const WAITING: &str = "lookups waiting";

/// Lookups in one burst at which its batches share the cluster sweep
/// instead of going by name: more than one batched name lookup's worth
/// (the client sends at most 200 names per call), while the sweep reads
/// 1,000 instances per call and the client keeps it for 30 s. A join burst
/// of N nodes thus costs about N / 1,000 calls, not N / 200, however its
/// nodes spread over the batches.
const SWEEP_FROM: usize = 200;

/// How long a burst counts its lookups in the tests: the default of the
/// client's sweep lifetime (`--aws-instance-sweep-ttl`).
#[cfg(test)]
const BURST_SPAN: Duration = Duration::from_secs(30);

/// Lookups started within one burst span, and the index of the sweep
/// they last shared (built once per sweep read, not once per batch).
#[derive(Default)]
struct Burst {
    lookups: AtomicUsize,
    index: Mutex<Option<Arc<SweepIndex>>>,
}

impl Burst {
    /// The index of `sweep`: the one already built when the client handed
    /// out the same sweep again.
    fn index(&self, sweep: &Arc<Vec<Instance>>) -> Arc<SweepIndex> {
        let mut index = self.index.lock();
        match &*index {
            Some(built) if Arc::ptr_eq(&built.sweep, sweep) => built.clone(),
            _ => index.insert(Arc::new(SweepIndex::new(sweep))).clone(),
        }
    }

    /// The sweep for a batch of this burst (`None` while the burst is
    /// small, or when the sweep failed: then each lookup goes on its own).
    async fn sweep<I: Instances>(&self, cloud: &I) -> Option<Arc<SweepIndex>> {
        if self.lookups.load(Ordering::Relaxed) < SWEEP_FROM {
            return None;
        }
        match cloud.cluster_instances().await {
            Ok(sweep) => Some(self.index(&sweep)),
            Err(err) => {
                tracing::debug!(error = %err, "cluster sweep failed: looking nodes up one by one");
                None
            }
        }
    }
}

/// Starts lookups early and hands each result to the node's reconcile.
/// Cheap to clone; [`Prefetcher::run`] sends the lookups.
pub(crate) struct Prefetcher<I: Instances> {
    inner: Arc<Inner<I>>,
}

impl<I: Instances> Clone for Prefetcher<I> {
    fn clone(&self) -> Self {
        Prefetcher {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<I> {
    cloud: I,
    burst_span: Duration,
    queue: Keyed,
    state: Mutex<State>,
}

impl<I: Instances> Prefetcher<I> {
    /// Lookups are sent once the first of them has waited `gather` (those
    /// that come meanwhile go along); a burst counts its lookups for
    /// `burst_span`, the sweep's lifetime (`--aws-instance-sweep-ttl`), so
    /// a burst's batches share one read.
    pub(crate) fn new(cloud: I, gather: Duration, burst_span: Duration) -> Prefetcher<I> {
        // The queue's settling rule with the cap equal to the quiet time:
        // due `gather` after the first add, whatever follows it. Its work
        // never fails (a failed lookup is its node's failure), so the
        // backoff is never used.
        let queue = Keyed::settling(
            "instance-prefetch",
            Backoff::new(gather, gather),
            (gather, gather),
        );
        Prefetcher {
            inner: Arc::new(Inner {
                cloud,
                burst_span,
                queue,
                state: Mutex::default(),
            }),
        }
    }

    /// Sends the waiting lookups, a batch at a time, until `stop`; a
    /// reconcile waiting for a lookup not sent by then looks it up itself.
    pub(crate) async fn run(&self, stop: &CancellationToken) {
        let this = self.clone();
        let work = move |_| {
            let this = this.clone();
            async move {
                this.send_waiting().await;
                vec![Outcome::Done]
            }
        };
        self.inner.queue.run(stop, Workers::each(1), work).await;
        self.inner.state.lock().waiting.clear();
    }

    /// Starts looking up `node`'s instance unless that search is already
    /// under way. Only the instance: nothing else is asked before the
    /// node's taint can come off.
    pub(crate) fn prefetch(&self, node: &str, key: impl Into<Search>) {
        let key = key.into();
        let mut st = self.inner.state.lock();
        if st.pending.get(node).is_some_and(|p| p.search == key) {
            return;
        }
        let now = Instant::now();
        let burst = match &st.burst {
            Some((since, b)) if now.duration_since(*since) < self.inner.burst_span => b.clone(),
            _ => st.burst.insert((now, Arc::default())).1.clone(),
        };
        burst.lookups.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        st.waiting.push((key.clone(), reply));
        // A lookup this replaces is not sent: its answer has no reader.
        (st.pending).insert(
            node.to_string(),
            Pending {
                search: key,
                answer,
            },
        );
        drop(st);
        self.inner.queue.add_settled(WAITING, Class::UserWaits);
    }

    /// The work of the queue's one key: every waiting lookup still wanted,
    /// from the burst's sweep when it is large, else one by one (the cloud
    /// batches concurrent lookups into one call).
    async fn send_waiting(&self) {
        let (waiting, burst) = {
            let mut st = self.inner.state.lock();
            let burst = st.burst.as_ref().map(|(_, b)| b.clone());
            (std::mem::take(&mut st.waiting), burst)
        };
        let waiting: Vec<_> = (waiting.into_iter())
            .filter(|(_, reply)| !reply.is_closed())
            .collect();
        if waiting.is_empty() {
            return;
        }
        let cloud = &self.inner.cloud;
        let sweep = match burst {
            Some(burst) => burst.sweep(cloud).await,
            None => None,
        };
        futures::future::join_all(waiting.into_iter().map(|(key, reply)| {
            let sweep = sweep.clone();
            async move {
                // An instance missing from the sweep (untagged, or launched
                // after it was read) is looked up directly.
                let swept = (sweep.as_ref()).and_then(|index| index.find(&key.lookup).cloned());
                let answer = match swept {
                    Some(found) => Answer {
                        found: Ok(Some(found)),
                        by_address: None,
                    },
                    None => search(cloud, &key).await,
                };
                let _ = reply.send(answer);
            }
        }))
        .await;
    }

    /// The instance for `node`: the prefetched answer when one was started
    /// for the same lookup (used once; a retry looks up afresh), otherwise
    /// a direct search. When the node's addresses changed since the
    /// prefetch, its lookup's answer is kept and only the addresses are
    /// asked again (if the lookup found nothing).
    pub(crate) async fn resolve(&self, node: &str, key: impl Into<Search>) -> Answer {
        let key = key.into();
        let pending = self.inner.state.lock().pending.remove(node);
        if let Some(p) = pending.filter(|p| p.search.lookup == key.lookup) {
            // Dropped unsent (the prefetcher stopped): looked up below.
            if let Ok(answer) = p.answer.await {
                if p.search.addresses == key.addresses {
                    return answer;
                }
                return fall_back(&self.inner.cloud, &key, answer.found).await;
            }
        }
        search(&self.inner.cloud, &key).await
    }

    /// Drops the prefetched lookup of `node`, if any: unsent, it is not sent.
    pub(crate) fn cancel(&self, node: &str) {
        self.inner.state.lock().pending.remove(node);
    }

    #[cfg(test)]
    fn pending(&self) -> usize {
        self.inner.state.lock().pending.len()
    }
}

/// The cluster sweep, indexed by position: the shared sweep itself is kept
/// (an `Arc`), and the indexes are positions sorted by key, searched by
/// bisection. Maps of owned keys cost about 140 bytes per instance and were
/// rebuilt on every monitor period; positions cost 8.
pub(crate) struct SweepIndex {
    sweep: Arc<Vec<Instance>>,
    /// Every instance, by ID.
    by_id: Vec<u32>,
    /// Live instances by private DNS name (a terminated instance keeps its
    /// name for a while; a new one may reuse it).
    by_dns: Vec<u32>,
}

impl SweepIndex {
    pub(crate) fn new(sweep: &Arc<Vec<Instance>>) -> SweepIndex {
        let positions = 0..sweep.len().min(u32::MAX as usize) as u32;
        let at = |p: &u32| &sweep[*p as usize];
        let mut by_id: Vec<u32> = positions.clone().collect();
        by_id.sort_by(|a, b| at(a).id.cmp(&at(b).id));
        let mut by_dns: Vec<u32> = positions
            .filter(|p| {
                let i = at(p);
                i.private_dns_name.is_some() && i.state != InstanceState::Terminated
            })
            .collect();
        by_dns.sort_by(|a, b| at(a).private_dns_name.cmp(&at(b).private_dns_name));
        SweepIndex {
            by_id,
            by_dns,
            sweep: sweep.clone(),
        }
    }

    pub(crate) fn find(&self, lookup: &Lookup) -> Option<&Instance> {
        let at = |p: &u32| &self.sweep[*p as usize];
        let (index, found) = match lookup {
            Lookup::ById(id) => (
                &self.by_id,
                self.by_id.binary_search_by(|p| at(p).id.as_str().cmp(id)),
            ),
            Lookup::ByPrivateDns(name) => (
                &self.by_dns,
                self.by_dns.binary_search_by(|p| {
                    at(p).private_dns_name.as_deref().cmp(&Some(name.as_str()))
                }),
            ),
        };
        found.ok().map(|f| at(&index[f]))
    }
}

/// An instance [`resolve_all`] found: borrowed from the sweep, or looked up
/// apart and boxed. A map of every node's answer then holds a pointer per
/// node, not an instance: at 5,000 nodes the inline answers made the address
/// refresh's map 3.5 MB while it grew, the largest allocation at the steady
/// bench's heap peak (docs/scale.md).
#[derive(Debug)]
pub(crate) enum Resolved<'s> {
    Swept(&'s Instance),
    Looked(Box<Instance>),
}

impl std::ops::Deref for Resolved<'_> {
    type Target = Instance;

    fn deref(&self) -> &Instance {
        match self {
            Resolved::Swept(i) => i,
            Resolved::Looked(i) => i,
        }
    }
}

/// What [`resolve_all`] found for each key: the keys borrowed from the
/// caller and a failed lookup's error boxed, so each of the map's slots is
/// three words (one lookup a node).
pub(crate) type Resolutions<'k, 's> =
    HashMap<&'k Lookup, Result<Option<Resolved<'s>>, Box<CloudError>>>;

/// Looks up every key: from the sweep when it has it, else directly
/// (concurrently, so the cloud layer batches them). Keys missing from the
/// result could not be looked up (the error is logged by the caller's
/// `on_error`); `Ok(None)` means the cloud says there is no such instance.
/// Instances found in the sweep are borrowed from it: a refresh of every
/// node would otherwise hold a second copy of the whole sweep.
pub(crate) async fn resolve_all<'k, 's, I: Instances>(
    cloud: &I,
    sweep: &'s SweepIndex,
    keys: impl IntoIterator<Item = &'k Lookup>,
) -> Resolutions<'k, 's> {
    let keys: Vec<&'k Lookup> = keys.into_iter().collect();
    // Sized once: growing it would hold the old table and the new at once.
    let mut out = HashMap::with_capacity(keys.len());
    let mut missing = Vec::new();
    for key in keys {
        match sweep.find(key) {
            Some(instance) => {
                out.insert(key, Ok(Some(Resolved::Swept(instance))));
            }
            None => missing.push(key),
        }
    }
    missing.sort_by(|a, b| format!("{a}").cmp(&format!("{b}")));
    missing.dedup();
    let answers = futures::future::join_all(missing.iter().map(|key| lookup(cloud, key))).await;
    for (key, answer) in missing.into_iter().zip(answers) {
        let answer = answer.map(|found| found.map(|i| Resolved::Looked(Box::new(i))));
        out.insert(key, answer.map_err(Box::new));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::instances::fake::{FakeInstances, instance};

    /// A prefetcher gathering for `gather`, sending until the test ends.
    fn running(
        cloud: &FakeInstances,
        gather: Duration,
        span: Duration,
    ) -> Prefetcher<FakeInstances> {
        let prefetcher = Prefetcher::new(cloud.clone(), gather, span);
        let sender = prefetcher.clone();
        tokio::spawn(async move { sender.run(&CancellationToken::new()).await });
        prefetcher
    }

    /// Lets the queue and the lookups run until nothing is ready now.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn prefetched_answers_are_used_once_then_looked_up_afresh() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-1", "10.0.0.1"));
        let prefetcher = running(&cloud, Duration::from_millis(200), BURST_SPAN);
        let key = Lookup::ByPrivateDns("ip-10-0-0-1.ec2.internal".into());
        prefetcher.prefetch("n1", key.clone());
        prefetcher.prefetch("n1", key.clone());
        assert_eq!(prefetcher.pending(), 1, "one lookup per node");
        let found = prefetcher.resolve("n1", &key).await.found.unwrap();
        assert_eq!(found.map(|i| i.id).as_deref(), Some("i-1"));
        assert_eq!(cloud.calls().by_private_dns.len(), 1);
        // A retry does not reuse the old answer.
        prefetcher.resolve("n1", &key).await.found.unwrap();
        assert_eq!(cloud.calls().by_private_dns.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_of_one_window_fire_together() {
        let cloud = FakeInstances::new();
        let prefetcher = running(&cloud, Duration::from_millis(200), BURST_SPAN);
        prefetcher.prefetch("a", Lookup::ById("i-a".into()));
        tokio::time::advance(Duration::from_millis(150)).await;
        prefetcher.prefetch("b", Lookup::ById("i-b".into()));
        tokio::task::yield_now().await;
        assert!(cloud.calls().by_id.is_empty(), "the window is still open");
        tokio::time::advance(Duration::from_millis(60)).await;
        settle().await;
        assert_eq!(
            cloud.calls().by_id.len(),
            2,
            "both sent when the first had waited 200 ms"
        );
    }

    /// A burst window shares one sweep; instances the sweep lacks are looked
    /// up by name; a small burst never sweeps.
    #[tokio::test(start_paused = true)]
    async fn a_large_window_shares_the_sweep_and_a_small_one_goes_by_name() {
        let cloud = FakeInstances::new();
        let burst = SWEEP_FROM + 50;
        for i in 0..burst {
            cloud.add(instance(
                &format!("i-{i}"),
                &format!("10.0.{}.{}", i / 200, i % 200 + 1),
            ));
        }
        cloud.hide_from_sweep("i-7");
        let prefetcher = running(&cloud, Duration::from_millis(200), BURST_SPAN);
        let name = |i: usize| format!("ip-10-0-{}-{}.ec2.internal", i / 200, i % 200 + 1);
        for i in 0..burst {
            prefetcher.prefetch(&format!("n{i}"), Lookup::ByPrivateDns(name(i)));
        }
        for i in 0..burst {
            let found = prefetcher
                .resolve(&format!("n{i}"), &Lookup::ByPrivateDns(name(i)))
                .await
                .found
                .unwrap();
            assert_eq!(found.map(|f| f.id), Some(format!("i-{i}")));
        }
        let calls = cloud.calls();
        assert_eq!(calls.sweeps, 1, "one sweep for the whole window");
        assert_eq!(
            calls.by_private_dns,
            vec![name(7)],
            "only the one the sweep lacks"
        );

        // A burst later than the sweep's lifetime starts small again.
        tokio::time::advance(BURST_SPAN).await;
        prefetcher.prefetch("late", Lookup::ByPrivateDns(name(3)));
        let found = prefetcher
            .resolve("late", &Lookup::ByPrivateDns(name(3)))
            .await
            .found
            .unwrap();
        assert_eq!(found.map(|f| f.id).as_deref(), Some("i-3"));
        let calls = cloud.calls();
        assert_eq!(calls.sweeps, 1, "a small burst does not sweep");
        assert_eq!(calls.by_private_dns.len(), 2);
    }

    /// `windows` windows of `per_window` joining nodes, a second apart, each
    /// resolved to its own instance; returns the fake's calls.
    async fn join_in_windows(
        span: Option<Duration>,
        per_window: usize,
        windows: usize,
    ) -> (crate::provider::instances::fake::Calls, usize) {
        let cloud = FakeInstances::new();
        let ip = |i: usize| format!("10.1.{}.{}", i / 200, i % 200 + 1);
        let name = |i: usize| format!("ip-{}.ec2.internal", ip(i).replace('.', "-"));
        for i in 0..per_window * windows {
            cloud.add(instance(&format!("i-{i}"), &ip(i)));
        }
        let span = span.unwrap_or(BURST_SPAN);
        let prefetcher = running(&cloud, Duration::from_millis(200), span);
        for w in 0..windows {
            let nodes: Vec<usize> = (w * per_window..(w + 1) * per_window).collect();
            for &i in &nodes {
                prefetcher.prefetch(&format!("n{i}"), Lookup::ByPrivateDns(name(i)));
            }
            for &i in &nodes {
                let found = (prefetcher.resolve(&format!("n{i}"), &Lookup::ByPrivateDns(name(i))))
                    .await
                    .found
                    .unwrap();
                assert_eq!(found.map(|f| f.id), Some(format!("i-{i}")));
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let counted = (prefetcher.inner.state.lock().burst.as_ref())
            .map_or(0, |(_, b)| b.lookups.load(Ordering::Relaxed));
        (cloud.calls(), counted)
    }

    /// A burst spread thin over many windows (a slow scale-up) shares the
    /// sweep once it is large, however few nodes each window holds.
    #[tokio::test(start_paused = true)]
    async fn a_burst_spread_over_small_windows_shares_the_sweep() {
        let (per_window, windows) = (50, SWEEP_FROM / 50 + 3);
        let (calls, counted) = join_in_windows(None, per_window, windows).await;
        let by_name = SWEEP_FROM - per_window;
        assert_eq!(
            calls.by_private_dns.len(),
            by_name,
            "by name until the burst reached {SWEEP_FROM}"
        );
        // The fake reads afresh where the client would answer from its
        // cache: one read per window from the window that reached it.
        assert_eq!(calls.sweeps as usize, windows - by_name / per_window);
        assert_eq!(counted, per_window * windows);
    }

    /// With a sweep lifetime of a second (`--aws-instance-sweep-ttl=1s`),
    /// windows a second apart are bursts of their own: none is large
    /// enough to sweep, as the sweep would be read afresh for each.
    #[tokio::test(start_paused = true)]
    async fn a_burst_spans_the_sweeps_lifetime() {
        let (calls, counted) = join_in_windows(Some(Duration::from_secs(1)), 50, 6).await;
        assert_eq!(calls.sweeps, 0, "no burst reached {SWEEP_FROM}");
        assert_eq!(calls.by_private_dns.len(), 300);
        assert_eq!(counted, 50, "the last window's burst alone");
    }

    /// Nodes on a custom DHCP domain: their names find nothing, and the
    /// batch that asked their names goes on by their addresses, all at once
    /// (so the cloud batches those too); a name that finds its instance, or
    /// a lookup by ID, does not go on.
    #[tokio::test(start_paused = true)]
    async fn a_window_of_names_that_find_nothing_goes_on_by_address_together() {
        let cloud = FakeInstances::new();
        let burst = SWEEP_FROM + 50;
        let ip = |i: usize| format!("10.2.{}.{}", i / 200, i % 200 + 1);
        for i in 0..burst {
            cloud.add(instance(&format!("i-{i}"), &ip(i)));
        }
        let gather = Duration::from_millis(200);
        let prefetcher = running(&cloud, gather, BURST_SPAN);
        let search = |i: usize| Search {
            lookup: Lookup::ByPrivateDns(format!("dhcp-{i}.corp.example")),
            addresses: vec![ip(i).parse().expect("test IP")],
        };
        for i in 0..burst {
            prefetcher.prefetch(&format!("n{i}"), search(i));
        }
        tokio::time::advance(gather + Duration::from_millis(10)).await;
        settle().await;
        let calls = cloud.calls();
        assert_eq!(calls.by_private_dns.len(), burst, "each name once");
        assert_eq!(
            calls.by_private_ip.len(),
            burst,
            "each address, in the same batch"
        );
        for i in 0..burst {
            let answer = prefetcher.resolve(&format!("n{i}"), search(i)).await;
            assert!(matches!(answer.found, Ok(None)), "{answer:?}");
            let by_address = answer.by_address.expect("asked").expect("answered");
            let ids: Vec<String> = by_address.into_iter().map(|i| i.id).collect();
            assert_eq!(ids, [format!("i-{i}")]);
        }
        assert_eq!(
            cloud.calls().by_private_ip.len(),
            burst,
            "the prefetched answers, not new lookups"
        );

        let named = Search {
            lookup: Lookup::ByPrivateDns("ip-10-2-0-1.ec2.internal".into()),
            addresses: vec!["10.2.0.1".parse().expect("test IP")],
        };
        let by_id = Search {
            lookup: Lookup::ById("i-none".into()),
            addresses: vec!["10.2.0.1".parse().expect("test IP")],
        };
        for key in [named, by_id] {
            let answer = super::search(&cloud, &key).await;
            assert!(answer.by_address.is_none(), "{key:?} went on: {answer:?}");
        }
        assert_eq!(cloud.calls().by_private_ip.len(), burst);
    }

    /// A node whose addresses changed between its prefetch and its
    /// reconcile keeps the prefetched answer of its name; only its new
    /// addresses are asked.
    #[tokio::test(start_paused = true)]
    async fn changed_addresses_ask_only_the_addresses_again() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-new", "10.3.0.2"));
        let prefetcher = running(&cloud, Duration::from_millis(200), BURST_SPAN);
        let lookup = Lookup::ByPrivateDns("dhcp.corp.example".into());
        let at = |ip: &str| Search {
            lookup: lookup.clone(),
            addresses: vec![ip.parse().expect("test IP")],
        };
        prefetcher.prefetch("n", at("10.3.0.1"));
        let answer = prefetcher.resolve("n", at("10.3.0.2")).await;
        let found: Vec<String> = (answer.by_address.expect("asked").expect("answered"))
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(found, ["i-new"]);
        let calls = cloud.calls();
        assert_eq!(calls.by_private_dns.len(), 1, "the name asked once");
        let asked: Vec<String> = calls
            .by_private_ip
            .iter()
            .map(|ip| ip.to_string())
            .collect();
        assert_eq!(asked, ["10.3.0.1", "10.3.0.2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_lookup_replaces_the_prefetched_one() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-2", "10.0.0.2"));
        let prefetcher = running(&cloud, Duration::from_millis(200), BURST_SPAN);
        prefetcher.prefetch("n", Lookup::ByPrivateDns("n".into()));
        let found = prefetcher
            .resolve("n", &Lookup::ById("i-2".into()))
            .await
            .found
            .unwrap();
        assert_eq!(found.map(|i| i.id).as_deref(), Some("i-2"));
        prefetcher.prefetch("gone", Lookup::ById("i-x".into()));
        prefetcher.cancel("gone");
        assert_eq!(prefetcher.pending(), 0);
        tokio::time::sleep(Duration::from_secs(1)).await;
        settle().await;
        assert!(
            cloud.calls().by_id.iter().all(|id| id != "i-x"),
            "a cancelled lookup is not sent"
        );
    }

    /// A prefetcher that stopped before sending a lookup: the node's
    /// reconcile looks its instance up itself, never an error.
    #[tokio::test(start_paused = true)]
    async fn a_lookup_left_unsent_at_shutdown_is_looked_up_directly() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-1", "10.0.0.1"));
        let prefetcher = Prefetcher::new(cloud.clone(), Duration::from_millis(200), BURST_SPAN);
        let stop = CancellationToken::new();
        let sender = prefetcher.clone();
        let (st, gather) = (stop.clone(), Duration::from_millis(200));
        let sending = tokio::spawn(async move { sender.run(&st).await });
        prefetcher.prefetch("n", Lookup::ById("i-1".into()));
        tokio::time::advance(gather / 2).await;
        stop.cancel();
        sending.await.expect("the prefetcher ends");
        assert!(cloud.calls().by_id.is_empty(), "stopped before the batch");
        let found = prefetcher.resolve("n", &Lookup::ById("i-1".into())).await;
        assert_eq!(found.found.unwrap().map(|i| i.id).as_deref(), Some("i-1"));
        assert_eq!(cloud.calls().by_id, ["i-1"]);
    }

    /// Whatever order the sweep comes in, every instance is found by ID,
    /// every live one by DNS name, and nothing else is.
    #[test]
    fn the_index_finds_every_instance_of_an_unsorted_sweep() {
        let mut sweep: Vec<Instance> = (0..64u32)
            .map(|n| {
                instance(
                    &format!("i-{:03}", (n * 37) % 64),
                    &format!("10.0.{}.{}", n / 8, n),
                )
            })
            .collect();
        sweep[5].state = InstanceState::Terminated;
        sweep[9].private_dns_name = None;
        let sweep = Arc::new(sweep);
        let index = SweepIndex::new(&sweep);
        for (at, i) in sweep.iter().enumerate() {
            let by_id = index
                .find(&Lookup::ById(i.id.clone()))
                .map(|f| f.id.as_str());
            assert_eq!(by_id, Some(i.id.as_str()), "instance {at} by ID");
            if let Some(dns) = &i.private_dns_name {
                let by_dns = index
                    .find(&Lookup::ByPrivateDns(dns.clone()))
                    .map(|f| f.id.as_str());
                let want = (at != 5).then_some(i.id.as_str());
                assert_eq!(by_dns, want, "instance {at} by DNS name");
            }
        }
        assert!(index.find(&Lookup::ById("i-999".into())).is_none());
        assert!(
            index
                .find(&Lookup::ByPrivateDns("ip-9-9-9-9.ec2.internal".into()))
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_sweep_answers_first_and_direct_lookups_fill_the_gaps() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-tagged", "10.0.0.1"));
        let mut untagged = instance("i-untagged", "10.0.0.2");
        untagged.tags.clear();
        cloud.add(untagged);
        cloud.hide_from_sweep("i-untagged");
        let mut old = instance("i-old", "10.0.0.1");
        old.state = InstanceState::Terminated;
        cloud.add(old);
        let sweep = cloud.cluster_instances().await.unwrap();
        let index = SweepIndex::new(&sweep);
        assert_eq!(
            index
                .find(&Lookup::ByPrivateDns("ip-10-0-0-1.ec2.internal".into()))
                .map(|i| i.id.as_str()),
            Some("i-tagged"),
            "the live instance wins over a terminated one with the same name"
        );
        let keys = [
            Lookup::ById("i-tagged".into()),
            Lookup::ById("i-untagged".into()),
            Lookup::ById("i-none".into()),
        ];
        let found = resolve_all(&cloud, &index, &keys).await;
        assert_eq!(cloud.calls().by_id, ["i-none", "i-untagged"]);
        assert!(
            matches!(&found[&Lookup::ById("i-untagged".into())], Ok(Some(i)) if i.id == "i-untagged")
        );
        assert!(matches!(&found[&Lookup::ById("i-none".into())], Ok(None)));
    }
}
