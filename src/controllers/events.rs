//! Kubernetes Events for controllers (events.k8s.io/v1 through kube's
//! `Recorder`, which also folds repeats into series).
//!
//! Publishing is best effort: a failed event is logged, never an error of the
//! reconcile that emitted it, as with client-go's recorder.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes events as one controller (`reportingController`).
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    /// `controller` is the upstream component name, e.g. `cloud-node-controller`.
    pub fn new(client: Client, controller: &str) -> Events {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: std::env::var("POD_NAME")
                .ok()
                .or_else(|| Some(gethostname::gethostname().to_string_lossy().into_owned())),
        };
        Events {
            recorder: Recorder::new(client, reporter),
        }
    }

    pub async fn normal(&self, object: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(object, EventType::Normal, reason, note.into())
            .await;
    }

    pub async fn warning(&self, object: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.publish(object, EventType::Warning, reason, note.into())
            .await;
    }

    async fn publish(
        &self,
        object: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            // The API server rejects notes over 1 kB.
            note: Some(truncate(&note, 1024)),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, object).await {
            tracing::warn!(error = %e, reason, object = ?object.name, "failed to publish event");
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let note = "é".repeat(600);
        let cut = super::truncate(&note, 1024);
        assert!(cut.len() <= 1024 && note.starts_with(&cut));
        assert_eq!(super::truncate("short", 1024), "short");
    }
}
