//! The load-balancer sweep: what the cluster's load balancers look like, in
//! a few paginated reads shared by every sync, as the instance sweep is for
//! instances.
//!
//! One sweep reads every classic ELB and every NLB (`DescribeLoadBalancers`,
//! 400 per page each), the tags of those named like this CCM's (`a` + 31
//! hex digits; `DescribeTags`, 20 per call) and every target group (400 per
//! page) with the tags of those behind a swept NLB. It is single-flight
//! (concurrent syncs share one) and reused for [`sweep_ttl`]: the service
//! resync period, at most [`MAX_SWEEP_TTL`] (no resync: the maximum; every
//! sync reads in full, as `aws-ccm plan` does: [`SWEEP_TTL`]). So a sweep is
//! read at most once per TTL however many syncs ask, and every Service's
//! resync still sees its load balancer as it was after the Service's
//! previous resync: the sweep it reads started at most one period (or
//! [`SWEEP_TTL`], when the period is shorter) ago. A
//! write invalidates exactly the load balancer it touched: until a sweep
//! that started after the write, that load balancer is read on its own.
//!
//! What a sweep cannot show (a classic ELB's attributes; an NLB's attributes,
//! listeners and target group attributes) is read per load balancer only
//! when it is not known. It is known when the load balancer's
//! [`tags::APPLIED_SETTINGS_TAG`] (written in the create call) or this
//! process's last sync of it says the settings are those the Service asks
//! for now. A known load balancer is still read in full once per
//! `--service-resync-period`, at a fixed offset per Service (the service
//! controller's resync slots, [`resync_slot`]), so drift repair is spread
//! over the period rather than done in a burst. A load balancer without the
//! tag (made by the Go CCM), or whose settings the Service changed since it
//! was created, is read in full at its first sync in each process.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2::types as t;
use futures::FutureExt;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::sweep_tags::TagCache;
use crate::aws::applied;
use crate::aws::client::coalesce::SingleFlight;
use crate::aws::client::operations::Operation;
use crate::aws::tags::Tags;
use crate::aws::{AwsClient, AwsError, elb, nlb, tags};
use crate::provider::load_balancers::resync_slot;

/// How long one sweep serves syncs that read every load balancer in full.
const SWEEP_TTL: Duration = Duration::from_secs(30);

/// The longest one sweep serves syncs that trust known settings.
const MAX_SWEEP_TTL: Duration = Duration::from_secs(300);

/// How long one sweep serves syncs with `trust_for` (see [`LbSweep::new`]):
/// the resync period, at most [`MAX_SWEEP_TTL`], and never less than
/// [`SWEEP_TTL`].
pub(crate) fn sweep_ttl(trust_for: Option<Option<Duration>>) -> Duration {
    match trust_for {
        None => SWEEP_TTL,
        Some(None) => MAX_SWEEP_TTL,
        Some(Some(period)) => period.clamp(SWEEP_TTL, MAX_SWEEP_TTL),
    }
}

/// Tags as a tag read answers them, by resource name or ARN.
type TagsByKey = BTreeMap<String, BTreeMap<String, String>>;

/// A target group from the listing, with its tags.
pub(crate) type SweptGroup = (t::TargetGroup, Tags);

/// An NLB as the sweep (or its own describe) shows it, with its target
/// groups.
type SweptNlb = (nlb::ActualLb, Vec<SweptGroup>);

/// One sweep's result.
struct Snapshot {
    /// When its first read was sent: a write after this is not in it.
    started: Instant,
    /// Classic ELBs named like this CCM's, with tags; attributes at the API
    /// defaults (not read).
    clbs: BTreeMap<String, elb::ActualLb>,
    /// NLBs named like this CCM's, with tags; no attributes or listeners.
    nlbs: BTreeMap<String, nlb::ActualLb>,
    /// Target groups by the ARN of each swept NLB they are behind.
    groups: BTreeMap<String, Vec<SweptGroup>>,
}

/// What this process last established about one load balancer's settings.
#[derive(Clone, Debug)]
struct Verified {
    /// The settings digest AWS matches.
    digest: String,
    /// When it was last read in full (or first vouched for by its tag).
    at: Instant,
}

/// The shared sweep, its invalidations and what is known of each load
/// balancer's settings. Clones share all of it.
#[derive(Clone)]
pub(crate) struct LbSweep {
    flight: SingleFlight<Arc<Snapshot>>,
    touched: Arc<Mutex<HashMap<String, Instant>>>,
    verified: Arc<Mutex<HashMap<String, Verified>>>,
    /// Tags earlier sweeps read (see [`super::sweep_tags`]).
    tags: Arc<Mutex<TagCache>>,
    /// When each target group's targets were last read, or first vouched
    /// for by the target record.
    targets_read: Arc<Mutex<HashMap<String, Instant>>>,
    /// `Some(period)`: settings are trusted when known and read in full again
    /// once per period. `None`: always read in full (`aws-ccm plan`).
    trust_for: Option<Option<Duration>>,
}

/// Targets the target record vouches for are read (to repair a hand edit)
/// once every this many resync periods: at the default hour, 125
/// `DescribeTargetHealth` an hour for 500 groups instead of 500. The Go CCM
/// reads them only when a Service or the node set changes.
const TARGET_REPAIR_PERIODS: u32 = 4;

/// With no resync period, tags are still read again within this long.
const TAG_PERIOD_WITHOUT_RESYNC: Duration = Duration::from_secs(3600);

/// Whether `name` is a load balancer name this CCM (and the Go CCM) gives:
/// `a` and 31 lower-case hex digits.
fn is_service_lb_name(name: &str) -> bool {
    name.len() == 32
        && name.starts_with('a')
        && name[1..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// The value of [`tags::APPLIED_SETTINGS_TAG`] for settings `parts`.
fn settings_value<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    format!("v1 {}", applied::digest(parts))
}

/// A classic ELB's settings that only a per-load-balancer read shows.
fn clb_settings(desired: &elb::Desired) -> String {
    settings_value([format!("{:?}", desired.attributes).as_str()])
}

/// An NLB's settings that only per-load-balancer reads show.
pub(crate) fn nlb_settings(desired: &nlb::Desired) -> String {
    let parts = [
        format!("{:?}", desired.attributes),
        format!("{:?}", desired.listeners),
        format!("{:?}", desired.target_group_attributes),
    ];
    // Only where the Service sets one: other NLBs' digests are as before.
    let alpn = desired.alpn.as_ref().and_then(|a| a.want.as_ref());
    let alpn = alpn.map(|p| format!("alpn {p}"));
    let listener_attributes = (desired.listener_attributes.as_ref())
        .filter(|a| !a.want.is_empty())
        .map(|a| format!("listener attributes {:?}", a.want));
    let more = alpn.iter().chain(&listener_attributes);
    settings_value(parts.iter().chain(more).map(String::as_str))
}

impl LbSweep {
    /// `trust_for`: `Some(resync period)` to trust known settings (the
    /// controllers); `None` to read every load balancer in full.
    pub(crate) fn new(trust_for: Option<Option<Duration>>) -> LbSweep {
        LbSweep {
            flight: SingleFlight::new(Operation::ElbDescribeLoadBalancers, sweep_ttl(trust_for)),
            touched: Arc::default(),
            verified: Arc::default(),
            tags: Arc::default(),
            targets_read: Arc::default(),
            trust_for,
        }
    }

    /// `Some(resync period)` when known settings are trusted (the
    /// controllers); `None` when every sync reads in full.
    pub(crate) fn resync_period(&self) -> Option<Option<Duration>> {
        self.trust_for
    }

    /// The current sweep, shared with every concurrent caller.
    async fn snapshot(&self, aws: &AwsClient) -> Result<Arc<Snapshot>, AwsError> {
        let reader = aws.clone();
        let sweep = self.clone();
        let snap = self
            .flight
            .get(move || async move { read_all(&reader, &sweep).await.map(Arc::new) }.boxed())
            .await?;
        // Writes older than the sweep are in it.
        self.touched.lock().retain(|_, at| *at >= snap.started);
        Ok(snap)
    }

    /// The sweep's entry list if it may answer for `name` (no write touched
    /// it since the sweep started). A sweep IAM refuses (a policy that
    /// grants describes only by name) answers for nothing: each load
    /// balancer is then described on its own, as before the sweep.
    async fn fresh_for(
        &self,
        aws: &AwsClient,
        name: &str,
    ) -> Result<Option<Arc<Snapshot>>, AwsError> {
        let snap = match self.snapshot(aws).await {
            Ok(snap) => snap,
            Err(e) if e.is_denied() => {
                tracing::debug!(error = %e, "the load-balancer sweep is refused; describing by name");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let touched = self.touched.lock().get(name).copied();
        Ok(touched.is_none_or(|at| at < snap.started).then_some(snap))
    }

    /// Classic ELB `name` with its tags (attributes not read), or `None`.
    /// From the sweep when it holds a fresh entry; otherwise described on
    /// its own (it may be newer than the sweep).
    pub(crate) async fn clb(
        &self,
        aws: &AwsClient,
        name: &str,
    ) -> Result<Option<elb::ActualLb>, AwsError> {
        let snap = self.fresh_for(aws, name).await?;
        if let Some(lb) = snap.as_ref().and_then(|s| s.clbs.get(name)) {
            return Ok(Some(lb.clone()));
        }
        elb::io::describe(aws, name).await
    }

    /// NLB `name` with its tags (attributes and listeners not read) and its
    /// target groups, or `None`; as [`Self::clb`].
    pub(crate) async fn nlb(
        &self,
        aws: &AwsClient,
        name: &str,
    ) -> Result<Option<SweptNlb>, AwsError> {
        let snap = self.fresh_for(aws, name).await?;
        if let Some(snap) = snap
            && let Some(lb) = snap.nlbs.get(name)
        {
            let groups = snap.groups.get(&lb.arn).cloned().unwrap_or_default();
            return Ok(Some((lb.clone(), groups)));
        }
        let Some(lb) = nlb::read::describe(aws, name).await? else {
            return Ok(None);
        };
        let groups = nlb::read::listed_target_groups(aws, &lb.arn).await?;
        Ok(Some((lb, groups)))
    }

    /// Of `groups`, those an NLB of this CCM's names other than `except`
    /// carries. The answer decides a revoke (a rule another NLB relies on
    /// must stay), so it comes from a sweep that started after every write
    /// this process made to another load balancer: a sweep started before
    /// an NLB was created, or given another group, does not show it
    /// carrying that group. The cached sweep serves when no such write
    /// came since it started; otherwise one new sweep is read (shared, and
    /// the cache for every later sync). A sweep IAM refuses answers "all of
    /// them" (nothing is then revoked on its word).
    pub(crate) async fn carried_by_other_nlbs(
        &self,
        aws: &AwsClient,
        groups: &BTreeSet<String>,
        except: &str,
    ) -> Result<BTreeSet<String>, AwsError> {
        let mut snap = self.snapshot(aws).await;
        // `snapshot` kept only the writes since its sweep started.
        if snap.is_ok() && self.touched.lock().keys().any(|name| name != except) {
            self.flight.invalidate();
            snap = self.snapshot(aws).await;
        }
        let snap = match snap {
            Ok(snap) => snap,
            Err(e) if e.is_denied() => return Ok(groups.clone()),
            Err(e) => return Err(e),
        };
        Ok(snap
            .nlbs
            .iter()
            .filter(|(name, _)| name.as_str() != except)
            .flat_map(|(_, lb)| lb.security_groups.iter())
            .filter(|g| groups.contains(*g))
            .cloned()
            .collect())
    }

    /// Whether load balancer `name` (of the Service with UID `uid`, tags
    /// `lb_tags`) must be read in full for settings `want`: unless they are
    /// known (its settings tag, or this process's last sync, says so) and
    /// its resync slot has not moved on since it was last read in full.
    pub(crate) fn must_read(
        &self,
        name: &str,
        uid: &str,
        lb_tags: &BTreeMap<String, String>,
        want: &str,
    ) -> bool {
        let Some(period) = self.trust_for else {
            return true;
        };
        let now = Instant::now();
        let mut verified = self.verified.lock();
        let entry = match verified.get(name) {
            Some(v) => v.clone(),
            None if lb_tags.get(tags::APPLIED_SETTINGS_TAG).map(String::as_str) == Some(want) => {
                let v = Verified {
                    digest: want.to_string(),
                    at: now,
                };
                verified.insert(name.to_string(), v.clone());
                v
            }
            None => return true,
        };
        let slot_moved =
            period.is_some_and(|p| resync_slot(uid, p, now) > resync_slot(uid, p, entry.at));
        entry.digest != want || slot_moved
    }

    /// Whether target group `arn` (of the Service with UID `uid`), whose
    /// targets the target record vouches for, must have them read anyway:
    /// once every [`TARGET_REPAIR_PERIODS`] resync periods, at a slot of its
    /// own, to repair targets moved by hand. Always without a resync period
    /// to trust for (`aws-ccm plan`); never with none (no resync).
    fn targets_due(&self, arn: &str, uid: &str) -> bool {
        let period = match self.trust_for {
            None => return true,
            Some(None) => return false,
            Some(Some(period)) => period,
        };
        let now = Instant::now();
        let at = *self
            .targets_read
            .lock()
            .entry(arn.to_string())
            .or_insert(now);
        let repair = period * TARGET_REPAIR_PERIODS;
        resync_slot(uid, repair, now) > resync_slot(uid, repair, at)
    }

    /// Target group `arn`'s targets were read from AWS.
    fn targets_read(&self, arn: &str) {
        self.targets_read
            .lock()
            .insert(arn.to_string(), Instant::now());
    }

    /// A sync of `name` succeeded: AWS has settings `digest`; `in_full`:
    /// they were read rather than trusted. `changed`: the sync wrote.
    pub(crate) fn synced(&self, name: &str, digest: &str, in_full: bool, changed: bool) {
        let now = Instant::now();
        if changed {
            self.touch(name);
        }
        let mut verified = self.verified.lock();
        let at = match verified.get(name) {
            Some(v) if !in_full => v.at,
            _ => now,
        };
        verified.insert(
            name.to_string(),
            Verified {
                digest: digest.to_string(),
                at,
            },
        );
    }

    /// A sync of `name` failed or deleted it: what AWS has is unknown until
    /// read again.
    pub(crate) fn forget(&self, name: &str) {
        self.touch(name);
        self.verified.lock().remove(name);
    }

    /// A write touched `name`: sweeps that started before it no longer
    /// answer for it.
    pub(crate) fn touch(&self, name: &str) {
        self.touched.lock().insert(name.to_string(), Instant::now());
        self.tags.lock().evict(name);
    }

    /// Tags of `keys` (each with the load balancer whose writes change
    /// them): reused from earlier sweeps while fresh, the rest read with
    /// `read` and kept, unless a write touched their load balancer since
    /// `started` (the read may predate it).
    async fn tags_of(
        &self,
        keys: Vec<(String, String)>,
        started: Instant,
        read: impl AsyncFnOnce(Vec<String>) -> Result<TagsByKey, AwsError>,
    ) -> Result<HashMap<String, Tags>, AwsError> {
        // How long tags a sweep read may serve later sweeps: `None` (every
        // sync reads in full) not at all.
        let period = self
            .trust_for
            .map(|p| p.unwrap_or(TAG_PERIOD_WITHOUT_RESYNC));
        let now = Instant::now();
        let mut out = HashMap::with_capacity(keys.len());
        let mut missing = Vec::new();
        {
            let cache = self.tags.lock();
            for (key, owner) in keys {
                if let Some(tags) = cache.fresh(&key, period, now) {
                    out.insert(key, tags);
                } else {
                    missing.push((key, owner));
                }
            }
        }
        let read_keys: Vec<String> = missing.iter().map(|(k, _)| k.clone()).collect();
        let mut read_tags = if read_keys.is_empty() {
            BTreeMap::new()
        } else {
            read(read_keys).await?
        };
        let touched = self.touched.lock();
        let mut cache = self.tags.lock();
        for (key, owner) in missing {
            let tags = Tags::new(read_tags.remove(&key).unwrap_or_default());
            if period.is_some() && touched.get(&owner).is_none_or(|at| *at < started) {
                cache.store(key.clone(), &owner, tags.clone(), now);
            }
            out.insert(key, tags);
        }
        Ok(out)
    }
}

impl super::AwsLoadBalancers {
    /// NLB `name` (of the Service with UID `uid`) and its target groups for
    /// a plan: settings `want` read in full, or taken as asked for when
    /// known. The third value says which.
    pub(super) async fn nlb_actual(
        &self,
        name: &str,
        uid: &str,
        desired: &nlb::Desired,
        want: &str,
    ) -> Result<(Option<nlb::ActualLb>, Vec<nlb::ActualTargetGroup>, bool), AwsError> {
        let aws = &self.aws;
        let Some((mut lb, groups)) = self.memory().sweep().nlb(aws, name).await? else {
            return Ok((None, Vec::new(), true));
        };
        let arn_of = |tg: &str| {
            groups
                .iter()
                .find(|(g, _)| g.target_group_name() == Some(tg))
                .and_then(|(g, _)| g.target_group_arn())
                .map(str::to_string)
        };
        // A listener is known only with the group it forwards to.
        let all_present = desired
            .target_groups
            .iter()
            .all(|tg| arn_of(&tg.name).is_some());
        let (tags_follow, tags_change) = tags_follow_annotation(desired, &lb.tags);
        let in_full = !all_present
            || tags_change
            || nlb::plan::records_stale(desired, &lb.tags)
            || self.memory().sweep().must_read(name, uid, &lb.tags, want);
        if in_full {
            lb.attributes = nlb::read::read_attributes(aws, &lb.arn).await?;
            lb.listeners = nlb::read::read_listeners(aws, &lb.arn).await?;
            if tags_follow {
                nlb::read::read_listener_tags(aws, &mut lb.listeners).await?;
            }
        } else {
            lb.attributes = desired.attributes.clone();
            // As asked for; their ARNs are not known, and not needed: a
            // plan writes no listener that is as asked for.
            lb.listeners = desired
                .listeners
                .iter()
                .map(|l| nlb::ActualListener {
                    arn: String::new(),
                    port: l.port,
                    protocol: l.protocol.clone(),
                    certificate: l.certificate.clone(),
                    ssl_policy: l.ssl_policy.clone(),
                    target_group_arn: arn_of(&l.target_group),
                    alpn: (desired.alpn.as_ref())
                        .and_then(|a| a.want.clone())
                        .filter(|_| l.protocol == "TLS"),
                    tags: None,
                })
                .collect();
        }
        let known_attributes = (!in_full).then_some(&desired.target_group_attributes);
        let mut target_groups = Vec::new();
        for (g, tags) in groups.iter() {
            // The target record vouches for what the group holds, and its
            // targets are not due for their (slower) drift repair: no read.
            let arn = g.target_group_arn().unwrap_or_default();
            let known_targets = (g
                .port()
                .is_some_and(|port| self.memory().recorded_as(arn, port, &desired.instances))
                && !self.memory().sweep().targets_due(arn, uid))
            .then_some(&desired.instances);
            let group =
                nlb::read::complete_one(aws, g, tags.clone(), known_attributes, known_targets)
                    .await?;
            if known_targets.is_none() {
                self.memory().sweep().targets_read(arn);
            }
            target_groups.push(group);
        }
        Ok((Some(lb), target_groups, in_full))
    }

    /// Fills classic ELB `lb`'s attributes (of the Service with UID `uid`)
    /// for a plan: read, or taken as `desired` asks when they are known.
    pub(super) async fn clb_attributes(
        &self,
        lb: Option<&mut elb::ActualLb>,
        uid: &str,
        desired: &elb::Desired,
    ) -> Result<super::planned::Settings, AwsError> {
        let digest = clb_settings(desired);
        let mut read_in_full = true;
        if let Some(lb) = lb {
            read_in_full = self
                .memory()
                .sweep()
                .must_read(&lb.name, uid, &lb.tags, &digest);
            lb.attributes = if read_in_full {
                elb::io::read_attributes(&self.aws, &lb.name).await?
            } else {
                desired.attributes.clone()
            };
        }
        Ok(super::planned::Settings {
            digest,
            read_in_full,
        })
    }
}

/// Adds the settings record `digest` to the tags of a create call, when
/// the tags leave room for it (else the load balancer is read in full at
/// adoption, as one without the record).
fn record_at_creation(create_tags: &mut BTreeMap<String, String>, digest: &str) {
    if create_tags.len() < tags::MAX_LB_TAGS {
        create_tags.insert(tags::APPLIED_SETTINGS_TAG.to_string(), digest.to_string());
    }
}

/// [`record_at_creation`] on a classic ELB plan's create step, if any.
pub(crate) fn record_in_clb_create(changes: &mut [elb::Change], digest: &str) {
    for c in changes {
        if let elb::Change::CreateLoadBalancer { tags, .. } = c {
            record_at_creation(tags, digest);
        }
    }
}

/// [`record_at_creation`] on an NLB plan's create step, if any.
pub(crate) fn record_in_nlb_create(changes: &mut [nlb::Change], digest: &str) {
    for c in changes {
        if let nlb::Change::CreateLoadBalancer { tags, .. } = c {
            record_at_creation(tags, digest);
        }
    }
}

/// One full sweep. The three listings are read one after another, not at
/// once: each holds a page (up to 400 load balancers) being decoded, and
/// overlapping them, with the instance sweep's pages, made the process's
/// peak memory.
async fn read_all(aws: &AwsClient, sweep: &LbSweep) -> Result<Snapshot, AwsError> {
    let started = Instant::now();
    let mut clbs: BTreeMap<String, elb::ActualLb> = elb::io::list_all(aws)
        .await?
        .into_iter()
        .filter(|l| is_service_lb_name(&l.name))
        .map(|l| (l.name.clone(), l))
        .collect();
    let mut nlbs: BTreeMap<String, nlb::ActualLb> = nlb::read::list_all(aws)
        .await?
        .into_iter()
        .filter(|(name, _)| is_service_lb_name(name))
        .collect();
    let all_groups = nlb::read::all_target_groups(aws).await?;
    let groups = sweep
        .tag_listed(aws, started, &mut clbs, &mut nlbs, all_groups)
        .await?;
    tracing::debug!(
        classic = clbs.len(),
        network = nlbs.len(),
        target_groups = groups.values().map(Vec::len).sum::<usize>(),
        "swept the cluster's load balancers"
    );
    Ok(Snapshot {
        started,
        clbs,
        nlbs,
        groups,
    })
}

impl LbSweep {
    /// Gives a sweep's listings their tags (from [`Self::tags_of`]) and
    /// returns the target groups behind each swept NLB, by its ARN.
    async fn tag_listed(
        &self,
        aws: &AwsClient,
        started: Instant,
        clbs: &mut BTreeMap<String, elb::ActualLb>,
        nlbs: &mut BTreeMap<String, nlb::ActualLb>,
        all_groups: Vec<t::TargetGroup>,
    ) -> Result<BTreeMap<String, Vec<SweptGroup>>, AwsError> {
        let names: Vec<(String, String)> = clbs.keys().map(|n| (n.clone(), n.clone())).collect();
        let mut clb_tags = self
            .tags_of(names, started, async |n| {
                elb::io::tags_by_name(aws, &n).await
            })
            .await?;
        for (name, lb) in clbs.iter_mut() {
            lb.tags = clb_tags.remove(name).unwrap_or_default();
        }
        // NLBs by ARN, with their names (the owner of their groups' tags).
        let name_of: HashMap<String, String> = nlbs
            .iter()
            .map(|(name, l)| (l.arn.clone(), name.clone()))
            .collect();
        let arns: Vec<(String, String)> = name_of.clone().into_iter().collect();
        let mut nlb_tags = self
            .tags_of(arns, started, async |a| nlb::read::tags_of(aws, &a).await)
            .await?;
        for lb in nlbs.values_mut() {
            lb.tags = nlb_tags.remove(&lb.arn).unwrap_or_default();
        }
        let groups = self.tag_groups(aws, started, &name_of, all_groups).await?;
        // Resources no longer listed were deleted: their tags go.
        let listed: std::collections::HashSet<&str> = clbs
            .keys()
            .chain(name_of.keys())
            .map(String::as_str)
            .chain(
                groups
                    .values()
                    .flatten()
                    .filter_map(|(g, _)| g.target_group_arn()),
            )
            .collect();
        self.tags.lock().keep_only(&listed);
        self.targets_read
            .lock()
            .retain(|arn, _| listed.contains(arn.as_str()));
        Ok(groups)
    }

    /// The target groups behind each swept NLB (`name_of`: NLB ARN to
    /// name), by the NLB's ARN, with their tags.
    async fn tag_groups(
        &self,
        aws: &AwsClient,
        started: Instant,
        name_of: &HashMap<String, String>,
        all_groups: Vec<t::TargetGroup>,
    ) -> Result<BTreeMap<String, Vec<SweptGroup>>, AwsError> {
        // Groups behind a swept NLB, each with the first such NLB's name.
        let behind: Vec<(t::TargetGroup, String)> = all_groups
            .into_iter()
            .filter_map(|g| {
                let owner = g
                    .load_balancer_arns()
                    .iter()
                    .find_map(|a| name_of.get(a))?
                    .clone();
                Some((g, owner))
            })
            .collect();
        let group_keys: Vec<(String, String)> = behind
            .iter()
            .filter_map(|(g, owner)| Some((g.target_group_arn()?.to_string(), owner.clone())))
            .collect();
        let mut group_tags = self
            .tags_of(group_keys, started, async |a| {
                nlb::read::tags_of(aws, &a).await
            })
            .await?;
        let mut groups: BTreeMap<String, Vec<SweptGroup>> = BTreeMap::new();
        for (g, _) in behind {
            let tags = g.target_group_arn().and_then(|a| group_tags.remove(a));
            let tags = tags.unwrap_or_default();
            for lb in g
                .load_balancer_arns()
                .iter()
                .filter(|a| name_of.contains_key(*a))
            {
                let swept = (g.clone(), tags.clone());
                groups.entry(lb.clone()).or_default().push(swept);
            }
        }
        Ok(groups)
    }
}

/// Whether the NLB's tags follow `additional-resource-tags` (its
/// listeners' tags are then read, and so the listeners, with them), and
/// whether the NLB's own must change.
fn tags_follow_annotation(
    desired: &nlb::Desired,
    have: &std::collections::BTreeMap<String, String>,
) -> (bool, bool) {
    let follow = !desired.additional_tags.is_empty() || have.contains_key(tags::MANAGED_TAGS_TAG);
    let change = follow
        && !tags::follow_annotation(&desired.tags, &desired.additional_tags, have).is_empty();
    (follow, change)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sweep_serves_for_the_resync_period_within_bounds() {
        use super::{MAX_SWEEP_TTL, SWEEP_TTL, sweep_ttl};
        use std::time::Duration;
        assert_eq!(sweep_ttl(None), SWEEP_TTL);
        assert_eq!(sweep_ttl(Some(None)), MAX_SWEEP_TTL);
        assert_eq!(
            sweep_ttl(Some(Some(Duration::from_secs(3600)))),
            MAX_SWEEP_TTL
        );
        let minute = Duration::from_secs(60);
        assert_eq!(sweep_ttl(Some(Some(minute))), minute);
        assert_eq!(sweep_ttl(Some(Some(Duration::from_secs(3)))), SWEEP_TTL);
    }

    use super::*;

    const NAME: &str = "a0123456789abcdef0123456789abcde";

    #[test]
    fn only_service_load_balancer_names_are_swept() {
        assert!(is_service_lb_name(NAME));
        for other in [
            "my-app-lb",
            "a0123456789ABCDEF0123456789abcde",
            "b0123456789abcdef0123456789abcde",
            "a0123456789abcdef0123456789abcd",
        ] {
            assert!(!is_service_lb_name(other), "{other}");
        }
    }

    fn tagged(value: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(tags::APPLIED_SETTINGS_TAG.to_string(), value.to_string())])
    }

    #[tokio::test(start_paused = true)]
    async fn known_settings_are_trusted_until_the_services_resync_slot_moves_on() {
        let period = Duration::from_secs(3600);
        let sweep = LbSweep::new(Some(Some(period)));
        let want = settings_value(["attrs"]);
        // No tag (the Go CCM's): read in full; a different tag too.
        assert!(sweep.must_read(NAME, "uid-1", &BTreeMap::new(), &want));
        assert!(sweep.must_read(NAME, "uid-1", &tagged("v1 0000000000"), &want));
        // The tag vouches: no read, until the slot moves on (within a period).
        assert!(!sweep.must_read(NAME, "uid-1", &tagged(&want), &want));
        let start = Instant::now();
        while !sweep.must_read(NAME, "uid-1", &tagged(&want), &want) {
            tokio::time::advance(Duration::from_secs(60)).await;
            let waited = start.elapsed();
            assert!(waited <= period + Duration::from_secs(60), "{waited:?}");
        }
        // Read in full now: trusted again for a whole period.
        sweep.synced(NAME, &want, true, false);
        tokio::time::advance(period - Duration::from_secs(61)).await;
        assert!(!sweep.must_read(NAME, "uid-1", &BTreeMap::new(), &want));
        // The Service asks for other settings: read.
        assert!(sweep.must_read(NAME, "uid-1", &tagged(&want), "v1 1111111111"));
        // A failed sync: unknown until read.
        sweep.forget(NAME);
        assert!(sweep.must_read(NAME, "uid-1", &BTreeMap::new(), &want));
    }

    #[tokio::test(start_paused = true)]
    async fn first_repairs_after_a_joint_adoption_are_spread_over_the_period() {
        let period = Duration::from_secs(100);
        let sweep = LbSweep::new(Some(Some(period)));
        let want = settings_value(["attrs"]);
        let names: Vec<String> = (0..200).map(|i| format!("a{i:031x}")).collect();
        for n in &names {
            assert!(!sweep.must_read(n, n, &tagged(&want), &want));
        }
        // Each tenth of the period, some but far from all come due.
        let mut due_per_tenth = Vec::new();
        let mut done = std::collections::BTreeSet::new();
        for _ in 0..10 {
            tokio::time::advance(period / 10).await;
            let due: Vec<&String> = names
                .iter()
                .filter(|n| !done.contains(*n) && sweep.must_read(n, n, &tagged(&want), &want))
                .collect();
            due_per_tenth.push(due.len());
            for n in due {
                done.insert(n.clone());
                sweep.synced(n, &want, true, false);
            }
        }
        assert_eq!(done.len(), names.len(), "each once within the period");
        assert!(
            due_per_tenth.iter().all(|d| *d <= 45),
            "no burst: {due_per_tenth:?}"
        );
    }

    /// `tags_of` with a reader that records the keys it was asked for.
    async fn read_tags(
        sweep: &LbSweep,
        keys: &[(&str, &str)],
        started: Instant,
    ) -> (Vec<String>, HashMap<String, Tags>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let record = asked.clone();
        let keys = keys
            .iter()
            .map(|(k, o)| (k.to_string(), o.to_string()))
            .collect();
        let got = sweep
            .tags_of(keys, started, |ks: Vec<String>| async move {
                record.lock().extend(ks.iter().cloned());
                Ok(ks
                    .into_iter()
                    .map(|k| (k.clone(), BTreeMap::from([("read".to_string(), k)])))
                    .collect())
            })
            .await
            .unwrap();
        let mut asked = asked.lock().clone();
        asked.sort();
        (asked, got)
    }

    #[tokio::test(start_paused = true)]
    async fn later_sweeps_reuse_tags_until_a_write_or_their_age_limit() {
        let period = Duration::from_secs(3600);
        let sweep = LbSweep::new(Some(Some(period)));
        let keys = [("lb-1", "lb-1"), ("arn:tg-1", "lb-1"), ("lb-2", "lb-2")];
        let (asked, got) = read_tags(&sweep, &keys, Instant::now()).await;
        assert_eq!(asked, ["arn:tg-1", "lb-1", "lb-2"]);
        assert_eq!(got["lb-2"]["read"], "lb-2");
        // Five minutes on: all reused.
        tokio::time::advance(MAX_SWEEP_TTL).await;
        let (asked, got) = read_tags(&sweep, &keys, Instant::now()).await;
        assert!(asked.is_empty(), "{asked:?}");
        assert_eq!(got.len(), 3);
        // A write to lb-1: it and its group are read again, lb-2 is not.
        sweep.touch("lb-1");
        let (asked, _) = read_tags(&sweep, &keys, Instant::now()).await;
        assert_eq!(asked, ["arn:tg-1", "lb-1"]);
        // A period on, every entry has passed its age limit.
        tokio::time::advance(period).await;
        let (asked, _) = read_tags(&sweep, &keys, Instant::now()).await;
        assert_eq!(asked.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn tags_read_before_a_write_are_not_kept_and_plans_keep_none() {
        let sweep = LbSweep::new(Some(Some(Duration::from_secs(3600))));
        let started = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        // The write lands after the sweep started, before its tags came.
        sweep.touch("lb-1");
        let keys = [("lb-1", "lb-1"), ("lb-2", "lb-2")];
        read_tags(&sweep, &keys, started).await;
        let (asked, _) = read_tags(&sweep, &keys, Instant::now()).await;
        assert_eq!(asked, ["lb-1"]);
        // `aws-ccm plan` (no trust): every sweep reads every tag.
        let plan = LbSweep::new(None);
        read_tags(&plan, &keys, Instant::now()).await;
        let (asked, _) = read_tags(&plan, &keys, Instant::now()).await;
        assert_eq!(asked.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn recorded_targets_are_read_once_every_few_periods_at_a_slot_of_their_own() {
        let period = Duration::from_secs(100);
        let sweep = LbSweep::new(Some(Some(period)));
        // First vouched for now; not due until its repair slot moves on.
        assert!(!sweep.targets_due("arn:tg", "uid-1"));
        let start = Instant::now();
        while !sweep.targets_due("arn:tg", "uid-1") {
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let waited = start.elapsed();
        let repair = period * TARGET_REPAIR_PERIODS;
        assert!(waited <= repair, "{waited:?}");
        sweep.targets_read("arn:tg");
        assert!(!sweep.targets_due("arn:tg", "uid-1"));
        // Due again exactly one repair period later.
        tokio::time::advance(repair - Duration::from_secs(1)).await;
        assert!(!sweep.targets_due("arn:tg", "uid-1"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(sweep.targets_due("arn:tg", "uid-1"));
        // Plans always read; without a resync period, never.
        assert!(LbSweep::new(None).targets_due("arn:tg", "uid-1"));
        assert!(!LbSweep::new(Some(None)).targets_due("arn:tg", "uid-1"));
    }

    #[test]
    fn settings_digests_differ_with_the_settings() {
        let a = settings_value(["x"]);
        assert!(a.starts_with("v1 ") && a.len() == 13, "{a}");
        assert_ne!(a, settings_value(["y"]));
    }
}
