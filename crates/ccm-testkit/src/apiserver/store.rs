//! The object store: one global resourceVersion counter, a BTreeMap of
//! objects per resource, a bounded history ring per resource for watch
//! resumption and `resourceVersionMatch=Exact` lists, and a broadcast
//! channel per resource that feeds the watchers.
//!
//! Every write runs under one mutex so the resourceVersion order, the
//! history order and the broadcast order are the same. Objects are shared
//! as `Arc<Stored>` with their JSON already rendered, so lists and watches
//! never copy or re-serialize objects while holding the lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::{broadcast, watch};

use super::errors::{ApiError, Cause};
use super::patch;
use super::resources::{self, NAMESPACES, RESOURCES, ResourceDef, storage_index};
use super::selectors::Selectors;
use super::ssa::{self, WriteCtx};

/// One stored object version, with its JSON rendered once.
#[derive(Debug)]
pub(crate) struct Stored {
    pub value: Value,
    pub json: Bytes,
    pub rv: u64,
}

impl Stored {
    fn new(value: Value, rv: u64) -> Arc<Stored> {
        // Rendering a serde_json::Value cannot fail (all keys are strings).
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Arc::new(Stored { value, json, rv })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// (namespace, name); cluster-scoped objects have an empty namespace.
pub(crate) type Key = (String, String);

/// One change, as kept in history and sent to watchers.
#[derive(Debug)]
pub(crate) struct Change {
    pub kind: EventType,
    pub rv: u64,
    pub key: Key,
    /// The new state; for a deletion, the last state with the deletion's resourceVersion.
    pub obj: Arc<Stored>,
    /// The state before the change, if there was one.
    pub prev: Option<Arc<Stored>>,
}

/// What a resource's broadcast channel carries.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    Change(Arc<Change>),
    /// Every change up to this resourceVersion has been sent: a watcher may
    /// send a BOOKMARK carrying it.
    Tick(u64),
}

struct ResState {
    objects: BTreeMap<Key, Arc<Stored>>,
    history: VecDeque<Arc<Change>>,
    /// Watches may resume from any resourceVersion >= floor; older ones
    /// were evicted from history or compacted away.
    floor: u64,
    tx: broadcast::Sender<Msg>,
}

/// A list result frozen for pagination: later pages come from it, so a
/// paginated list is one consistent snapshot.
struct Snapshot {
    rv: u64,
    items: Arc<Vec<Arc<Stored>>>,
    created: Instant,
}

const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
const MAX_SNAPSHOTS: usize = 256;
/// A watcher this many changes behind is dropped. It is bounded by the
/// history size too: a watcher further behind than the history could not
/// resume anyway.
const MAX_BROADCAST_CAPACITY: usize = 8192;

struct State {
    rv: u64,
    /// Committed changes the watch cache has not seen yet (only with a
    /// lag): when each becomes visible, which resource, the change.
    pending: VecDeque<(tokio::time::Instant, usize, Arc<Change>)>,
    res: Vec<ResState>,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
    next_cluster_ip: u32,
    /// Allocated service node ports and their owners.
    node_ports: HashMap<u64, Key>,
    next_node_port: u64,
}

/// What the server's own chaos (watch drops, compaction, a lagging watch
/// cache) did to its clients, counted where it happens, so a test shows
/// each disruption it configured was met.
#[derive(Debug, Default)]
pub(crate) struct DisruptionCounters {
    pub watches_dropped: AtomicU64,
    pub expired: AtomicU64,
    pub lagged_events: AtomicU64,
    pub stale_reads: AtomicU64,
}

impl DisruptionCounters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> super::Disruptions {
        super::Disruptions {
            watches_dropped: self.watches_dropped.load(Ordering::Relaxed),
            expired: self.expired.load(Ordering::Relaxed),
            lagged_events: self.lagged_events.load(Ordering::Relaxed),
            stale_reads: self.stale_reads.load(Ordering::Relaxed),
        }
    }
}

/// The store shared by all requests of one server.
pub(crate) struct Store {
    state: Mutex<State>,
    history_size: usize,
    rv_tx: watch::Sender<u64>,
    /// How long the watch cache lags writes (zero: not at all).
    lag: Duration,
    /// Wakes the watch cache pump when a change is queued.
    pump_wake: tokio::sync::Notify,
    pub disruptions: Arc<DisruptionCounters>,
}

/// A page of a list.
pub(crate) struct ListPage {
    pub rv: u64,
    pub items: Vec<Arc<Stored>>,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// The list query parameters that decide which state is read.
#[derive(Debug, Default, Clone)]
pub(crate) struct ListOpts {
    pub resource_version: Option<String>,
    pub rv_match: Option<String>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

/// Where a watch starts.
pub(crate) struct WatchStart {
    /// Objects to announce as synthetic ADDED events first.
    pub initial: Vec<Arc<Stored>>,
    /// Past changes to replay after that.
    pub replay: Vec<Arc<Change>>,
    pub rx: broadcast::Receiver<Msg>,
    /// The resourceVersion the initial state was read at.
    pub rv: u64,
    /// Changes up to this resourceVersion are already in `initial` or
    /// `replay` (or before the requested version): skip them on `rx`.
    pub skip_through: u64,
}

/// Request-level facts a write needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Writer {
    pub manager: String,
    /// Run the write's whole pipeline (defaults, validation) but store
    /// nothing: the object admission reviews (see `admission.rs`).
    pub dry_run: bool,
    /// Commit only if the object is still at this resourceVersion (the one
    /// admission reviewed); otherwise a Conflict, and the write runs again.
    pub expect_rv: Option<u64>,
    /// The name (when the body has none), uid and creationTimestamp a
    /// create gives its object: those of the object admission reviewed.
    pub pin: Option<(String, String, String)>,
}

/// What a DELETE did.
pub(crate) struct Deleted {
    pub obj: Arc<Stored>,
    /// False when finalizers hold the object back.
    pub gone: bool,
}

/// DELETE options the store honours.
#[derive(Debug, Default, Clone)]
pub(crate) struct DeleteOpts {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// A patch body of one of the four patch types.
pub(crate) enum PatchBody {
    Merge(Value),
    Json(Value),
    Strategic(Value),
    Apply { body: Value, force: bool },
}

fn now() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta_str<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The metadata map of an object, created if missing. Callers pass
/// objects only (request bodies are checked first); anything else is
/// replaced by an empty object rather than panicking.
fn meta_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.is_object() {
        *v = json!({});
    }
    let Value::Object(root) = v else {
        unreachable!("made an object above")
    };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    match meta {
        Value::Object(m) => m,
        _ => unreachable!("made an object above"),
    }
}

fn finalizers(v: &Value) -> Vec<String> {
    v.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn is_deleting(v: &Value) -> bool {
    v.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// Everything but metadata and status: what `generation` tracks.
fn spec_part(v: &Value) -> Map<String, Value> {
    let mut m = v.as_object().cloned().unwrap_or_default();
    for k in ["metadata", "status", "apiVersion", "kind"] {
        m.remove(k);
    }
    m
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {s:?}: not an unsigned integer"
        ))
    })
}

const GENERATE_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn random_suffix() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..5)
        .map(|_| GENERATE_ALPHABET[rng.random_range(0..GENERATE_ALPHABET.len())] as char)
        .collect()
}

impl Store {
    pub fn new(history_size: usize, lag: Duration) -> Store {
        let capacity = history_size.clamp(16, MAX_BROADCAST_CAPACITY);
        let res = RESOURCES
            .iter()
            .map(|_| ResState {
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                floor: 0,
                tx: broadcast::channel(capacity).0,
            })
            .collect();
        let (rv_tx, _) = watch::channel(0);
        Store {
            state: Mutex::new(State {
                rv: 0,
                pending: VecDeque::new(),
                res,
                snapshots: HashMap::new(),
                next_snapshot: 1,
                next_cluster_ip: 10,
                node_ports: HashMap::new(),
                next_node_port: *NODE_PORT_RANGE.start(),
            }),
            history_size: history_size.max(1),
            rv_tx,
            lag,
            pump_wake: tokio::sync::Notify::new(),
            disruptions: Arc::default(),
        }
    }

    /// A 410 Gone answered because history was compacted or outgrown.
    fn expired(&self, message: impl Into<String>) -> ApiError {
        DisruptionCounters::bump(&self.disruptions.expired);
        ApiError::expired(message)
    }

    /// Whether a change to resource `res` (a storage index) that the watch
    /// cache has not seen yet passes `also`: a cached read now misses it.
    fn misses_pending(st: &State, res: usize, also: impl Fn(&Change) -> bool) -> bool {
        st.pending.iter().any(|(_, r, c)| *r == res && also(c))
    }

    /// The newest resourceVersion the watch cache has seen: every change up
    /// to it has gone to the watchers.
    fn cache_rv(st: &State) -> u64 {
        st.pending
            .front()
            .map_or(st.rv, |(_, _, c)| c.rv.saturating_sub(1))
    }

    /// Sends the queued changes whose time has come to the watchers;
    /// returns when the next one is due.
    fn pump(&self) -> Option<tokio::time::Instant> {
        let mut st = self.state.lock();
        let now = tokio::time::Instant::now();
        while let Some((due, _, _)) = st.pending.front() {
            if *due > now {
                return Some(*due);
            }
            if let Some((_, res, change)) = st.pending.pop_front() {
                // An error only means nobody is watching.
                if st.res[res].tx.send(Msg::Change(change)).is_ok() {
                    DisruptionCounters::bump(&self.disruptions.lagged_events);
                }
            }
        }
        None
    }

    /// Feeds the lagging watch cache until `cancel` fires (returns at
    /// once when there is no lag).
    pub async fn run_watch_cache(&self, cancel: tokio_util::sync::CancellationToken) {
        if self.lag.is_zero() {
            return;
        }
        loop {
            let wake = self.pump_wake.notified();
            let next = self.pump();
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = wake => {}
                _ = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    pub fn current_rv(&self) -> u64 {
        self.state.lock().rv
    }

    /// Waits (bounded) until the store has reached `rv`.
    pub async fn wait_for_rv(&self, rv: u64, timeout: Duration) -> bool {
        let mut rx = self.rv_tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|cur| *cur >= rv))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Forgets all history: any older resourceVersion now gets 410 Gone,
    /// and pagination snapshots expire, as after an etcd compaction.
    pub fn compact(&self) {
        let mut st = self.state.lock();
        let rv = st.rv;
        for r in st.res.iter_mut() {
            r.history.clear();
            r.floor = rv;
        }
        st.snapshots.clear();
    }

    /// Lets every watcher send a bookmark at the current resourceVersion.
    pub fn tick(&self) {
        let st = self.state.lock();
        let rv = Self::cache_rv(&st);
        for r in &st.res {
            if r.tx.receiver_count() > 0 {
                let _ = r.tx.send(Msg::Tick(rv));
            }
        }
    }

    fn commit(
        &self,
        st: &mut State,
        res: usize,
        key: Key,
        mut value: Value,
        kind: EventType,
        prev: Option<Arc<Stored>>,
    ) -> Arc<Stored> {
        st.rv += 1;
        let rv = st.rv;
        meta_mut(&mut value).insert("resourceVersion".into(), json!(rv.to_string()));
        let res = storage_index(res);
        let stored = Stored::new(value, rv);
        if RESOURCES[res].plural == "services" {
            if let Some(prev) = &prev {
                for n in node_ports_of(&prev.value) {
                    if st.node_ports.get(&n) == Some(&key) {
                        st.node_ports.remove(&n);
                    }
                }
            }
            if kind != EventType::Deleted {
                for n in node_ports_of(&stored.value) {
                    st.node_ports.insert(n, key.clone());
                }
            }
        }
        let rs = &mut st.res[res];
        if kind == EventType::Deleted {
            rs.objects.remove(&key);
        } else {
            rs.objects.insert(key.clone(), stored.clone());
        }
        let change = Arc::new(Change {
            kind,
            rv,
            key,
            obj: stored.clone(),
            prev,
        });
        rs.history.push_back(change.clone());
        while rs.history.len() > self.history_size {
            if let Some(old) = rs.history.pop_front() {
                rs.floor = old.rv;
            }
        }
        if self.lag.is_zero() {
            // An error only means nobody is watching.
            let _ = rs.tx.send(Msg::Change(change));
        } else {
            let due = tokio::time::Instant::now() + self.lag;
            st.pending.push_back((due, res, change));
            self.pump_wake.notify_one();
        }
        self.rv_tx.send_replace(rv);
        stored
    }

    /// Every object of `res`, as stored now.
    pub fn all(&self, res: usize) -> Vec<Value> {
        let st = self.state.lock();
        st.res[storage_index(res)]
            .objects
            .values()
            .map(|o| o.value.clone())
            .collect()
    }

    pub fn get(&self, res: usize, ns: &str, name: &str) -> Result<Arc<Stored>, ApiError> {
        let st = self.state.lock();
        st.res[storage_index(res)]
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))
    }

    /// A get served from the watch cache (`resourceVersion=0`): with a
    /// lag, the object as the cache last saw it.
    pub fn get_cached(&self, res: usize, ns: &str, name: &str) -> Result<Arc<Stored>, ApiError> {
        let st = self.state.lock();
        let cache_rv = Self::cache_rv(&st);
        if cache_rv == st.rv {
            drop(st);
            return self.get(res, ns, name);
        }
        let this = |c: &Change| c.key.0 == ns && c.key.1 == name;
        if Self::misses_pending(&st, storage_index(res), this) {
            DisruptionCounters::bump(&self.disruptions.stale_reads);
        }
        Self::at_rv(&st, res, Some(ns), cache_rv)
            .into_iter()
            .find(|o| meta_str(&o.value, "name") == name)
            .ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))
    }

    fn scan(st: &State, res: usize, ns: Option<&str>) -> Vec<Arc<Stored>> {
        let objects = &st.res[storage_index(res)].objects;
        match ns {
            Some(ns) => objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => objects.values().cloned().collect(),
        }
    }

    /// The objects as they were at `rv`, rebuilt by undoing later history.
    fn at_rv(st: &State, res: usize, ns: Option<&str>, rv: u64) -> Vec<Arc<Stored>> {
        let rs = &st.res[storage_index(res)];
        let mut objects = rs.objects.clone();
        for change in rs.history.iter().rev().take_while(|c| c.rv > rv) {
            match (&change.kind, &change.prev) {
                (EventType::Added, _) => {
                    objects.remove(&change.key);
                }
                (_, Some(prev)) => {
                    objects.insert(change.key.clone(), prev.clone());
                }
                (_, None) => {}
            }
        }
        objects
            .into_iter()
            .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
            .map(|(_, v)| v)
            .collect()
    }

    /// Lists objects, honouring resourceVersion, resourceVersionMatch,
    /// limit and continue as the real server does.
    pub fn list(
        &self,
        res: usize,
        ns: Option<&str>,
        sel: &Selectors,
        opts: &ListOpts,
    ) -> Result<ListPage, ApiError> {
        let rv_param = opts.resource_version.as_deref().filter(|s| !s.is_empty());
        if let Some(m) = opts.rv_match.as_deref().filter(|s| !s.is_empty()) {
            if rv_param.is_none() {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if opts.continue_token.is_some() {
                return Err(ApiError::bad_request(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            match m {
                "NotOlderThan" => {}
                "Exact" if rv_param == Some("0") => {
                    return Err(ApiError::bad_request(
                        "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                    ));
                }
                "Exact" => {}
                other => {
                    return Err(ApiError::bad_request(format!(
                        "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\", \"\""
                    )));
                }
            }
        }
        let limit = opts.limit.filter(|l| *l > 0);
        let mut st = self.state.lock();
        let now = Instant::now();
        st.snapshots
            .retain(|_, s| now.duration_since(s.created) < SNAPSHOT_TTL);

        if let Some(token) = opts.continue_token.as_deref().filter(|s| !s.is_empty()) {
            if rv_param.is_some_and(|rv| rv != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            let (id, offset) = decode_continue(token)?;
            let snap = st.snapshots.get(&id).ok_or_else(|| {
                self.expired(
                    "The provided continue parameter is too old to display a consistent list result. \
                     You can start a new list without the continue parameter.",
                )
            })?;
            let (rv, items) = (snap.rv, snap.items.clone());
            drop(st);
            return Ok(page(rv, &items, offset, limit, id, sel.is_empty()));
        }

        let (rv, items) = match (rv_param, opts.rv_match.as_deref()) {
            (Some(rv), Some("Exact")) => {
                let rv = parse_rv(rv)?;
                if rv > st.rv {
                    return Err(ApiError::too_large_rv(rv, st.rv));
                }
                if rv < st.res[storage_index(res)].floor {
                    return Err(
                        self.expired("The resourceVersion for the provided list is too old.")
                    );
                }
                (rv, Self::at_rv(&st, res, ns, rv))
            }
            (Some(rv), _) => {
                let wanted = parse_rv(rv)?;
                if wanted > st.rv {
                    return Err(ApiError::too_large_rv(wanted, st.rv));
                }
                // Served from the watch cache, which may lag the store.
                let cache_rv = Self::cache_rv(&st);
                if cache_rv < st.rv && wanted <= cache_rv {
                    let of_ns = |c: &Change| ns.is_none_or(|ns| ns == c.key.0);
                    if Self::misses_pending(&st, storage_index(res), of_ns) {
                        DisruptionCounters::bump(&self.disruptions.stale_reads);
                    }
                    (cache_rv, Self::at_rv(&st, res, ns, cache_rv))
                } else {
                    (st.rv, Self::scan(&st, res, ns))
                }
            }
            (None, _) => (st.rv, Self::scan(&st, res, ns)),
        };
        // Selectors run on the snapshot; the lock is not needed for that.
        drop(st);
        let items: Vec<Arc<Stored>> = if sel.is_empty() {
            items
        } else {
            items
                .into_iter()
                .filter(|o| sel.matches(&o.value))
                .collect()
        };
        match limit {
            Some(l) if items.len() > l => {
                let items = Arc::new(items);
                let mut st = self.state.lock();
                // Taken under this lock so concurrent lists never share an id.
                let id = st.next_snapshot;
                st.next_snapshot += 1;
                if st.snapshots.len() >= MAX_SNAPSHOTS
                    && let Some(oldest) = st
                        .snapshots
                        .iter()
                        .min_by_key(|(_, s)| s.created)
                        .map(|(k, _)| *k)
                {
                    st.snapshots.remove(&oldest);
                }
                st.snapshots.insert(
                    id,
                    Snapshot {
                        rv,
                        items: items.clone(),
                        created: Instant::now(),
                    },
                );
                drop(st);
                Ok(page(rv, &items, 0, limit, id, sel.is_empty()))
            }
            _ => Ok(ListPage {
                rv,
                items,
                continue_token: None,
                remaining: None,
            }),
        }
    }

    /// Starts a watch. `from` is the resourceVersion parameter; None or 0
    /// means "current state as ADDED events, then changes". An `Expired`
    /// error means the resourceVersion is older than the retained history.
    pub fn watch(
        &self,
        res: usize,
        ns: Option<&str>,
        from: Option<u64>,
        initial_events: bool,
    ) -> Result<WatchStart, ApiError> {
        let st = self.state.lock();
        let rs = &st.res[storage_index(res)];
        let rx = rs.tx.subscribe();
        // Watches are served by the watch cache: changes after `cache_rv`
        // are still queued and reach `rx` later.
        let cache_rv = Self::cache_rv(&st);
        match from {
            Some(rv) if rv > 0 && !initial_events => {
                if rv < rs.floor {
                    return Err(
                        self.expired(format!("too old resource version: {rv} ({})", rs.floor))
                    );
                }
                let replay: Vec<Arc<Change>> = rs
                    .history
                    .iter()
                    .skip_while(|c| c.rv <= rv)
                    .take_while(|c| c.rv <= cache_rv)
                    .filter(|c| ns.is_none_or(|ns| ns == c.key.0))
                    .cloned()
                    .collect();
                Ok(WatchStart {
                    initial: Vec::new(),
                    replay,
                    rx,
                    rv,
                    skip_through: rv.max(cache_rv).min(st.rv),
                })
            }
            _ => Ok(WatchStart {
                initial: if cache_rv == st.rv {
                    Self::scan(&st, res, ns)
                } else {
                    Self::at_rv(&st, res, ns, cache_rv)
                },
                replay: Vec::new(),
                rx,
                rv: cache_rv,
                skip_through: cache_rv,
            }),
        }
    }

    fn namespace_check(st: &State, res: &ResourceDef, ns: &str) -> Result<(), ApiError> {
        if !res.namespaced {
            return Ok(());
        }
        match st.res[NAMESPACES]
            .objects
            .get(&(String::new(), ns.to_string()))
        {
            None => Err(ApiError::not_found(&RESOURCES[NAMESPACES], ns)),
            Some(n) if is_deleting(&n.value) => Err(ApiError::forbidden(
                res,
                "",
                &format!(
                    "unable to create new content in namespace {ns} because it is being terminated"
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Creates an object (POST, or PUT/apply on a missing object).
    /// `managed` says the caller already filled managedFields (apply).
    pub fn create(
        &self,
        res: usize,
        ns: &str,
        body: Value,
        w: &Writer,
        managed: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let mut st = self.state.lock();
        self.create_locked(&mut st, res, ns, body, w, managed)
    }

    fn create_locked(
        &self,
        st: &mut State,
        res: usize,
        ns: &str,
        mut obj: Value,
        w: &Writer,
        managed: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let def = &RESOURCES[res];
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of a create must be a JSON object",
            ));
        }
        // Objects are stored in the form of the resource owning the storage.
        let slot = storage_index(res);
        let sdef = &RESOURCES[slot];
        obj = resources::to_storage(res, obj);
        obj["apiVersion"] = json!(sdef.api_version());
        obj["kind"] = json!(sdef.kind);
        let body_ns = meta_str(&obj, "namespace").to_string();
        if def.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta_mut(&mut obj).insert("namespace".into(), json!(ns));
        } else {
            meta_mut(&mut obj).remove("namespace");
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty()
            && let Some((pinned, _, _)) = &w.pin
        {
            name = pinned.clone();
        }
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    def,
                    "",
                    vec![Cause {
                        reason: "FieldValueRequired",
                        message: "Required value: name or generateName is required".into(),
                        field: "metadata.name".into(),
                    }],
                ));
            }
            loop {
                name = format!("{prefix}{}", random_suffix());
                if !st.res[slot]
                    .objects
                    .contains_key(&(ns.to_string(), name.clone()))
                {
                    break;
                }
            }
        }
        validate_name(def, &name)?;
        Self::namespace_check(st, def, ns)?;
        let key = (
            if def.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name.clone(),
        );
        if st.res[slot].objects.contains_key(&key) {
            return Err(ApiError::already_exists(def, &name));
        }
        let (uid, ts) = w
            .pin
            .clone()
            .map(|(_, uid, ts)| (uid, ts))
            .unwrap_or_else(|| (uuid::Uuid::new_v4().to_string(), now()));
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(ts));
            m.remove("deletionTimestamp");
            m.remove("deletionGracePeriodSeconds");
            m.remove("selfLink");
            if def.generation {
                m.insert("generation".into(), json!(1));
            } else {
                m.remove("generation");
            }
            if !managed {
                m.remove("managedFields");
            }
        }
        prepare_create(def, &mut obj);
        defaults(st, def, &mut obj, None)?;
        if !managed {
            ssa::record_update(
                None,
                &mut obj,
                &WriteCtx {
                    res: sdef,
                    manager: &w.manager,
                    subresource: None,
                    now: &ts,
                },
            );
        }
        if w.dry_run {
            return Ok(Stored::new(obj, 0));
        }
        Ok(self.commit(st, res, key, obj, EventType::Added, None))
    }

    /// Runs the update pipeline on a candidate new state of an existing
    /// object and commits it. Returns the stored object (the old one if the
    /// write changed nothing, as the real server skips no-op writes).
    #[allow(clippy::too_many_arguments)]
    fn update_locked(
        &self,
        st: &mut State,
        res: usize,
        old: Arc<Stored>,
        mut obj: Value,
        sub: Option<&str>,
        w: &Writer,
        managed: bool,
    ) -> Result<Arc<Stored>, ApiError> {
        let def = &RESOURCES[res];
        let name = meta_str(&old.value, "name").to_string();
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of an update must be a JSON object",
            ));
        }
        let body_rv = meta_str(&obj, "resourceVersion");
        let moved_since_review = w.expect_rv.is_some_and(|rv| rv != old.rv);
        if (!body_rv.is_empty() && body_rv != old.rv.to_string()) || moved_since_review {
            return Err(ApiError::stale(def, &name));
        }
        let body_name = meta_str(&obj, "name");
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_ns = meta_str(&obj, "namespace");
        let old_ns = meta_str(&old.value, "namespace");
        if def.namespaced && !body_ns.is_empty() && body_ns != old_ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        // `obj` is in the stored form already (callers convert).
        let sdef = &RESOURCES[storage_index(res)];
        obj["apiVersion"] = json!(sdef.api_version());
        obj["kind"] = json!(sdef.kind);

        // What each endpoint may change: the main resource never writes
        // status; /status writes status and metadata, never the spec.
        let scope = ssa::Scope::of(def, sub);
        if let (Some(new_map), Some(old_map)) = (obj.as_object_mut(), old.value.as_object()) {
            match scope {
                ssa::Scope::All => {}
                ssa::Scope::Main => match old_map.get("status") {
                    Some(s) => {
                        new_map.insert("status".into(), s.clone());
                    }
                    None => {
                        new_map.remove("status");
                    }
                },
                ssa::Scope::Status => {
                    new_map.retain(|k, _| {
                        k == "metadata" || k == "status" || k == "apiVersion" || k == "kind"
                    });
                    for (k, v) in old_map {
                        if !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind") {
                            new_map.insert(k.clone(), v.clone());
                        }
                    }
                    if def.plural == "pods" {
                        // Pod status writes may not touch owner references.
                        let owners = old_map
                            .get("metadata")
                            .and_then(|m| m.get("ownerReferences"))
                            .cloned();
                        let m = new_map.entry("metadata").or_insert_with(|| json!({}));
                        if let Some(m) = m.as_object_mut() {
                            match owners {
                                Some(o) => m.insert("ownerReferences".into(), o),
                                None => m.remove("ownerReferences"),
                            };
                        }
                    }
                }
            }
        }

        // System metadata is the server's, whatever the body says.
        let old_meta = old
            .value
            .get("metadata")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        {
            let m = meta_mut(&mut obj);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match old_meta.get(k) {
                    Some(v) => m.insert(k.to_string(), v.clone()),
                    None => m.remove(k),
                };
            }
            m.remove("selfLink");
            // Omitted or `[]` keeps the stored managedFields (so clients that
            // do not know the field never strip it); `[{}]` resets them.
            let keep_old = match m.get("managedFields") {
                None | Some(Value::Null) => true,
                Some(Value::Array(a)) => a.is_empty(),
                Some(_) => false,
            };
            match old_meta.get("managedFields") {
                Some(mf) if keep_old => {
                    m.insert("managedFields".into(), mf.clone());
                }
                _ if keep_old => {
                    m.remove("managedFields");
                }
                _ => {}
            }
        }

        if is_deleting(&old.value) {
            let before = finalizers(&old.value);
            let added: Vec<String> = finalizers(&obj)
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    def,
                    &name,
                    vec![Cause {
                        reason: "FieldValueForbidden",
                        message: format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                        field: "metadata.finalizers".into(),
                    }],
                ));
            }
        }

        validate_update(def, &name, &old.value, &obj)?;
        defaults(st, def, &mut obj, Some(&old.value))?;
        if def.generation && spec_part(&obj) != spec_part(&old.value) {
            let g = old
                .value
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut obj).insert("generation".into(), json!(g + 1));
        }
        let ts = now();
        if !managed {
            ssa::record_update(
                Some(&old.value),
                &mut obj,
                &WriteCtx {
                    res: sdef,
                    manager: &w.manager,
                    subresource: sub,
                    now: &ts,
                },
            );
        }
        if obj == old.value {
            return Ok(old);
        }
        if w.dry_run {
            return Ok(Stored::new(obj, old.rv));
        }
        let key = (meta_str(&old.value, "namespace").to_string(), name);
        if is_deleting(&old.value) && finalizers(&obj).is_empty() {
            return Ok(self.finish_delete(st, res, key, obj, old));
        }
        Ok(self.commit(st, res, key, obj, EventType::Modified, Some(old)))
    }

    /// Removes an object for good; a namespace takes its contents along.
    fn finish_delete(
        &self,
        st: &mut State,
        res: usize,
        key: Key,
        last: Value,
        old: Arc<Stored>,
    ) -> Arc<Stored> {
        let gone = self.commit(st, res, key.clone(), last, EventType::Deleted, Some(old));
        if res == NAMESPACES {
            // The namespace controller's job, done at once: delete what is
            // in the namespace (objects with finalizers start terminating).
            let ns = key.1;
            for (r, def) in RESOURCES.iter().enumerate() {
                // Aliases share their storage: clean it once.
                if !def.namespaced || def.storage.is_some() {
                    continue;
                }
                for obj in Self::scan(st, r, Some(&ns)) {
                    let k = (ns.clone(), meta_str(&obj.value, "name").to_string());
                    let _ = self.delete_locked(st, r, k, obj, &DeleteOpts::default());
                }
            }
        }
        gone
    }

    /// PUT: replaces an object (or creates it where the resource allows).
    pub fn update(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        body: Value,
        sub: Option<&str>,
        w: &Writer,
    ) -> Result<(Arc<Stored>, bool), ApiError> {
        let def = &RESOURCES[res];
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of an update must be a JSON object",
            ));
        }
        let mut st = self.state.lock();
        let key = (ns.to_string(), name.to_string());
        match st.res[storage_index(res)].objects.get(&key).cloned() {
            Some(old) => {
                let body = resources::to_storage(res, body);
                Ok((
                    self.update_locked(&mut st, res, old, body, sub, w, false)?,
                    false,
                ))
            }
            None if def.allow_create_on_update && sub.is_none() => {
                let mut body = body;
                if meta_str(&body, "name").is_empty() && body.is_object() {
                    meta_mut(&mut body).insert("name".into(), json!(name));
                }
                if meta_str(&body, "name") != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        meta_str(&body, "name")
                    )));
                }
                meta_mut(&mut body).remove("resourceVersion");
                Ok((self.create_locked(&mut st, res, ns, body, w, false)?, true))
            }
            None => Err(ApiError::not_found(def, name)),
        }
    }

    /// PATCH in any of the four patch types.
    pub fn patch(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        sub: Option<&str>,
        body: PatchBody,
        w: &Writer,
    ) -> Result<(Arc<Stored>, bool), ApiError> {
        let def = &RESOURCES[res];
        let sdef = &RESOURCES[storage_index(res)];
        let mut st = self.state.lock();
        let key = (ns.to_string(), name.to_string());
        let old = st.res[storage_index(res)].objects.get(&key).cloned();
        match body {
            PatchBody::Apply { body, force } => {
                check_applied_identity(def, name, &body)?;
                // Apply works on the stored form, defaulted first so list
                // keys match the stored (defaulted) items.
                let mut body = resources::to_storage(res, body);
                default_applied(def, &mut body);
                let ts = now();
                let ctx = WriteCtx {
                    res: sdef,
                    manager: &w.manager,
                    subresource: sub,
                    now: &ts,
                };
                let mut skeleton = json!({"apiVersion": sdef.api_version(), "kind": sdef.kind, "metadata": {"name": name}});
                if def.namespaced {
                    skeleton["metadata"]["namespace"] = json!(ns);
                }
                match old {
                    None if sub.is_some() => Err(ApiError::not_found(def, name)),
                    None => {
                        let merged = ssa::apply(None, skeleton, &body, force, &ctx, name)?;
                        Ok((self.create_locked(&mut st, res, ns, merged, w, true)?, true))
                    }
                    Some(old) => {
                        let body_rv = meta_str(&body, "resourceVersion");
                        if !body_rv.is_empty() && body_rv != old.rv.to_string() {
                            return Err(ApiError::stale(def, name));
                        }
                        let merged =
                            ssa::apply(Some(&old.value), skeleton, &body, force, &ctx, name)?;
                        Ok((
                            self.update_locked(&mut st, res, old, merged, sub, w, true)?,
                            false,
                        ))
                    }
                }
            }
            other => {
                let old = old.ok_or_else(|| ApiError::not_found(def, name))?;
                // Patches are written against the requested form.
                let base = resources::to_view(def, &old.value).unwrap_or_else(|| old.value.clone());
                let patched = match other {
                    PatchBody::Merge(p) => patch::merge_patch(&base, &p),
                    PatchBody::Json(p) => patch::json_patch(&base, &p)?,
                    PatchBody::Strategic(p) => patch::strategic_merge_patch(&base, &p, def)?,
                    PatchBody::Apply { .. } => unreachable!("handled above"),
                };
                let patched = resources::to_storage(res, patched);
                Ok((
                    self.update_locked(&mut st, res, old, patched, sub, w, false)?,
                    false,
                ))
            }
        }
    }

    /// DELETE: marks the object for deletion while finalizers remain,
    /// removes it otherwise.
    pub fn delete(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let mut st = self.state.lock();
        let key = (ns.to_string(), name.to_string());
        let old = st.res[storage_index(res)]
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&RESOURCES[res], name))?;
        self.delete_locked(&mut st, res, key, old, opts)
    }

    fn delete_locked(
        &self,
        st: &mut State,
        res: usize,
        key: Key,
        old: Arc<Stored>,
        opts: &DeleteOpts,
    ) -> Result<Deleted, ApiError> {
        let def = &RESOURCES[res];
        let name = key.1.clone();
        if let Some(uid) = opts.uid.as_deref() {
            let have = meta_str(&old.value, "uid");
            if uid != have {
                return Err(ApiError::conflict(
                    def,
                    &name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    ),
                ));
            }
        }
        if let Some(rv) = opts.resource_version.as_deref() {
            let have = old.rv.to_string();
            if rv != have {
                return Err(ApiError::conflict(
                    def,
                    &name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in meta: {have}"
                    ),
                ));
            }
        }
        if finalizers(&old.value).is_empty() {
            let last = old.value.clone();
            let obj = self.finish_delete(st, res, key, last, old);
            return Ok(Deleted { obj, gone: true });
        }
        if is_deleting(&old.value) {
            return Ok(Deleted {
                obj: old,
                gone: false,
            });
        }
        let mut obj = old.value.clone();
        let m = meta_mut(&mut obj);
        m.insert("deletionTimestamp".into(), json!(now()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        let obj = self.commit(st, res, key, obj, EventType::Modified, Some(old));
        Ok(Deleted { obj, gone: false })
    }

    /// DELETE on a collection: deletes every matching object.
    pub fn delete_collection(
        &self,
        res: usize,
        ns: Option<&str>,
        sel: &Selectors,
        opts: &DeleteOpts,
    ) -> Result<(u64, Vec<Arc<Stored>>), ApiError> {
        let mut st = self.state.lock();
        let mut out = Vec::new();
        for obj in Self::scan(&st, res, ns) {
            if !sel.matches(&obj.value) {
                continue;
            }
            let key = (
                meta_str(&obj.value, "namespace").to_string(),
                meta_str(&obj.value, "name").to_string(),
            );
            out.push(self.delete_locked(&mut st, res, key, obj, opts)?.obj);
        }
        Ok((st.rv, out))
    }
}

/// Fields the real validation lets change only from unset.
fn validate_update(
    def: &ResourceDef,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let rules: &[(&str, &str, &str)] = match def.plural {
        "nodes" => &[
            (
                "/spec/providerID",
                "spec.providerID",
                "Forbidden: node updates may not change providerID except from \"\" to valid",
            ),
            (
                "/spec/podCIDRs",
                "spec.podCIDRs",
                "Forbidden: node updates may not change podCIDR except from \"\" to valid",
            ),
        ],
        "services" => &[(
            "/spec/clusterIP",
            "spec.clusterIPs[0]",
            "Invalid value: may not change once set",
        )],
        _ => &[],
    };
    let set = |v: Option<&Value>| -> Option<Value> {
        v.filter(|v| !v.is_null() && *v != "" && v.as_array().is_none_or(|a| !a.is_empty()))
            .cloned()
    };
    let mut causes = Vec::new();
    for (pointer, field, message) in rules {
        let before = set(old.pointer(pointer));
        let after = set(new.pointer(pointer));
        // Services may drop clusterIP from a PUT: defaulting keeps the old one.
        let dropped_ok = def.plural == "services" && after.is_none();
        if before.is_some() && before != after && !dropped_ok {
            causes.push(Cause {
                reason: if message.starts_with("Forbidden") {
                    "FieldValueForbidden"
                } else {
                    "FieldValueInvalid"
                },
                message: message.to_string(),
                field: field.to_string(),
            });
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, causes))
    }
}

/// Name rules: a DNS subdomain for most resources.
fn validate_name(def: &ResourceDef, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        return Ok(());
    }
    Err(ApiError::invalid(
        def,
        name,
        vec![Cause {
            reason: "FieldValueInvalid",
            message: format!(
                "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
            ),
            field: "metadata.name".into(),
        }],
    ))
}

fn check_applied_identity(def: &ResourceDef, name: &str, body: &Value) -> Result<(), ApiError> {
    let api_version = body
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    if api_version != def.api_version() || kind != def.kind {
        return Err(ApiError::bad_request(format!(
            "the apiVersion and kind of the applied object ({api_version}, {kind}) do not match the resource ({}, {})",
            def.api_version(),
            def.kind
        )));
    }
    let body_name = meta_str(body, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

/// Defaults that list-map keys depend on, applied to an applied
/// configuration as the real server defaults it before merging: a service
/// port without a protocol is the TCP port.
fn default_applied(def: &ResourceDef, body: &mut Value) {
    if def.plural != "services" {
        return;
    }
    if let Some(ports) = body
        .pointer_mut("/spec/ports")
        .and_then(Value::as_array_mut)
    {
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
        }
    }
}

/// What the create strategies of the real resources reset or fill.
fn prepare_create(def: &ResourceDef, obj: &mut Value) {
    match def.plural {
        "services" => obj["status"] = json!({"loadBalancer": {}}),
        "pods" => obj["status"] = json!({"phase": "Pending"}),
        "namespaces" => {
            obj["status"] = json!({"phase": "Active"});
            if obj.pointer("/spec/finalizers").is_none() {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
            }
        }
        _ => {}
    }
}

const NODE_PORT_RANGE: std::ops::RangeInclusive<u64> = 30000..=32767;

/// The node ports of a service object (ports and health check port).
fn node_ports_of(v: &Value) -> Vec<u64> {
    let mut out: Vec<u64> = v
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
                .collect()
        })
        .unwrap_or_default();
    out.extend(
        v.pointer("/spec/healthCheckNodePort")
            .and_then(Value::as_u64),
    );
    out
}

/// The node ports one service write may use: free ones and its own.
struct PortView<'a> {
    index: &'a HashMap<u64, Key>,
    own: Key,
    taken: BTreeSet<u64>,
    cursor: u64,
}

impl PortView<'_> {
    fn contains(&self, n: &u64) -> bool {
        self.taken.contains(n) || self.index.get(n).is_some_and(|owner| *owner != self.own)
    }

    fn insert(&mut self, n: u64) {
        self.taken.insert(n);
    }

    /// The next free port after the cursor, wrapping around the range, as
    /// the real allocator hands out ports without reusing the lowest first.
    fn allocate(&mut self) -> Option<u64> {
        let (lo, hi) = (*NODE_PORT_RANGE.start(), *NODE_PORT_RANGE.end());
        let span = hi - lo + 1;
        for i in 0..span {
            let n = lo + (self.cursor - lo + i) % span;
            if !self.contains(&n) {
                self.cursor = if n == hi { lo } else { n + 1 };
                self.taken.insert(n);
                return Some(n);
            }
        }
        None
    }
}

/// Defaulting and allocation the real server does for services: type,
/// protocol, targetPort, cluster IP and node ports (the CCM builds load
/// balancer listeners from node ports, so they must exist).
fn defaults(
    st: &mut State,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    if def.plural == "configmaps" {
        return validate_config_map(def, obj);
    }
    if def.plural == "validatingwebhookconfigurations" {
        return super::admission::validate_configuration(def, obj);
    }
    if def.plural != "services" {
        return Ok(());
    }
    let name = meta_str(obj, "name").to_string();
    let ns = meta_str(obj, "namespace").to_string();
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let old_spec = old
        .and_then(|o| o.get("spec"))
        .cloned()
        .unwrap_or(json!({}));
    validate_source_ranges(def, &name, obj)?;
    validate_conditions(def, &name, obj)?;
    let mut used = PortView {
        index: &st.node_ports,
        own: (ns.clone(), name.clone()),
        taken: BTreeSet::new(),
        cursor: st.next_node_port,
    };
    let spec = &mut obj["spec"];
    let ty = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_string();
    spec["type"] = json!(ty);
    if spec.get("sessionAffinity").is_none() {
        spec["sessionAffinity"] = json!("None");
    }
    if ty == "ExternalName" {
        return Ok(());
    }
    let wants_node_ports = ty == "NodePort"
        || (ty == "LoadBalancer"
            && spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false));
    if ty == "LoadBalancer" && spec.get("allocateLoadBalancerNodePorts").is_none() {
        spec["allocateLoadBalancerNodePorts"] = json!(true);
    }
    let old_ports: Vec<Value> = old_spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut errors = Vec::new();
    // As the real apiserver: one Service may give the same node port to
    // ports of different protocols (DNS on TCP and UDP), never twice to one
    // protocol; across Services a node port is taken for every protocol.
    let mut in_this_service: Vec<(u64, Value)> = Vec::new();
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for (i, p) in ports.iter_mut().enumerate() {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none()
                && let Some(port) = p.get("port").cloned()
            {
                p["targetPort"] = port;
            }
            if !wants_node_ports {
                if ty == "ClusterIP"
                    && let Some(m) = p.as_object_mut()
                {
                    m.remove("nodePort");
                }
                continue;
            }
            match p
                .get("nodePort")
                .and_then(Value::as_u64)
                .filter(|n| *n != 0)
            {
                Some(n) => {
                    let protocol = p.get("protocol").cloned().unwrap_or(Value::Null);
                    let was_ours = old_ports
                        .iter()
                        .any(|o| o.get("nodePort").and_then(Value::as_u64) == Some(n));
                    let shared_here = in_this_service.iter().any(|(m, _)| *m == n);
                    let duplicate = in_this_service
                        .iter()
                        .any(|(m, proto)| *m == n && *proto == protocol);
                    in_this_service.push((n, protocol));
                    if duplicate {
                        errors.push(Cause {
                            reason: "FieldValueDuplicate",
                            message: format!("Duplicate value: {n}"),
                            field: format!("spec.ports[{i}].nodePort"),
                        });
                    } else if !was_ours && !shared_here && used.contains(&n) {
                        errors.push(Cause {
                            reason: "FieldValueInvalid",
                            message: format!(
                                "Invalid value: {n}: provided port is already allocated"
                            ),
                            field: format!("spec.ports[{i}].nodePort"),
                        });
                    }
                    used.insert(n);
                }
                None => {
                    let same = old_ports.iter().find(|o| {
                        o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol")
                    });
                    let n = same
                        .and_then(|o| o.get("nodePort").and_then(Value::as_u64))
                        .or_else(|| used.allocate());
                    if let Some(n) = n {
                        used.insert(n);
                        p["nodePort"] = json!(n);
                    }
                }
            }
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::invalid(def, &name, errors));
    }
    if ty == "NodePort" || ty == "LoadBalancer" {
        if spec.get("externalTrafficPolicy").is_none() {
            spec["externalTrafficPolicy"] = json!("Cluster");
        }
        let local = spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local");
        if ty == "LoadBalancer" && local && spec.get("healthCheckNodePort").is_none() {
            let n = old_spec
                .get("healthCheckNodePort")
                .and_then(Value::as_u64)
                .or_else(|| used.allocate());
            if let Some(n) = n {
                spec["healthCheckNodePort"] = json!(n);
            }
        }
    } else if let Some(m) = spec.as_object_mut() {
        m.remove("externalTrafficPolicy");
        m.remove("healthCheckNodePort");
    }
    st.next_node_port = used.cursor;
    if spec.get("internalTrafficPolicy").is_none() {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    if spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        let ip = match old_spec.get("clusterIP").and_then(Value::as_str) {
            Some(ip) if !ip.is_empty() => ip.to_string(),
            _ => {
                let n = st.next_cluster_ip;
                st.next_cluster_ip += 1;
                // 10.96.0.0/12, the default service CIDR.
                format!("10.{}.{}.{}", 96 + (n >> 16), (n >> 8) & 0xff, n & 0xff)
            }
        };
        spec["clusterIP"] = json!(ip);
    }
    if spec.get("clusterIPs").is_none()
        && let Some(ip) = spec.get("clusterIP").cloned()
    {
        spec["clusterIPs"] = json!([ip]);
    }
    if spec.get("clusterIP").and_then(Value::as_str) != Some("None") {
        if spec.get("ipFamilies").is_none() {
            spec["ipFamilies"] = json!(["IPv4"]);
        }
        if spec.get("ipFamilyPolicy").is_none() {
            spec["ipFamilyPolicy"] = json!("SingleStack");
        }
    }
    Ok(())
}

/// The most a ConfigMap's `data` and `binaryData` may hold together
/// (kube-apiserver's `MaxSecretSize`, which ConfigMaps share).
const MAX_CONFIG_MAP_BYTES: usize = 1024 * 1024;

/// kube-apiserver's `ValidateConfigMap`: every key is a config key
/// (`[-._a-zA-Z0-9]+`, at most 253 characters, not `.` or `..`), and keys
/// and values together fit in 1 MiB.
fn validate_config_map(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    let name = meta_str(obj, "name").to_string();
    let mut causes = Vec::new();
    let mut total = 0;
    for field in ["data", "binaryData"] {
        let Some(map) = obj.get(field).and_then(Value::as_object) else {
            continue;
        };
        for (k, v) in map {
            total += k.len() + v.as_str().map_or(0, str::len);
            let valid = !k.is_empty()
                && k.len() <= 253
                && k != "."
                && k != ".."
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
            if !valid {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    message: format!(
                        "Invalid value: {k:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
                    ),
                    field: format!("{field}[{k}]"),
                });
            }
        }
    }
    if total > MAX_CONFIG_MAP_BYTES {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: must have at most {MAX_CONFIG_MAP_BYTES} bytes"),
            field: "[]".into(),
        });
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, &name, causes))
    }
}

/// apimachinery's `ValidateConditions` on a Service's `status.conditions`
/// (metav1.Condition): one of each type, a status of True, False or
/// Unknown, a transition time, a reason of at most 1,024 bytes in its
/// CamelCase form, and a message of at most 32,768 bytes (bytes, as Go's
/// `len`, not characters).
fn validate_conditions(def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
    const MAX_REASON: usize = 1024;
    const MAX_MESSAGE: usize = 32 * 1024;
    let Some(conditions) = obj.pointer("/status/conditions").and_then(Value::as_array) else {
        return Ok(());
    };
    let reason_ok = |r: &str| {
        let inner = |c: char| c.is_ascii_alphanumeric() || "_,:".contains(c);
        r.starts_with(|c: char| c.is_ascii_alphabetic())
            && r.chars().all(inner)
            && r.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut causes = Vec::new();
    let mut types = BTreeSet::new();
    for (i, c) in conditions.iter().enumerate() {
        let field = |f: &str| format!("status.conditions[{i}].{f}");
        let text = |f: &str| c.get(f).and_then(Value::as_str).unwrap_or_default();
        let mut cause = |reason: &'static str, f: &str, message: String| {
            causes.push(Cause {
                reason,
                message,
                field: field(f),
            })
        };
        if !types.insert(text("type").to_string()) {
            cause(
                "FieldValueDuplicate",
                "type",
                format!("Duplicate value: {:?}", text("type")),
            );
        }
        if !matches!(text("status"), "True" | "False" | "Unknown") {
            let message = format!(
                "Unsupported value: {:?}: supported values: \"False\", \"True\", \"Unknown\"",
                text("status")
            );
            cause("FieldValueNotSupported", "status", message);
        }
        if text("lastTransitionTime").is_empty() {
            cause(
                "FieldValueRequired",
                "lastTransitionTime",
                "Required value: must be set".into(),
            );
        }
        let reason = text("reason");
        if reason.is_empty() {
            cause(
                "FieldValueRequired",
                "reason",
                "Required value: must be set".into(),
            );
        } else if !reason_ok(reason) || reason.len() > MAX_REASON {
            cause(
                "FieldValueInvalid",
                "reason",
                format!("Invalid value: {reason:?}"),
            );
        }
        if text("message").len() > MAX_MESSAGE {
            let message = format!("Too long: may not be more than {MAX_MESSAGE} bytes");
            cause("FieldValueTooLong", "message", message);
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, causes))
    }
}

/// kube-apiserver's `ValidateService` on `spec.loadBalancerSourceRanges`
/// (its field path keeps the historical capital L) and, when that is
/// empty, on the `service.beta.kubernetes.io/load-balancer-source-ranges`
/// annotation: only `type: LoadBalancer` may have them, and each entry
/// (space-padded allowed) must be a CIDR.
fn validate_source_ranges(def: &ResourceDef, name: &str, obj: &Value) -> Result<(), ApiError> {
    const ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
    let is_lb = obj.pointer("/spec/type").and_then(Value::as_str) == Some("LoadBalancer");
    let ranges: Vec<String> = obj
        .pointer("/spec/loadBalancerSourceRanges")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default();
    let forbidden = "Forbidden: may only be used when `type` is 'LoadBalancer'".to_string();
    let mut causes = Vec::new();
    if !ranges.is_empty() {
        let field = "spec.LoadBalancerSourceRanges";
        if !is_lb {
            causes.push(Cause {
                reason: "FieldValueForbidden",
                message: forbidden,
                field: field.into(),
            });
        }
        for (i, r) in ranges.iter().enumerate() {
            let r = r.trim();
            if !is_cidr(r) {
                causes.push(Cause {
                    reason: "FieldValueInvalid",
                    message: format!(
                        "Invalid value: {r:?}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
                    ),
                    field: format!("{field}[{i}]"),
                });
            }
        }
    } else if let Some(val) = obj
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ANNOTATION))
        .and_then(Value::as_str)
    {
        let field = format!("metadata.annotations[{ANNOTATION}]");
        if !is_lb {
            causes.push(Cause {
                reason: "FieldValueForbidden",
                message: forbidden,
                field: field.clone(),
            });
        }
        let val = val.trim();
        if !val.is_empty() {
            for r in val.split(',').map(str::trim) {
                if !is_cidr(r) {
                    causes.push(Cause {
                        reason: "FieldValueInvalid",
                        message: format!(
                            "Invalid value: {r:?}: must be a list of IP ranges. For example, 10.240.0.0/24,10.250.0.0/24 "
                        ),
                        field: field.clone(),
                    });
                }
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(def, name, causes))
    }
}

/// An IP address and a prefix length within its family's width.
fn is_cidr(s: &str) -> bool {
    let Some((ip, len)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    !len.is_empty()
        && len.chars().all(|c| c.is_ascii_digit())
        && len.parse::<u32>().is_ok_and(|l| l <= max)
}

fn page(
    rv: u64,
    items: &[Arc<Stored>],
    offset: usize,
    limit: Option<usize>,
    id: u64,
    unfiltered: bool,
) -> ListPage {
    let start = offset.min(items.len());
    let end = limit.map_or(items.len(), |l| (start + l).min(items.len()));
    let rest = (items.len() - end) as u64;
    ListPage {
        rv,
        items: items[start..end].to_vec(),
        continue_token: (rest > 0).then(|| encode_continue(id, rv, end)),
        // The real server only knows the remaining count without selectors.
        remaining: (rest > 0 && unfiltered).then_some(rest),
    }
}

fn encode_continue(id: u64, rv: u64, offset: usize) -> String {
    hex::encode(format!(
        "{{\"v\":\"kts/1\",\"id\":{id},\"rv\":{rv},\"start\":{offset}}}"
    ))
}

fn decode_continue(token: &str) -> Result<(u64, usize), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    let raw = hex::decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let id = v.get("id").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v.get("start").and_then(Value::as_u64).ok_or_else(bad)?;
    Ok((id, start as usize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::find;

    fn store_with_ns() -> Store {
        let s = Store::new(100, Duration::ZERO);
        let w = Writer {
            manager: "test".into(),
            ..Default::default()
        };
        let _ = s.create(
            NAMESPACES,
            "",
            json!({"metadata": {"name": "default"}}),
            &w,
            false,
        );
        s
    }

    /// The field manager every test writes as.
    fn writer() -> Writer {
        Writer {
            manager: "t".into(),
            ..Default::default()
        }
    }

    fn idx(plural: &str) -> usize {
        find("", "v1", plural).unwrap_or(0)
    }

    #[test]
    fn apiserver_store_exact_list_rebuilds_history() {
        let s = store_with_ns();
        let w = writer();
        let cm = idx("configmaps");
        let a = s.create(
            cm,
            "default",
            json!({"metadata": {"name": "a"}, "data": {"x": "1"}}),
            &w,
            false,
        );
        let rv_a = a.map(|o| o.rv).unwrap_or_default();
        let _ = s.update(
            cm,
            "default",
            "a",
            json!({"metadata": {"name": "a"}, "data": {"x": "2"}}),
            None,
            &w,
        );
        let _ = s.create(cm, "default", json!({"metadata": {"name": "b"}}), &w, false);
        let opts = ListOpts {
            resource_version: Some(rv_a.to_string()),
            rv_match: Some("Exact".into()),
            ..Default::default()
        };
        let page = s.list(cm, Some("default"), &Selectors::default(), &opts);
        let page = page.map_err(|e| e.message);
        let items: Vec<Value> = page
            .map(|p| p.items.iter().map(|o| o.value["data"].clone()).collect())
            .unwrap_or_default();
        assert_eq!(items, vec![json!({"x": "1"})]);
        s.compact();
        let gone = s
            .list(cm, None, &Selectors::default(), &opts)
            .err()
            .map(|e| e.code);
        assert_eq!(gone, Some(410));
    }

    #[test]
    fn apiserver_store_service_defaults() {
        let s = store_with_ns();
        let w = writer();
        let svc = idx("services");
        let created = s.create(
            svc,
            "default",
            json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}}),
            &w,
            false,
        );
        let v = created.map(|o| o.value.clone()).unwrap_or_default();
        assert_eq!(v["spec"]["ports"][0]["nodePort"], 30000);
        assert_eq!(v["spec"]["ports"][0]["protocol"], "TCP");
        assert_eq!(v["spec"]["ports"][0]["targetPort"], 80);
        assert_eq!(v["spec"]["healthCheckNodePort"], 30001);
        assert_eq!(v["spec"]["clusterIP"], "10.96.0.10");
        assert_eq!(v["status"], json!({"loadBalancer": {}}));
        // An update without node ports keeps the allocated ones.
        let updated = s.update(
            svc,
            "default",
            "lb",
            json!({"metadata": {"name": "lb"}, "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}}),
            None,
            &w,
        );
        let v = updated.map(|(o, _)| o.value.clone()).unwrap_or_default();
        assert_eq!(v["spec"]["ports"][0]["nodePort"], 30000);
        assert_eq!(v["spec"]["clusterIP"], "10.96.0.10");
    }

    #[test]
    fn apiserver_store_service_conditions_validated_in_bytes() {
        let s = store_with_ns();
        let w = writer();
        let svc = idx("services");
        let spec = json!({"type": "LoadBalancer", "ports": [{"port": 80}]});
        let created = s.create(
            svc,
            "default",
            json!({"metadata": {"name": "lb"}, "spec": spec}),
            &w,
            false,
        );
        assert!(created.is_ok());
        let with = |message: String, reason: &str| {
            let condition = json!({"type": "LoadBalancerSynced", "status": "False", "reason": reason,
                "message": message, "lastTransitionTime": "2026-01-01T00:00:00Z"});
            let body = json!({"metadata": {"name": "lb"}, "spec": spec, "status": {"conditions": [condition]}});
            s.update(svc, "default", "lb", body, Some("status"), &w)
                .map(|_| ())
                .map_err(|e| (e.code, e.message))
        };
        assert_eq!(with("é".repeat(16 * 1024), "RefusedValue"), Ok(()));
        // 16,385 characters, 32,770 bytes: Go's len counts bytes.
        let (code, message) = with("é".repeat(16 * 1024 + 1), "RefusedValue").unwrap_err();
        assert_eq!(code, 422);
        assert!(
            message.contains("status.conditions[0].message: Too long"),
            "{message}"
        );
        let (code, message) = with("a".into(), "Refused value").unwrap_err();
        assert_eq!(code, 422);
        assert!(message.contains("status.conditions[0].reason"), "{message}");
    }

    #[test]
    fn apiserver_store_node_ports_per_protocol() {
        let s = store_with_ns();
        let w = writer();
        let svc = idx("services");
        let dns = |name: &str, udp_port: u64| {
            json!({"metadata": {"name": name}, "spec": {"type": "NodePort", "ports": [
                {"name": "tcp", "port": 53, "protocol": "TCP", "nodePort": 30053},
                {"name": "udp", "port": 53, "protocol": "UDP", "nodePort": udp_port}]}})
        };
        // One Service: the same node port for TCP and UDP is fine.
        let ok = s.create(svc, "default", dns("dns", 30053), &w, false);
        assert!(ok.is_ok(), "{:?}", ok.err().map(|e| e.message));
        // Twice for one protocol in one Service: a duplicate.
        let twice = json!({"metadata": {"name": "twice"}, "spec": {"type": "NodePort", "ports": [
            {"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30080}]}});
        let err = s
            .create(svc, "default", twice, &w, false)
            .err()
            .map(|e| e.code);
        assert_eq!(err, Some(422));
        // Another Service cannot take it, whatever the protocol.
        let taken = s.create(svc, "default", dns("other", 30054), &w, false);
        assert_eq!(taken.err().map(|e| e.code), Some(422));
    }

    #[test]
    fn apiserver_store_validates_source_ranges_as_kube_apiserver() {
        let s = store_with_ns();
        let w = writer();
        let svc = idx("services");
        let make = |name: &str, ty: &str, ranges: Value| json!({"metadata": {"name": name}, "spec": {"type": ty, "ports": [{"port": 80}], "loadBalancerSourceRanges": ranges}});
        let ok = s.create(
            svc,
            "default",
            make(
                "ok",
                "LoadBalancer",
                json!([" 10.0.0.0/8", "2001:db8::/64"]),
            ),
            &w,
            false,
        );
        assert!(ok.is_ok(), "{:?}", ok.err().map(|e| e.message));
        let bad = s
            .create(
                svc,
                "default",
                make("bad", "LoadBalancer", json!(["10.0.0.0/8", "nope"])),
                &w,
                false,
            )
            .err()
            .map(|e| (e.code, e.message));
        assert_eq!(
            bad,
            Some((422, "Service \"bad\" is invalid: spec.LoadBalancerSourceRanges[1]: Invalid value: \"nope\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)".into()))
        );
        let not_lb = s
            .create(
                svc,
                "default",
                make("np", "NodePort", json!(["10.0.0.0/8"])),
                &w,
                false,
            )
            .err()
            .map(|e| e.message);
        assert_eq!(
            not_lb.as_deref(),
            Some(
                "Service \"np\" is invalid: spec.LoadBalancerSourceRanges: Forbidden: may only be used when `type` is 'LoadBalancer'"
            )
        );
    }

    #[test]
    fn apiserver_store_continue_tokens_round_trip() {
        let t = encode_continue(7, 42, 500);
        assert_eq!(decode_continue(&t).ok(), Some((7, 500)));
        assert_eq!(decode_continue("zz").err().map(|e| e.code), Some(400));
    }

    /// ConfigMaps are validated as kube-apiserver's `ValidateConfigMap`
    /// does: config keys only, and 1 MiB in all, on create and on update.
    #[test]
    fn config_maps_take_config_keys_and_at_most_one_mebibyte() {
        let s = store_with_ns();
        let w = writer();
        let cm = idx("configmaps");
        let make = |name: &str, data: Value| json!({"metadata": {"name": name}, "data": data});
        let ok = s.create(
            cm,
            "default",
            make("ok", json!({"k8s-web-80.0123abcd": "v1 0a1b"})),
            &w,
            false,
        );
        assert!(ok.is_ok(), "{ok:?}");
        for bad in ["arn:aws:x/y", "", "..", "has space"] {
            let e = s.create(cm, "default", make("bad", json!({bad: "v"})), &w, false);
            let e = e.err().map(|e| (e.code, e.message));
            assert!(
                e.as_ref()
                    .is_some_and(|(c, m)| *c == 422 && m.contains("a valid config key")),
                "{bad:?}: {e:?}"
            );
        }
        let big = "x".repeat(MAX_CONFIG_MAP_BYTES);
        let e = s.create(cm, "default", make("big", json!({"k": big})), &w, false);
        assert_eq!(e.err().map(|e| e.code), Some(422));
        let e = s.update(
            cm,
            "default",
            "ok",
            make("ok", json!({"a/b": "v"})),
            None,
            &w,
        );
        assert_eq!(
            e.err().map(|e| e.code),
            Some(422),
            "an update is validated too"
        );
    }
}
