//! The security-group view: every group in the cluster's VPC from one
//! paginated `DescribeSecurityGroups` (1,000 per page), shared by every sync
//! as the load-balancer sweep is for load balancers.
//!
//! A listing is single-flight (concurrent syncs share one) and reused for
//! the time [`SgView::serve_for`] sets: the service controller sets the
//! load-balancer sweep's (the resync period, at most 5 min); otherwise
//! [`VIEW_TTL`]. It holds the whole VPC, not only the cluster-tagged groups,
//! so that the questions a sync asks of it are answered exactly as the
//! filtered reads they replace answered them: a backend's untagged node
//! group, the groups whose rules admit a load balancer's group, the groups
//! holding an NLB's node rules. A group the listing lacks (an instance's
//! group made since) is read by ID, once, and kept.
//!
//! This process's own writes never leave a stale entry: every write through
//! [`super::io`] says in its apply's journal what it did to exactly that
//! group (rules added or revoked, group created or deleted), the memory
//! ([`crate::aws::memory`]) records it here once the apply ends, and that
//! record answers for the group
//! over any listing that started less than [`WRITE_SETTLE`] after the write
//! (EC2 is eventually consistent: a group just created may be missing from a
//! listing for a while). A write whose outcome is unknown (it failed) makes
//! the group unknown: it is read by ID before the view answers again.
//!
//! Drift made behind the CCM's back is read at the Service's resync slot:
//! a sync whose slot moved on since its last one sees a listing that
//! started after that last one. The cached listing, when it did; else the
//! sync renews it, and the new listing serves every resync due meanwhile
//! ([`SgView::slot_due`], [`SgView::listing_since`]). With the listing
//! serving for at most the resync period, a renewal is the exception.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::{Rule, SecurityGroup};
use crate::aws::client::AwsClient;
use crate::aws::client::coalesce::SingleFlight;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::instances::filter;
use crate::provider::load_balancers::resync_slot;

/// How long one listing serves syncs unless [`SgView::serve_for`] says.
const VIEW_TTL: Duration = Duration::from_secs(30);

/// How long a group this process knows and no listing has shown yet (made
/// here, or read by ID) is kept.
const UNLISTED_KEPT: Duration = Duration::from_secs(300);

/// How long after this process wrote a group a listing must start to
/// answer for it in place of the process's own record, unless
/// [`SgView::new`] is given the client's consistency window
/// (`--aws-consistency-window`).
const WRITE_SETTLE: Duration = Duration::from_secs(30);

/// One listing of a VPC's groups.
struct Listing {
    /// When its first page was asked for.
    started: Instant,
    groups: BTreeMap<String, SecurityGroup>,
}

/// What this process knows of one group apart from the listing.
#[derive(Clone, Debug)]
enum Entry {
    Known(SecurityGroup),
    Gone,
    /// A write's outcome is unknown: read it by ID before answering.
    Unknown,
}

#[derive(Clone, Debug)]
struct Local {
    at: Instant,
    entry: Entry,
}

/// The shared view. Clones share it.
#[derive(Clone)]
pub(crate) struct SgView {
    listings: Arc<Mutex<HashMap<String, SingleFlight<Arc<Listing>>>>>,
    /// The last listing of each VPC (what a write's record starts from).
    last: Arc<Mutex<HashMap<String, Arc<Listing>>>>,
    local: Arc<Mutex<HashMap<String, Local>>>,
    /// When each Service (by UID) last synced in a new resync slot.
    slots: Arc<Mutex<HashMap<String, Instant>>>,
    /// How long a listing serves (`None`: [`VIEW_TTL`]).
    ttl: Arc<Mutex<Option<Duration>>>,
    /// Held while a resync renews a listing (one renewal serves them all).
    renewing: Arc<tokio::sync::Mutex<()>>,
    /// How long this process's own record of a write answers over listings
    /// ([`WRITE_SETTLE`] by default).
    settle: Duration,
}

impl Default for SgView {
    fn default() -> SgView {
        SgView::new(WRITE_SETTLE)
    }
}

/// The groups of one VPC as the view shows them now.
pub(crate) struct Groups {
    listing: Arc<Listing>,
    /// Local records that answer over the listing (`None`: gone).
    over: BTreeMap<String, Option<SecurityGroup>>,
}

impl Groups {
    /// Group `id`, if the view has it.
    pub(crate) fn get(&self, id: &str) -> Option<&SecurityGroup> {
        match self.over.get(id) {
            Some(g) => g.as_ref(),
            None => self.listing.groups.get(id),
        }
    }

    /// Whether the view has an answer for group `id` (gone is one).
    pub(crate) fn knows(&self, id: &str) -> bool {
        self.over.contains_key(id) || self.listing.groups.contains_key(id)
    }

    /// Every group.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &SecurityGroup> + '_ {
        let listed = self
            .listing
            .groups
            .values()
            .filter(|g| !self.over.contains_key(&g.id));
        listed.chain(self.over.values().flatten())
    }

    /// The groups with an ingress rule from group `source` (EC2's filter
    /// `ip-permission.group-id`).
    pub(crate) fn referencing(&self, source: &str) -> Vec<SecurityGroup> {
        let from = super::Source::Group(source.to_string());
        self.with_rule(|r| r.source == from)
    }

    /// The groups with an ingress rule starting at one of `ports` (EC2's
    /// filter `ip-permission.from-port`).
    pub(crate) fn with_rule_ports(&self, ports: &BTreeSet<i32>) -> Vec<SecurityGroup> {
        self.with_rule(|r| ports.contains(&r.from))
    }

    /// The groups with an ingress rule `wanted` holds for.
    fn with_rule(&self, wanted: impl Fn(&Rule) -> bool) -> Vec<SecurityGroup> {
        self.iter()
            .filter(|g| g.ingress.iter().any(&wanted))
            .cloned()
            .collect()
    }
}

impl SgView {
    /// An empty view whose own records of writes answer over listings that
    /// started less than `settle` after them (AWS's consistency window).
    pub(crate) fn new(settle: Duration) -> SgView {
        SgView {
            listings: Arc::default(),
            last: Arc::default(),
            local: Arc::default(),
            slots: Arc::default(),
            ttl: Arc::default(),
            renewing: Arc::default(),
            settle,
        }
    }

    /// Listings from here on serve for `ttl`.
    pub(crate) fn serve_for(&self, ttl: Duration) {
        *self.ttl.lock() = Some(ttl);
        self.listings.lock().clear();
    }

    /// The listing of `vpc_id`, shared with every concurrent caller.
    async fn listing(&self, aws: &AwsClient, vpc_id: &str) -> Result<Arc<Listing>, AwsError> {
        let flight = self
            .listings
            .lock()
            .entry(vpc_id.to_string())
            .or_insert_with(|| {
                let ttl = self.ttl.lock().unwrap_or(VIEW_TTL);
                SingleFlight::new(Operation::Ec2DescribeSecurityGroups, ttl)
            })
            .clone();
        let reader = aws.clone();
        let vpc = vpc_id.to_string();
        let listing = flight
            .get(move || {
                async move {
                    let started = Instant::now();
                    let found = super::io::describe(&reader, vec![filter("vpc-id", [vpc])]).await?;
                    let groups = found.into_iter().map(|g| (g.id.clone(), g)).collect();
                    Ok(Arc::new(Listing { started, groups }))
                }
                .boxed()
            })
            .await?;
        self.last.lock().insert(vpc_id.to_string(), listing.clone());
        Ok(listing)
    }

    /// The groups of `vpc_id`: the shared listing, with this process's own
    /// records over it (unknown ones read by ID first).
    pub(crate) async fn groups(&self, aws: &AwsClient, vpc_id: &str) -> Result<Groups, AwsError> {
        let listing = self.listing(aws, vpc_id).await?;
        // Nothing is read when no group is unknown.
        self.refresh(aws, &self.unknown_ids()).await?;
        let over = overlay(&mut self.local.lock(), &listing, vpc_id, self.settle);
        Ok(Groups { listing, over })
    }

    /// The groups a write left unknown: the next [`Self::groups`] reads
    /// them by ID before it answers.
    pub(crate) fn unknown_ids(&self) -> Vec<String> {
        let local = self.local.lock();
        let unknown = local
            .iter()
            .filter(|(_, l)| matches!(l.entry, Entry::Unknown));
        unknown.map(|(id, _)| id.clone()).collect()
    }

    /// Groups `refs` point at (an instance's description names its groups;
    /// a reference the view lacks is read by ID, once) and the groups named
    /// `extra_names` in `vpc_id`, by ID.
    pub(crate) async fn by_refs(
        &self,
        aws: &AwsClient,
        vpc_id: &str,
        refs: &[crate::aws::instances::SecurityGroupRef],
        extra_names: &[String],
    ) -> Result<BTreeMap<String, SecurityGroup>, AwsError> {
        let ids: BTreeSet<&str> = refs.iter().map(|r| &*r.id).collect();
        let mut groups = self.groups(aws, vpc_id).await?;
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !groups.knows(id))
            .map(|id| (*id).to_string())
            .collect();
        if !missing.is_empty() {
            self.refresh(aws, &missing).await?;
            groups = self.groups(aws, vpc_id).await?;
        }
        let referenced = ids.iter().filter_map(|id| groups.get(id));
        let named = groups.iter().filter(|g| extra_names.contains(&g.name));
        let found = referenced.chain(named).map(|g| (g.id.clone(), g.clone()));
        Ok(found.collect())
    }

    /// Reads groups `ids` by ID (one filtered call per 200) and records what
    /// was found; an ID not found is recorded gone.
    async fn refresh(&self, aws: &AwsClient, ids: &[String]) -> Result<(), AwsError> {
        if ids.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let found = super::io::by_ids(aws, ids).await?;
        let mut local = self.local.lock();
        let mut by_id: HashMap<String, SecurityGroup> =
            found.into_iter().map(|g| (g.id.clone(), g)).collect();
        for id in ids {
            // A write made while this read was out answers for the group.
            if local.get(id).is_some_and(|l| l.at > started) {
                continue;
            }
            let entry = by_id.remove(id).map_or(Entry::Gone, Entry::Known);
            local.insert(id.clone(), Local { at: started, entry });
        }
        Ok(())
    }

    /// When the Service with UID `uid` needs a listing that started after
    /// its last sync: its resync slot in `period` moved on since that sync
    /// and the last listing of `vpc_id` is older. `None`: the listing
    /// serves (always, for the first sync in this process or without a
    /// resync period).
    pub(crate) fn slot_due(
        &self,
        uid: &str,
        vpc_id: &str,
        period: Option<Duration>,
    ) -> Option<Instant> {
        let listed = self.last.lock().get(vpc_id).map(|l| l.started);
        let now = Instant::now();
        let mut slots = self.slots.lock();
        let prev = slots.get(uid).copied();
        let moved = match (prev, period) {
            (Some(at), Some(p)) => resync_slot(uid, p, now) > resync_slot(uid, p, at),
            _ => false,
        };
        if prev.is_none() || moved {
            slots.insert(uid.to_string(), now);
        }
        prev.filter(|at| moved && listed.is_none_or(|started| started < *at))
    }

    /// Makes the listing of `vpc_id` one that started at or after `since`:
    /// the cached one if it did, else a new one, shared by every sync that
    /// asks meanwhile.
    pub(crate) async fn listing_since(
        &self,
        aws: &AwsClient,
        vpc_id: &str,
        since: Instant,
    ) -> Result<(), AwsError> {
        let _one = self.renewing.lock().await;
        if (self.last.lock().get(vpc_id)).is_some_and(|l| l.started >= since) {
            return Ok(());
        }
        let flight = self.listings.lock().get(vpc_id).cloned();
        if let Some(flight) = flight {
            flight.invalidate();
        }
        self.listing(aws, vpc_id).await.map(|_| ())
    }

    /// The Service with UID `uid` is gone: forget its slot.
    pub(crate) fn forget_slot(&self, uid: &str) {
        self.slots.lock().remove(uid);
    }

    /// Records `entry` for group `id` as of now.
    fn set(&self, id: String, entry: Entry) {
        let at = Instant::now();
        self.local.lock().insert(id, Local { at, entry });
    }

    /// Applies `change` to this process's record of group `id` (taken from
    /// the last listing when it has none); without a record or listing
    /// entry the group becomes unknown.
    fn update(&self, id: &str, change: impl FnOnce(&mut SecurityGroup)) {
        let now = Instant::now();
        let mut local = self.local.lock();
        let current = match local.get(id).map(|l| &l.entry) {
            Some(Entry::Known(g)) => Some(g.clone()),
            Some(Entry::Gone | Entry::Unknown) => None,
            None => self.listed(id),
        };
        let entry = match current {
            Some(mut g) => {
                change(&mut g);
                Entry::Known(g)
            }
            None => Entry::Unknown,
        };
        local.insert(id.to_string(), Local { at: now, entry });
    }

    /// Group `id` from the last listing of any VPC.
    fn listed(&self, id: &str) -> Option<SecurityGroup> {
        let last = self.last.lock();
        last.values().find_map(|l| l.groups.get(id).cloned())
    }

    /// This process created group `g` (no rules yet).
    pub(crate) fn created(&self, g: SecurityGroup) {
        self.set(g.id.clone(), Entry::Known(g));
    }

    /// This process added `rules` to group `id`, with `descriptions`.
    pub(crate) fn authorized(
        &self,
        id: &str,
        rules: &BTreeSet<Rule>,
        descriptions: &BTreeMap<Rule, String>,
    ) {
        self.update(id, |g| {
            g.ingress.extend(rules.iter().cloned());
            for (r, d) in descriptions {
                g.descriptions.insert(r.clone(), d.clone());
            }
        });
    }

    /// This process revoked `rules` from group `id`.
    pub(crate) fn revoked(&self, id: &str, rules: &BTreeSet<Rule>) {
        self.update(id, |g| {
            for r in rules {
                g.ingress.remove(r);
                g.descriptions.remove(r);
            }
        });
    }

    /// This process deleted group `id`.
    pub(crate) fn deleted(&self, id: &str) {
        self.set(id.to_string(), Entry::Gone);
    }

    /// A write to group `id` failed: what it holds is unknown until read.
    pub(crate) fn unknown(&self, id: &str) {
        self.set(id.to_string(), Entry::Unknown);
    }
}

/// Prunes `local` against `listing` of `vpc_id` and returns the records
/// that answer over it (`None`: gone or unknown). A record stays until a
/// listing that started `settle` ([`WRITE_SETTLE`]) after it; a group this process
/// knows but no listing has shown yet (made here, or read by ID) stays for
/// [`UNLISTED_KEPT`] past that.
fn overlay(
    local: &mut HashMap<String, Local>,
    listing: &Listing,
    vpc_id: &str,
    settle: Duration,
) -> BTreeMap<String, Option<SecurityGroup>> {
    local.retain(|id, l| {
        let settled = l.at + settle <= listing.started;
        let unlisted = matches!(l.entry, Entry::Known(_)) && !listing.groups.contains_key(id);
        !settled || (unlisted && l.at + UNLISTED_KEPT > listing.started)
    });
    let answer = |(id, l): (&String, &Local)| {
        let group = match &l.entry {
            Entry::Known(g) if g.vpc_id.as_deref().is_none_or(|v| v == vpc_id) => Some(g.clone()),
            Entry::Known(_) => return None,
            Entry::Gone | Entry::Unknown => None,
        };
        Some((id.clone(), group))
    };
    local.iter().filter_map(answer).collect()
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
