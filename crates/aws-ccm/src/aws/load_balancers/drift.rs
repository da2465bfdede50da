//! Create-time settings a sync leaves as they are, and type changes it
//! refuses, on load balancers this CCM did not create (see
//! `crate::aws::applied`).

use std::collections::BTreeMap;

use super::{CloudError, Warning};
use crate::aws::annotations::TYPE;
use crate::aws::applied::{self, Applied, Kind};
use crate::aws::ownership::{self, Made};
use crate::aws::tags;

/// The Warning for create-time settings left as they are; `None` when none are.
pub(crate) fn drift_warning(
    service_key: &str,
    lb_name: &str,
    lb_tags: Option<&BTreeMap<String, String>>,
    diffs: &[String],
) -> Option<Warning> {
    let lb_tags = lb_tags.filter(|_| !diffs.is_empty())?;
    let record = Applied::from_tags(lb_tags).is_some();
    Some(Warning {
        reason: applied::DRIFT_REASON,
        message: applied::drift_message(service_key, lb_name, record, diffs),
    })
}

/// Whether the Service may move off the existing load balancer of kind
/// `from` (tags `lb_tags`), which is then deleted: only one this CCM
/// created (it carries the record) and proven made for this Service
/// ([`ownership`]). Otherwise a configuration error, as the Go CCM refuses
/// type changes.
pub(crate) fn handover_allowed(
    service_key: &str,
    lb_name: &str,
    from: Kind,
    lb_tags: &BTreeMap<String, String>,
    cluster_id: &str,
) -> Result<(), CloudError> {
    let proven = ownership::prove(
        Made::LoadBalancer,
        lb_name,
        lb_tags,
        cluster_id,
        Some(service_key),
    );
    let why = match (Applied::from_tags(lb_tags), proven) {
        (Some(_), Ok(())) => return Ok(()),
        (Some(_), Err(not_made)) => {
            format!("this one is not proven made for the Service: {not_made}")
        }
        (None, _) => format!(
            "this one has no {} tag: made by the Go CCM, which refuses type changes, or by an older aws-ccm",
            tags::APPLIED_TAG
        ),
    };
    let (have, want, back) = match from {
        Kind::Network => (
            "a Network Load Balancer",
            "a Classic ELB",
            format!("set {TYPE} back to nlb"),
        ),
        Kind::Classic => (
            "a Classic ELB",
            "a Network Load Balancer",
            format!("remove {TYPE}"),
        ),
    };
    Err(CloudError::invalid(format!(
        "{service_key} has {have} ({lb_name}) and now asks for {want}: aws-ccm changes the type only of a load balancer it created ({why}); {back}, or delete and recreate the Service"
    )))
}
