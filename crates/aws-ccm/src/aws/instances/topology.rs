//! `ec2:DescribeInstanceTopology`: the network nodes above an instance,
//! which become the `topology.k8s.aws/network-node-layer-N` node labels.
//!
//! The Go CCM's rules (its `instanceTopologyManager`), kept here:
//!
//! - an instance without a type (Fargate and other variants) is never asked;
//! - any other instance is asked unless its Region, its instance type or
//!   its instance ID is remembered as answering nothing (for
//!   [`UNSUPPORTED_TTL`], 24 hours as upstream);
//! - an empty answer for an instance whose type matches cloud.conf
//!   `SupportedTopologyInstanceTypePattern` ([`DEFAULT_PATTERN`] when
//!   unset) remembers the instance ID (it may be starting or stopping); for
//!   any other type it remembers the type, so one instance of a type
//!   without topology costs one call per day for the whole cluster;
//! - `UnsupportedOperation` (the Region lacks the API) and
//!   `UnauthorizedOperation` (the policy lacks the action) remember the
//!   Region: no labels, no error, no further calls for a day;
//! - any other failure is returned to the caller.
//!
//! Unlike upstream, which asks once per instance, concurrent questions are
//! batched through the one door: up to [`MAX_IDS_PER_CALL`] instance IDs per
//! call (the API's limit), each call paginated by `NextToken`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;
use regex::Regex;
use tokio::time::Instant;

use crate::aws::client::coalesce::{BatchFetch, Batcher};
use crate::aws::client::pages::every_page;
use crate::aws::client::{CallOptions, Core};
use crate::aws::{AwsError, Operation};

/// Upstream's `defaultSupportedTopologyInstanceTypePattern`: the instance
/// types AWS documents topology for (hpc*, trn*, p*).
const DEFAULT_PATTERN: &str = r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$";
/// How long an answer of "nothing here" is remembered (upstream's
/// `instanceTopologyManagerCacheTimeout`).
const UNSUPPORTED_TTL: Duration = Duration::from_secs(24 * 3600);
/// `InstanceId.N` values AWS accepts in one call.
const MAX_IDS_PER_CALL: usize = crate::provider::instances::MAX_TOPOLOGY_IDS;
/// How long one batch (its retries included) may take. Node initialization
/// waits for the answer, and a throttled question must not hold it back
/// for the door's minute of retrying: it fails instead, and the node
/// controller asks again later.
const QUESTION_DEADLINE: Duration = Duration::from_secs(10);

/// The network nodes of one instance, top layer first.
type NetworkNodes = Vec<String>;

/// Which instance types are expected to have a topology. `None` (only if
/// even the default failed to compile) expects none.
#[derive(Clone, Debug)]
struct TypePattern(Option<Regex>);

impl TypePattern {
    /// cloud.conf's pattern, else upstream's default. The pattern was
    /// validated when cloud.conf was read; one that still does not compile
    /// falls back to the default with an error in the log.
    pub(crate) fn new(configured: Option<&str>) -> TypePattern {
        let configured = configured.filter(|p| !p.is_empty()).and_then(|pattern| {
            Regex::new(pattern)
                .map_err(|e| {
                    tracing::error!(pattern, error = %e, "SupportedTopologyInstanceTypePattern does not compile; using the default {DEFAULT_PATTERN}");
                })
                .ok()
        });
        TypePattern(configured.or_else(|| Regex::new(DEFAULT_PATTERN).ok()))
    }

    /// Upstream's `DoesInstanceTypeRequireResponse` (unanchored, as Go's
    /// `MatchString`).
    pub(crate) fn expects_topology(&self, instance_type: &str) -> bool {
        self.0.as_ref().is_some_and(|r| r.is_match(instance_type))
    }
}

/// What one answer teaches, for one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Learned {
    /// Remember this key (Region, instance type or instance ID) as
    /// answering nothing.
    Unsupported(String),
}

/// Upstream's rule for an answer that lists no topology for `id`.
fn learn_from_empty(pattern: &TypePattern, id: &str, instance_type: &str) -> Learned {
    if pattern.expects_topology(instance_type) {
        Learned::Unsupported(id.to_string())
    } else {
        Learned::Unsupported(instance_type.to_string())
    }
}

/// Upstream's rule for a failed call: what to remember for the codes that
/// mean "not here" (no labels, no error); `None` for a failure the caller
/// gets.
fn learn_from_error(region: &str, err: &AwsError) -> Option<Learned> {
    (err.is_unsupported() || err.is_denied()).then(|| Learned::Unsupported(region.to_string()))
}

/// Keys remembered as answering nothing, each until its deadline.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    until: HashMap<String, Instant>,
}

impl Memory {
    fn remember(&mut self, learned: Learned, now: Instant) {
        let Learned::Unsupported(key) = learned;
        // Entries past their deadline go when a new one comes: the map
        // holds at most the keys of one day.
        self.until.retain(|_, until| *until > now);
        self.until.insert(key, now + UNSUPPORTED_TTL);
    }

    fn knows(&self, key: &str, now: Instant) -> bool {
        self.until.get(key).is_some_and(|until| *until > now)
    }

    /// Upstream's `mightSupportTopology`: a typed instance whose Region,
    /// ID and type are not remembered.
    fn might_support(&self, region: &str, id: &str, instance_type: &str, now: Instant) -> bool {
        !instance_type.is_empty()
            && !self.knows(region, now)
            && !self.knows(id, now)
            && !self.knows(instance_type, now)
    }
}

/// The topology questions of one client: the pattern, the memory and the
/// batcher.
pub(in crate::aws) struct Topology {
    pattern: TypePattern,
    region: String,
    memory: Mutex<Memory>,
    batcher: Batcher<String, NetworkNodes>,
}

impl Topology {
    pub(in crate::aws) fn new(core: Arc<Core>, region: String, pattern: Option<&str>) -> Topology {
        Topology {
            pattern: TypePattern::new(pattern),
            region,
            memory: Mutex::default(),
            batcher: Batcher::new(
                "instance_topology",
                Operation::Ec2DescribeInstanceTopology,
                core.options.coalesce_window,
                MAX_IDS_PER_CALL,
                fetch(core),
            ),
        }
    }

    pub(in crate::aws) fn expects_topology(&self, instance_type: &str) -> bool {
        self.pattern.expects_topology(instance_type)
    }

    /// The instance's network nodes; `Ok(None)` when it has none or is not
    /// asked (see the module docs).
    pub(in crate::aws) async fn network_nodes(
        &self,
        id: &str,
        instance_type: Option<&str>,
    ) -> Result<Option<NetworkNodes>, AwsError> {
        let instance_type = instance_type.unwrap_or_default();
        if !(self.memory.lock()).might_support(&self.region, id, instance_type, Instant::now()) {
            return Ok(None);
        }
        let learned = match self.batcher.get(id.to_string()).await {
            Ok(Some(nodes)) if !nodes.is_empty() => return Ok(Some(nodes)),
            Ok(_) => {
                let learned = learn_from_empty(&self.pattern, id, instance_type);
                if self.pattern.expects_topology(instance_type) {
                    tracing::warn!(
                        instance_id = id,
                        instance_type,
                        "no instance topology listed for an instance of a type that should have one (it may be starting or stopping); asked again in 24h"
                    );
                } else {
                    tracing::info!(
                        instance_type,
                        "instance type has no instance topology; not asked again for 24h"
                    );
                }
                learned
            }
            Err(err) => match learn_from_error(&self.region, &err) {
                Some(learned) => {
                    tracing::warn!(region = %self.region, error = %err, "ec2:DescribeInstanceTopology is not available (the Region lacks it, or the IAM policy does not grant it); no network-node labels, asked again in 24h");
                    learned
                }
                None => return Err(err),
            },
        };
        self.memory.lock().remember(learned, Instant::now());
        Ok(None)
    }
}

/// The batch call: `DescribeInstanceTopology` for up to 100 IDs, every page.
fn fetch(core: Arc<Core>) -> BatchFetch<String, NetworkNodes> {
    Arc::new(move |ids: Vec<String>| {
        let core = core.clone();
        async move {
            let (core, ids) = (&core, &ids);
            let opts = CallOptions::within(QUESTION_DEADLINE);
            every_page(|next_token| async move {
                let page = core
                    .shared_ec2(Operation::Ec2DescribeInstanceTopology, opts, |ec2| {
                        ec2.describe_instance_topology()
                            .set_instance_ids(Some(ids.clone()))
                            .set_next_token(next_token.clone())
                            .send()
                    })
                    .await?;
                let found: Vec<_> = page
                    .instances()
                    .iter()
                    .filter_map(|e| {
                        Some((e.instance_id()?.to_string(), e.network_nodes().to_vec()))
                    })
                    .collect();
                Ok((found, page.next_token().map(str::to_string)))
            })
            .await
        }
        .boxed()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_pattern_is_upstreams() {
        let p = TypePattern::new(None);
        for t in [
            "p4d.24xlarge",
            "p5.48xlarge",
            "trn1n.32xlarge",
            "hpc7g.16xlarge",
            "p5e.48xlarge",
        ] {
            assert!(p.expects_topology(t), "{t}");
        }
        for t in ["m5.large", "c5.xlarge", "g6.xlarge", "", "p4d"] {
            assert!(!p.expects_topology(t), "{t}");
        }
        // An empty setting is unset, as upstream's `!= ""`.
        assert!(TypePattern::new(Some("")).expects_topology("p4d.24xlarge"));
        // Unanchored like Go's MatchString.
        let custom = TypePattern::new(Some("t3.large"));
        assert!(custom.expects_topology("xt3.large"));
        assert!(!custom.expects_topology("p4d.24xlarge"));
    }

    #[test]
    fn empty_answers_remember_the_id_of_an_expected_type_else_the_type() {
        let p = TypePattern::new(None);
        assert_eq!(
            learn_from_empty(&p, "i-1", "p5.48xlarge"),
            Learned::Unsupported("i-1".into())
        );
        assert_eq!(
            learn_from_empty(&p, "i-1", "m5.large"),
            Learned::Unsupported("m5.large".into())
        );
    }

    #[test]
    fn unsupported_and_unauthorized_remember_the_region_others_fail() {
        use crate::aws::client::errors::{AttemptFailure, ErrorClass};
        let answer = |class, code: Option<&str>| {
            let failure = AttemptFailure::new(class, code, "from EC2");
            AwsError::from_attempt(Operation::Ec2DescribeInstanceTopology, failure, 1)
        };
        for code in ["UnsupportedOperation", "UnauthorizedOperation"] {
            assert_eq!(
                learn_from_error("us-east-1", &answer(ErrorClass::Fatal, Some(code))),
                Some(Learned::Unsupported("us-east-1".into()))
            );
        }
        for (class, code) in [
            (ErrorClass::Throttling, Some("RequestLimitExceeded")),
            (ErrorClass::Transient, Some("InternalError")),
            (ErrorClass::Transient, None),
        ] {
            assert_eq!(learn_from_error("us-east-1", &answer(class, code)), None);
        }
    }

    #[test]
    fn memory_holds_keys_for_a_day_and_never_asks_untyped_instances() {
        let t0 = Instant::now();
        let mut m = Memory::default();
        assert!(m.might_support("r", "i-1", "m5.large", t0));
        assert!(!m.might_support("r", "i-1", "", t0), "Fargate: no type");
        m.remember(Learned::Unsupported("m5.large".into()), t0);
        assert!(!m.might_support("r", "i-1", "m5.large", t0));
        assert!(m.might_support("r", "i-2", "p5.48xlarge", t0));
        m.remember(Learned::Unsupported("i-2".into()), t0);
        assert!(!m.might_support("r", "i-2", "p5.48xlarge", t0));
        assert!(m.might_support("r", "i-3", "p5.48xlarge", t0));
        m.remember(Learned::Unsupported("r".into()), t0);
        assert!(!m.might_support("r", "i-3", "p5.48xlarge", t0));
        assert!(m.might_support("other", "i-3", "p5.48xlarge", t0));
        let later = t0 + UNSUPPORTED_TTL + Duration::from_secs(1);
        assert!(m.might_support("r", "i-1", "m5.large", later));
        assert!(m.might_support("r", "i-2", "p5.48xlarge", later));
        // Expired entries are dropped when new ones come.
        m.remember(Learned::Unsupported("x".into()), later);
        assert_eq!(m.until.len(), 1);
    }
}
