//! Why a Service's last sync did not finish, where it lasts: its
//! `LoadBalancerSynced` status condition and the
//! `aws_ccm_service_sync_state{state, error_class}` gauge. Events age out
//! after an hour; these stay until the next sync says otherwise.
//!
//! The condition is written only once a sync stops short (`False`, with
//! the Warning's text), and turned `True` by the next one that finishes: a
//! Service whose syncs always finish, as every Service after a swap from
//! the Go CCM whose syncs did there, gets no status write from it. The
//! write is a strategic merge patch keyed on the condition's `type`, so
//! other writers' conditions stay.
//!
//! The gauge needs where each Service was counted, to move it: that map
//! is here, keyed as the controller's state and forgotten where that is (a
//! deleted Service at the scan), and besides at a sync that finds the
//! Service no longer this CCM's ([`cleared`]) and when the controller
//! stops ([`forget_all`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::provider::ErrorKind;

/// The condition's type.
pub(super) const CONDITION: &str = "LoadBalancerSynced";
/// Its reason when the last sync finished.
const SYNCED: &str = "Synced";
/// The API server's limit on a condition's message, in bytes (Go's `len`
/// in apimachinery's `ValidateCondition`).
const MAX_MESSAGE: usize = 32 * 1024;

/// Why a sync stopped short.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stop {
    /// A value the Go CCM refuses too: the Service waits for a fix.
    RefusedValue,
    /// A value taken as the Go CCM takes it that holds the load balancer
    /// back: the Service waits for a fix.
    HeldValue,
    /// The cloud failed or refused the sync; retried with backoff.
    Cloud(ErrorKind),
    /// A write to the API server (finalizer, status) failed; retried.
    Kubernetes,
}

impl Stop {
    /// The condition's reason.
    fn reason(self) -> &'static str {
        match self {
            Stop::RefusedValue => "RefusedValue",
            Stop::HeldValue => "HeldValue",
            Stop::Kubernetes => "KubernetesWriteFailed",
            Stop::Cloud(kind) => match kind {
                ErrorKind::NotFound => "CloudNotFound",
                ErrorKind::Throttled => "CloudThrottled",
                ErrorKind::Transient => "CloudUnavailable",
                ErrorKind::Denied => "CloudDenied",
                ErrorKind::InUse => "CloudResourceInUse",
                ErrorKind::AlreadyExists => "CloudAlreadyExists",
                ErrorKind::Rejected => "CloudRejected",
                ErrorKind::Invalid => "InvalidValue",
            },
        }
    }

    /// The metric's `error_class`.
    fn class(self) -> &'static str {
        match self {
            Stop::RefusedValue => "refused_value",
            Stop::HeldValue => "held_value",
            Stop::Kubernetes => "kubernetes",
            Stop::Cloud(kind) => match kind {
                ErrorKind::NotFound => "not_found",
                ErrorKind::Throttled => "throttled",
                ErrorKind::Transient => "transient",
                ErrorKind::Denied => "denied",
                ErrorKind::InUse => "in_use",
                ErrorKind::AlreadyExists => "already_exists",
                ErrorKind::Rejected => "rejected",
                ErrorKind::Invalid => "invalid_value",
            },
        }
    }

    /// The metric's `state`: waiting for the user, or retried by itself.
    fn state(self) -> &'static str {
        match self {
            Stop::RefusedValue | Stop::HeldValue => "waiting_for_fix",
            Stop::Cloud(_) | Stop::Kubernetes => "retrying",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
    error_class: &'static str,
}

/// The gauge, and each Service's place in it.
struct States {
    of: Mutex<HashMap<String, StateLabels>>,
    gauge: Family<StateLabels, Gauge>,
}

impl States {
    /// Counts the Service of `key` under `labels` (`None`: not at all),
    /// out of where it was.
    fn count(&self, key: &str, labels: Option<StateLabels>) {
        let mut of = self.of.lock();
        let old = match &labels {
            Some(l) => of.insert(key.to_string(), l.clone()),
            None => of.remove(key),
        };
        if old == labels {
            return;
        }
        if let Some(o) = old {
            self.gauge.get_or_create(&o).dec();
        }
        if let Some(n) = labels {
            self.gauge.get_or_create(&n).inc();
        }
    }
}

impl States {
    /// Counts no Service at all.
    fn clear(&self) {
        for (_, labels) in self.of.lock().drain() {
            self.gauge.get_or_create(&labels).dec();
        }
    }
}

static STATES: LazyLock<States> = LazyLock::new(|| States {
    of: Mutex::default(),
    gauge: crate::metrics::registered(
        "aws_ccm_service_sync_state",
        "LoadBalancer Services this CCM syncs, by how their last sync ended: state synced (error_class none), waiting_for_fix (a refused or held value) or retrying (a cloud or API server failure), with the error_class",
        Family::default(),
    ),
});

fn count(key: &str, labels: Option<StateLabels>) {
    STATES.count(key, labels);
}

/// The Service of `key` is gone, or no longer this CCM's: out of the gauge.
pub(super) fn forget(key: &str) {
    count(key, None);
}

/// The controller stopped (this process lost the lease, or shuts down):
/// it counts no Service, so a standby reports none, and a Service deleted
/// meanwhile is not counted by the next term (whose scan never saw it).
pub(super) fn forget_all() {
    STATES.clear();
}

/// The last sync of `svc` finished.
pub(super) async fn finished(api: &Api<Service>, svc: &Service) {
    count(
        &super::key(svc),
        Some(StateLabels {
            state: "synced",
            error_class: "none",
        }),
    );
    // Only a condition this CCM wrote before is turned True.
    if current(svc).is_some_and(|c| c.status != "True") {
        write(
            api,
            svc,
            "True",
            SYNCED,
            "The last sync of the load balancer finished",
        )
        .await;
    }
}

/// The last sync of `svc` stopped short for `stop`; `message` is the
/// Warning event's text.
pub(super) async fn stopped(api: &Api<Service>, svc: &Service, stop: Stop, message: &str) {
    count(
        &super::key(svc),
        Some(StateLabels {
            state: stop.state(),
            error_class: stop.class(),
        }),
    );
    let message = truncated(&without_request_id(message));
    let same = current(svc)
        .is_some_and(|c| c.status == "False" && c.reason == stop.reason() && c.message == message);
    if !same {
        write(api, svc, "False", stop.reason(), &message).await;
    }
}

/// `svc` no longer wants a load balancer of this CCM (deleted, another
/// type, handed to another controller): out of the gauge, and its condition
/// removed (a Service being deleted keeps it).
pub(super) async fn cleared(api: &Api<Service>, svc: &Service) {
    forget(&super::key(svc));
    if svc.metadata.deletion_timestamp.is_some() || current(svc).is_none() {
        return;
    }
    let body =
        serde_json::json!({"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}});
    patch_status(api, svc, body, "remove").await;
}

/// A write of the sync to the API server (`what`: "add the finalizer")
/// failed with `e`.
pub(super) async fn write_failed(api: &Api<Service>, svc: &Service, what: &str, e: &kube::Error) {
    let message = format!("failed to {what}: {e}; retried with backoff");
    stopped(api, svc, Stop::Kubernetes, &message).await;
}

/// Whether `svc` carries the condition (this CCM wrote it).
pub(super) fn carried(svc: &Service) -> bool {
    current(svc).is_some()
}

fn current(svc: &Service) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let conditions = svc.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == CONDITION)
}

/// `message` without the AWS request IDs it names (`" (request id …)"`,
/// the door's error text): a new one at each retry of the same failure
/// would otherwise make each retry a status write. The event keeps them.
fn without_request_id(message: &str) -> String {
    const MARK: &str = " (request id ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((before, after)) = rest.split_once(MARK) {
        let Some((_, tail)) = after.split_once(')') else {
            break;
        };
        out.push_str(before);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// `message` cut to at most [`MAX_MESSAGE`] bytes, at a character's end.
fn truncated(message: &str) -> String {
    let mut end = message.len().min(MAX_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message.get(..end).unwrap_or_default().to_string()
}

/// The condition, as a strategic merge patch of the status: the transition
/// time moves only when the status does.
fn patch(svc: &Service, status: &str, reason: &str, message: &str, now: &str) -> serde_json::Value {
    let since = current(svc)
        .filter(|c| c.status == status)
        .and_then(|c| serde_json::to_value(&c.last_transition_time).ok())
        .unwrap_or_else(|| serde_json::json!(now));
    serde_json::json!({"status": {"conditions": [{
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": svc.metadata.generation.unwrap_or_default(),
        "lastTransitionTime": since,
    }]}})
}

async fn write(api: &Api<Service>, svc: &Service, status: &str, reason: &str, message: &str) {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    patch_status(api, svc, patch(svc, status, reason, message, &now), "write").await;
}

/// Sends `body`, a strategic merge patch of the condition, to the status
/// of `svc` (`what`: "write", "remove"). A failed write is only logged: the
/// next sync writes it again, and the sync's own outcome (and its event)
/// stands either way.
async fn patch_status(api: &Api<Service>, svc: &Service, body: serde_json::Value, what: &str) {
    let params = PatchParams::default();
    if let Err(e) = (api.patch_status(&svc.name_any(), &params, &Patch::Strategic(body))).await {
        tracing::warn!(error = %e, condition = CONDITION, "failed to {what} the Service's sync condition");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(conditions: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 3},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let old = svc(
            serde_json::json!([{"type": CONDITION, "status": "False", "reason": "RefusedValue",
            "message": "a", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
        );
        let now = "2026-02-02T00:00:00Z";
        let again = patch(&old, "False", "CloudDenied", "b", now);
        assert_eq!(
            again["status"]["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(again["status"]["conditions"][0]["observedGeneration"], 3);
        let flipped = patch(&old, "True", SYNCED, "done", now);
        assert_eq!(
            flipped["status"]["conditions"][0]["lastTransitionTime"],
            now
        );
    }

    #[test]
    fn each_service_is_counted_once_where_its_last_sync_left_it() {
        let states = States {
            of: Mutex::default(),
            gauge: Family::default(),
        };
        let denied = Stop::Cloud(ErrorKind::Denied);
        let labels = |state, error_class| StateLabels { state, error_class };
        let at = |l: StateLabels| states.gauge.get_or_create(&l).get();
        states.count("default/a", Some(labels(denied.state(), denied.class())));
        states.count("default/a", Some(labels(denied.state(), denied.class())));
        states.count("default/b", Some(labels("synced", "none")));
        assert_eq!(at(labels("retrying", "denied")), 1);
        states.count("default/a", Some(labels("synced", "none")));
        assert_eq!(at(labels("retrying", "denied")), 0);
        assert_eq!(at(labels("synced", "none")), 2);
        states.count("default/a", None);
        states.count("default/a", None);
        assert_eq!(at(labels("synced", "none")), 1);
        states.count("default/c", Some(labels(denied.state(), denied.class())));
        states.clear();
        assert_eq!(at(labels("synced", "none")), 0);
        assert_eq!(at(labels("retrying", "denied")), 0);
    }

    #[test]
    fn a_retry_of_the_same_failure_writes_the_same_message() {
        let at = |id: &str| {
            format!(
                "ELB CreateLoadBalancer failed after 1 attempt(s): AccessDenied: no (request id {id}). Grant it"
            )
        };
        let once = without_request_id(&at("a-1"));
        assert_eq!(once, without_request_id(&at("b-2")));
        assert_eq!(
            once,
            "ELB CreateLoadBalancer failed after 1 attempt(s): AccessDenied: no. Grant it"
        );
        assert_eq!(without_request_id("x (request id y"), "x (request id y");
    }

    #[test]
    fn a_long_message_is_cut_at_the_api_servers_limit() {
        let long = "é".repeat(MAX_MESSAGE + 5);
        // Bytes, as the API server counts: 16,384 two-byte characters.
        assert_eq!(truncated(&long).len(), MAX_MESSAGE);
        assert_eq!(truncated(&long).chars().count(), MAX_MESSAGE / 2);
        assert_eq!(truncated(&format!("a{long}")).len(), MAX_MESSAGE - 1);
        assert_eq!(truncated("short"), "short");
    }
}
