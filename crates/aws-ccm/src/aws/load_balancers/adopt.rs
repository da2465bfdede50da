//! Adopting a kept load balancer by name: a Service whose
//! `aws-load-balancer-name` names a load balancer this CCM kept
//! ([`super::keep`]: this cluster's `owned` tag, a name this CCM gives, and
//! [`tags::KEPT_TAG`]) of the kind the Service asks for, and which has no
//! load balancer of its own, takes it over instead of creating one.
//!
//! The adopted load balancer keeps its name, `a` + the UID of the Service
//! it was made for. Every name this CCM derives for a Service's load
//! balancer (its own security groups, the sweep's and memory's keys) comes
//! from that UID, so an adopting sync works on the Service with the
//! *naming UID* of the load balancer ([`AdoptedSync::request`]): the same
//! plans then find its listeners and own group and bring them to what the
//! Service asks. Its target groups, whose names hash the old Service, are
//! replaced as a changed target group is (the listeners move first), and
//! the old ones, proven the kept-from Service's, are deleted after.
//!
//! The proof that holds afterwards, without the `a` + UID name: the
//! annotation names it, its [`tags::SERVICE_NAME_TAG`] and
//! [`tags::ADOPTED_TAG`] both name the Service. Only a Service with the
//! annotation pays the reads this takes. docs/ownership.md is the
//! operator's page.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::{AwsLoadBalancers, EnsureRequest, Warning};
use crate::aws::annotations::{LoadBalancerKind, LoadBalancerSpec};
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups as sg;
use crate::aws::{elb, nlb, tags};
use crate::provider::CloudError;

/// Event reason: `aws-load-balancer-name` names nothing the Service may adopt.
const NOT_ADOPTED: &str = "LoadBalancerNotAdopted";

/// What a Service's `aws-load-balancer-name` comes to, given what AWS has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The load balancer is the Service's already (its adoption tags name it).
    Adopted,
    /// A kept load balancer the Service may adopt now.
    Adopt,
    /// Nothing to adopt: why, for the Warning.
    Refused(String),
}

/// The kind a spec asks for, in words.
fn kind_words(network: bool) -> &'static str {
    if network { "NLB" } else { "classic ELB" }
}

/// Pure: the verdict on load balancer `name` (`found`: its tags, when one of
/// the Service's kind has that name; `other_kind`: one of the other kind
/// has it) for Service `service_key`, which `has_own` load balancer.
fn verdict(
    name: &str,
    network: bool,
    found: Option<&BTreeMap<String, String>>,
    other_kind: bool,
    cluster_id: &str,
    service_key: &str,
    has_own: bool,
) -> Verdict {
    let kind = kind_words(network);
    if let Some(t) = found
        && is_adopted_by(t, service_key)
        && ownership::prove(Made::LoadBalancer, name, t, cluster_id, Some(service_key)).is_ok()
    {
        return Verdict::Adopted;
    }
    if has_own {
        return Verdict::Refused(
            "the Service already has its own load balancer; a Service adopts a kept one only before it has one".into(),
        );
    }
    let Some(t) = found else {
        return Verdict::Refused(if other_kind {
            format!(
                "{name} is a {}, not the {kind} the Service asks for (aws-load-balancer-type)",
                kind_words(!network)
            )
        } else {
            format!("no {kind} is named {name}")
        });
    };
    if let Err(why) = ownership::prove(Made::LoadBalancer, name, t, cluster_id, None) {
        return Verdict::Refused(format!(
            "{kind} {name} is not one this cluster's CCM made: {why}"
        ));
    }
    let Some(kept_from) = t.get(tags::KEPT_TAG) else {
        return Verdict::Refused(format!(
            "{kind} {name} was not kept by this CCM (no {} tag): only a load balancer a protected Service left behind is adopted",
            tags::KEPT_TAG
        ));
    };
    match t.get(tags::ADOPTED_TAG) {
        // Adopted by another Service after it was kept, not kept again since.
        Some(other)
            if other != service_key
                && other != kept_from
                && t.get(tags::SERVICE_NAME_TAG) == Some(other) =>
        {
            Verdict::Refused(format!(
                "{kind} {name} (kept from {kept_from}) was adopted by Service {other} first"
            ))
        }
        _ => Verdict::Adopt,
    }
}

/// Whether `t` says Service `service_key` adopted the load balancer.
pub(crate) fn is_adopted_by(t: &BTreeMap<String, String>, service_key: &str) -> bool {
    t.get(tags::ADOPTED_TAG).map(String::as_str) == Some(service_key)
        && t.get(tags::SERVICE_NAME_TAG).map(String::as_str) == Some(service_key)
}

/// The name of the load balancer a Service's sync looks for, when another
/// than its own: the one its annotation asks to adopt (`true`), else the
/// one its status names (`false`: the annotation removed after the
/// adoption; followed only while the load balancer's tags say the Service
/// adopted it, never adopted anew, and no Warning otherwise).
fn wanted<'a>(spec: &'a LoadBalancerSpec, uid: &str) -> Option<(&'a str, bool)> {
    let own = elb::load_balancer_name(uid);
    let annotated = spec.adopt_name.as_deref().map(str::trim);
    let (name, annotated) = match annotated {
        Some(n) if !n.is_empty() => (n, true),
        _ => (spec.held_name.as_deref()?, false),
    };
    (name != own).then_some((name, annotated))
}

/// The UID the name of load balancer `name` (`a` + 31 hex digits, as
/// [`ownership`] proves) was made from, as far as names go:
/// `elb::load_balancer_name` gives `name` back.
fn naming_uid(name: &str) -> String {
    name.strip_prefix('a').unwrap_or(name).to_string()
}

/// The Warning (and log line) for Service `service_key`, whose
/// `aws-load-balancer-name` names `name`, not adopted for `why`; `then`:
/// which load balancer the Service has instead, and the fix.
fn refusal(service_key: &str, name: &str, why: &str, then: &str) -> Warning {
    let message = format!(
        "{}: {name} is not adopted: {why}. {then}",
        crate::aws::annotations::NAME
    );
    tracing::warn!(service = %service_key, value = %name, "{message}");
    Warning {
        reason: NOT_ADOPTED,
        message,
    }
}

/// A sync of a Service as adoption leaves it.
pub(crate) struct AdoptedSync<'a> {
    /// The request to sync: the Service's, or with the adopted load
    /// balancer's naming UID.
    pub(crate) request: Cow<'a, EnsureRequest>,
    /// Why the annotation was not followed (a Warning for the Service).
    pub(crate) refused: Option<Warning>,
    /// The Service the load balancer was kept from, while its kept tag and
    /// old target groups are still to go.
    pub(crate) kept_from: Option<String>,
}

impl AwsLoadBalancers {
    /// What Service `req`'s `aws-load-balancer-name` comes to: no read
    /// without the annotation; with it, the named load balancer's tags, the
    /// Service's own load balancer, and (to adopt) a fresh read and the tag
    /// write that claims it. `claim`: write the claim (a sync); without
    /// (`aws-ccm plan`), only say what a sync would do.
    pub(crate) async fn adopted_sync<'a>(
        &self,
        req: &'a EnsureRequest,
        claim: bool,
    ) -> Result<AdoptedSync<'a>, CloudError> {
        let own = AdoptedSync {
            request: Cow::Borrowed(req),
            refused: None,
            kept_from: None,
        };
        let Some((name, annotated)) = wanted(&req.spec, &req.uid) else {
            return Ok(own);
        };
        let network = req.spec.kind == LoadBalancerKind::Network;
        let service_key = &req.service_key;
        if annotated && let Some(kept) = self.keeps_first(req, name, network).await? {
            return Ok(kept);
        }
        let (found, other_kind) = self.tags_of_kind(name, network).await?;
        let own_name = elb::load_balancer_name(&req.uid);
        let verdict = |found: Option<&BTreeMap<String, String>>, has_own: bool| {
            verdict(
                name,
                network,
                found,
                other_kind,
                &self.cluster_id,
                service_key,
                has_own,
            )
        };
        let mut decided = verdict(found.as_ref(), false);
        if !annotated && decided != Verdict::Adopted {
            // The status names another load balancer, but the Service did
            // not adopt it (or no longer holds it): its own, as always.
            return Ok(own);
        }
        if !annotated {
            tracing::debug!(service = %service_key, load_balancer = %name, "aws-load-balancer-name removed: the Service keeps the load balancer it adopted");
        }
        if decided == Verdict::Adopt && self.tags_of_kind(&own_name, network).await?.0.is_some() {
            decided = verdict(found.as_ref(), true);
        }
        let mut tags_now = found;
        if decided == Verdict::Adopt && claim {
            // One claim at a time: the second Service naming the same kept
            // load balancer reads the first one's claim and is refused.
            let _one_at_a_time = self.adoptions.lock().await;
            let fresh = self.fresh(name, network).await?;
            tags_now = fresh.as_ref().map(|f| f.tags().clone());
            decided = verdict(tags_now.as_ref(), false);
            if let (Verdict::Adopt, Some(lb)) = (&decided, fresh) {
                self.claim(name, lb, service_key).await?;
                tracing::info!(service = %service_key, load_balancer = %name, "adopted the kept load balancer the Service names in aws-load-balancer-name");
            }
        }
        match decided {
            Verdict::Refused(why) => {
                let then = format!(
                    "The Service's load balancer is {own_name}, as the Go CCM names it; to adopt, name a load balancer this CCM kept, or remove the annotation"
                );
                Ok(AdoptedSync {
                    refused: Some(refusal(service_key, name, &why, &then)),
                    ..own
                })
            }
            Verdict::Adopt | Verdict::Adopted => {
                let kept_from = tags_now
                    .as_ref()
                    .and_then(|t| t.get(tags::KEPT_TAG).cloned());
                let mut adopted = req.clone();
                adopted.uid = naming_uid(name);
                Ok(AdoptedSync {
                    request: Cow::Owned(adopted),
                    refused: None,
                    kept_from,
                })
            }
        }
    }

    /// Service `req` adopted the load balancer its status names and its
    /// annotation now names `asked`, another: it keeps the first (a Service
    /// holds one load balancer; taking the second would leave the first
    /// tagged the Service's and never deleted), and a Warning says so.
    /// `None`: its status names no load balancer it adopted.
    async fn keeps_first<'a>(
        &self,
        req: &'a EnsureRequest,
        asked: &str,
        network: bool,
    ) -> Result<Option<AdoptedSync<'a>>, CloudError> {
        let Some(held) = req.spec.held_name.as_deref().filter(|h| *h != asked) else {
            return Ok(None);
        };
        let Some(t) = self.tags_of_kind(held, network).await?.0 else {
            return Ok(None);
        };
        let (cluster, key) = (&self.cluster_id, &req.service_key);
        if verdict(held, network, Some(&t), false, cluster, key, false) != Verdict::Adopted {
            return Ok(None);
        }
        let why =
            format!("the Service adopted {held} already, and a Service holds one load balancer");
        let then = format!(
            "The Service keeps {held}; set the annotation back to {held}, or remove it, to end this Warning"
        );
        let mut adopted = req.clone();
        adopted.uid = naming_uid(held);
        Ok(Some(AdoptedSync {
            request: Cow::Owned(adopted),
            refused: Some(refusal(key, asked, &why, &then)),
            kept_from: t.get(tags::KEPT_TAG).cloned(),
        }))
    }

    /// The tags of load balancer `name` of the kind asked (`network`), when
    /// it exists (from the sweep), and whether one of the other kind has
    /// the name (looked for only when none of the kind asked has it).
    async fn tags_of_kind(
        &self,
        name: &str,
        network: bool,
    ) -> Result<(Option<BTreeMap<String, String>>, bool), CloudError> {
        let (aws, sweep) = (&self.aws, self.memory().sweep());
        let clb = async || -> Result<_, CloudError> {
            Ok(sweep.clb(aws, name).await?.map(|l| (*l.tags).clone()))
        };
        let nlb = async || -> Result<_, CloudError> {
            Ok(sweep.nlb(aws, name).await?.map(|(l, _)| (*l.tags).clone()))
        };
        let mine = if network { nlb().await? } else { clb().await? };
        if mine.is_some() {
            return Ok((mine, false));
        }
        let other = if network { clb().await? } else { nlb().await? };
        Ok((None, other.is_some()))
    }

    /// Load balancer `name` read now (not from the sweep), as the claim
    /// writes to it.
    async fn fresh(&self, name: &str, network: bool) -> Result<Option<Fresh>, CloudError> {
        Ok(if network {
            nlb::read::describe(&self.aws, name)
                .await?
                .map(Fresh::Network)
        } else {
            elb::io::describe(&self.aws, name)
                .await?
                .map(Fresh::Classic)
        })
    }

    /// The claim: the service-name and adoption tags name Service
    /// `service_key` (the memory told, as after every apply).
    async fn claim(&self, name: &str, lb: Fresh, service_key: &str) -> Result<(), CloudError> {
        let tags = claim_tags(service_key);
        match lb {
            Fresh::Classic(lb) => {
                let actual = elb::Actual {
                    lb: Some(lb),
                    ..Default::default()
                };
                self.apply_clb(name, None, &actual, &[elb::Change::AddTags(tags)])
                    .await?;
            }
            Fresh::Network(lb) => {
                let change = nlb::Change::AddTags {
                    arn: Some(lb.arn.clone()),
                    tags,
                };
                let actual = nlb::Actual {
                    lb: Some(lb),
                    ..Default::default()
                };
                self.apply_nlb(name, "", &actual, &[change]).await?;
            }
        }
        Ok(())
    }

    /// After the first full sync of an adopted load balancer `name`
    /// (Service `service_key`, kept from `kept_from`): the target groups
    /// that the kept-from Service's names and tags prove its and that no
    /// listener forwards to any more (the sync moved the listeners off
    /// them, so they are behind no load balancer: found by name and tags,
    /// one listing) are deleted, then the kept tag goes. A group still in
    /// use (a live Service of the same name's) is not touched.
    pub(crate) async fn finish_adoption(
        &self,
        name: &str,
        network: bool,
        service_key: &str,
        kept_from: &str,
    ) -> Result<(), CloudError> {
        if network {
            let Some(lb) = nlb::read::describe(&self.aws, name).await? else {
                return Ok(());
            };
            let mut changes = Vec::new();
            for g in nlb::read::unused_service_target_groups(&self.aws, kept_from).await? {
                let old = ownership::prove(
                    Made::TargetGroup,
                    &g.name,
                    &g.tags,
                    &self.cluster_id,
                    Some(kept_from),
                );
                if old.is_ok() {
                    changes.push(nlb::Change::DeleteTargetGroup {
                        arn: g.arn,
                        name: g.name,
                    });
                }
            }
            changes.push(nlb::Change::RemoveTags {
                arn: Some(lb.arn.clone()),
                keys: kept_key(),
            });
            let actual = nlb::Actual {
                lb: Some(lb),
                ..Default::default()
            };
            self.apply_nlb(name, "", &actual, &changes).await?;
        } else if let Some(lb) = elb::io::describe(&self.aws, name).await? {
            let actual = elb::Actual {
                lb: Some(lb),
                ..Default::default()
            };
            self.apply_clb(name, None, &actual, &[elb::Change::RemoveTags(kept_key())])
                .await?;
        }
        tracing::info!(service = %service_key, load_balancer = %name, kept_from = %kept_from, "adoption complete: the kept tag and the kept-from Service's target groups are gone");
        Ok(())
    }
}

impl AwsLoadBalancers {
    /// The UID the deletion of Service `service_key` (UID `uid`) names its
    /// load balancer by: that of the one it adopted, when `adopted`
    /// (`aws-load-balancer-name`) names one whose tags say so; else its own.
    pub(super) async fn adopted_uid(
        &self,
        service_key: &str,
        uid: &str,
        adopted: Option<&str>,
    ) -> Result<String, CloudError> {
        let Some(name) = adopted
            .map(str::trim)
            .filter(|n| !n.is_empty() && *n != elb::load_balancer_name(uid))
        else {
            return Ok(uid.to_string());
        };
        for network in [false, true] {
            if let Some(t) = self.tags_of_kind(name, network).await?.0
                && verdict(
                    name,
                    network,
                    Some(&t),
                    false,
                    &self.cluster_id,
                    service_key,
                    false,
                ) == Verdict::Adopted
            {
                return Ok(naming_uid(name));
            }
        }
        Ok(uid.to_string())
    }
}

impl AwsLoadBalancers {
    /// The names NLB `lb`'s managed group may have for Service
    /// `service_key` (UID `uid`): [`Self::nlb_group_names`], and when the
    /// Service adopted the NLB, the groups attached to it that this CCM's
    /// names and tags prove its. Upstream's name hashes the name and UID of
    /// the Service the NLB was made for, so the adopter's own name finds
    /// nothing and its sync would make a second group (one read by ID, for
    /// an adopted NLB only).
    pub(super) async fn nlb_group_names_of(
        &self,
        service_key: &str,
        uid: &str,
        lb: Option<&nlb::ActualLb>,
    ) -> Result<Vec<String>, CloudError> {
        let mut names = self.nlb_group_names(service_key, uid);
        let Some(lb) = lb.filter(|l| is_adopted_by(&l.tags, service_key)) else {
            return Ok(names);
        };
        if lb.security_groups.is_empty() {
            return Ok(names);
        }
        let attached = sg::io::by_ids(&self.aws, &lb.security_groups).await?;
        names.extend(
            attached
                .into_iter()
                .filter(|g| {
                    ownership::prove(Made::NlbGroup, &g.name, &g.tags, &self.cluster_id, None)
                        .is_ok()
                })
                .map(|g| g.name),
        );
        Ok(names)
    }
}

/// A load balancer as read for the claim.
enum Fresh {
    Classic(elb::ActualLb),
    Network(nlb::ActualLb),
}

impl Fresh {
    fn tags(&self) -> &BTreeMap<String, String> {
        match self {
            Fresh::Classic(l) => &l.tags,
            Fresh::Network(l) => &l.tags,
        }
    }
}

/// The tags that claim a load balancer for Service `service_key`.
pub(crate) fn claim_tags(service_key: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (tags::SERVICE_NAME_TAG.to_string(), service_key.to_string()),
        (tags::ADOPTED_TAG.to_string(), service_key.to_string()),
    ])
}

/// The kept tag's key, for its removal once the adoption is complete.
fn kept_key() -> BTreeSet<String> {
    BTreeSet::from([tags::KEPT_TAG.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLUSTER: &str = "c1";
    const NAME: &str = "a0123456789abcdef0123456789abcde";

    fn kept(from: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            (tags::cluster_tag_key(CLUSTER), "owned".into()),
            (tags::SERVICE_NAME_TAG.into(), from.into()),
            (tags::KEPT_TAG.into(), from.into()),
        ])
    }

    fn judge(found: Option<&BTreeMap<String, String>>, has_own: bool) -> Verdict {
        verdict(NAME, true, found, false, CLUSTER, "ns/new", has_own)
    }

    #[test]
    fn a_kept_load_balancer_is_adopted_and_then_the_services() {
        let t = kept("ns/old");
        assert_eq!(judge(Some(&t), false), Verdict::Adopt);
        let mut claimed = t.clone();
        claimed.extend(claim_tags("ns/new"));
        assert_eq!(judge(Some(&claimed), false), Verdict::Adopted);
        // Once claimed it is the Service's even though it has its own name now.
        assert_eq!(judge(Some(&claimed), true), Verdict::Adopted);
        claimed.remove(tags::KEPT_TAG);
        assert_eq!(judge(Some(&claimed), false), Verdict::Adopted);
    }

    #[test]
    fn what_this_ccm_did_not_keep_is_refused_with_the_reason() {
        let refused = |v: Verdict, says: &str| match v {
            Verdict::Refused(why) => assert!(why.contains(says), "{why}"),
            other => panic!("{other:?}"),
        };
        // A kOps-style load balancer: the cluster tag alone.
        let kops = BTreeMap::from([(tags::cluster_tag_key(CLUSTER), "owned".into())]);
        refused(judge(Some(&kops), false), "not one this cluster's CCM made");
        // This CCM's name and tags, but not kept.
        let mut live = kept("ns/old");
        live.remove(tags::KEPT_TAG);
        refused(judge(Some(&live), false), "not kept by this CCM");
        // Another cluster's.
        let mut other = kept("ns/old");
        other.remove(&tags::cluster_tag_key(CLUSTER));
        other.insert(tags::cluster_tag_key("c2"), "owned".into());
        refused(judge(Some(&other), false), "cluster tag");
        refused(judge(None, false), "no NLB is named");
        refused(
            verdict(NAME, true, None, true, CLUSTER, "ns/new", false),
            "is a classic ELB, not the NLB",
        );
        refused(judge(Some(&kept("ns/old")), true), "already has its own");
        // Claimed by another Service first.
        let mut theirs = kept("ns/old");
        theirs.extend(claim_tags("ns/first"));
        refused(
            judge(Some(&theirs), false),
            "adopted by Service ns/first first",
        );
        // The adopter deleted while protected: kept again, adoptable again.
        let mut again = kept("ns/first");
        again.insert(tags::ADOPTED_TAG.into(), "ns/first".into());
        assert_eq!(judge(Some(&again), false), Verdict::Adopt);
    }

    #[test]
    fn the_naming_uid_gives_the_adopted_name_back() {
        assert_eq!(elb::load_balancer_name(&naming_uid(NAME)), NAME);
        // A UID that starts with `a` keeps it.
        let name = "aa123456789abcdef0123456789abcde";
        assert_eq!(elb::load_balancer_name(&naming_uid(name)), name);
    }

    #[test]
    fn the_annotation_asks_the_status_only_keeps() {
        use crate::aws::annotations::name_in_hostname;
        let uid = "fedcba98-7654-3210-fedc-ba9876543210";
        let own = elb::load_balancer_name(uid);
        let mut spec = crate::aws::annotations::LoadBalancerSpec::read(&Default::default()).spec;
        assert_eq!(wanted(&spec, uid), None);
        spec.held_name = Some(NAME.into());
        assert_eq!(wanted(&spec, uid), Some((NAME, false)));
        spec.adopt_name = Some(format!(" {NAME} "));
        assert_eq!(wanted(&spec, uid), Some((NAME, true)));
        spec.adopt_name = Some(own.clone());
        assert_eq!(wanted(&spec, uid), None);
        // The status's DNS names, classic (internal or not) and NLB.
        for h in [
            format!("{NAME}-1234567890.us-east-1.elb.amazonaws.com"),
            format!("internal-{NAME}-1234567890.us-east-1.elb.amazonaws.com"),
            format!("{NAME}-0123456789abcdef.elb.us-east-1.amazonaws.com"),
            format!("{NAME}.us-east-1.elb.amazonaws.com"),
        ] {
            assert_eq!(name_in_hostname(&h).as_deref(), Some(NAME), "{h}");
        }
        // Names this CCM does not give are no adoption to keep.
        for h in [
            "k8s-default-web-0123456789.elb.us-east-1.amazonaws.com",
            "a0123456789abcdef0123456789abcdeX.example",
            "short.example",
        ] {
            assert_eq!(name_in_hostname(h), None, "{h}");
        }
    }
}
