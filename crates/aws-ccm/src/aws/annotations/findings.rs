//! What a [`Reading`] tells the user, in words: the one place the text of
//! its Warning events and of its admission warnings is made, so that what
//! `kubectl apply` prints (the service admission check, `server::admission`)
//! is what the service controller's events say.

use super::{Holds, Reading, SpecNote};

/// The Warning reason of a refused value (upstream's sync failure reason).
pub const SYNC_FAILED: &str = "SyncLoadBalancerFailed";

/// One thing to tell the user: an event's reason and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub(crate) reason: &'static str,
    pub message: String,
}

impl Reading {
    /// The values taken as the Go CCM takes them, one finding each, those
    /// that hold something first; `exists`: the Service has a load balancer.
    pub(crate) fn note_findings(&self, exists: bool) -> Vec<Finding> {
        let mut notes: Vec<&SpecNote> = self.notes.iter().collect();
        notes.sort_by_key(|n| n.holds == Holds::Nothing);
        notes
            .into_iter()
            .map(|note| Finding {
                reason: note.reason,
                message: format!("{note}{}", held(note, exists)),
            })
            .collect()
    }

    /// The refused values, joined: the message of the one
    /// [`SYNC_FAILED`] Warning a sync gives them; `None` when none is.
    pub(crate) fn refusal(&self, exists: bool) -> Option<String> {
        if self.errors.is_empty() {
            return None;
        }
        let refused = self
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        Some(format!(
            "Error syncing load balancer: {refused}. {}; fix the Service",
            kept(exists)
        ))
    }

    /// Every value refused, held or noted, one line each with its fix: the
    /// admission warnings. A refused value's line says what the
    /// [`Self::refusal`] event says of it.
    pub fn findings(&self, exists: bool) -> Vec<Finding> {
        let refused = self.errors.iter().map(|e| Finding {
            reason: SYNC_FAILED,
            message: format!("{e}. {}; fix the Service", kept(exists)),
        });
        refused.chain(self.note_findings(exists)).collect()
    }
}

/// What a refused value leaves of the sync.
fn kept(exists: bool) -> &'static str {
    if exists {
        "The Go CCM refuses it too. Only the change it governs waits: the load balancer's backends and node security rules are kept current"
    } else {
        "The Go CCM refuses it too. No AWS call was made"
    }
}

fn held(note: &SpecNote, exists: bool) -> &'static str {
    if note.holds != Holds::Nothing && !exists {
        "; no load balancer is made until it is fixed"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LoadBalancerSpec, SpecError};
    use super::*;

    fn note(field: &str, holds: Holds) -> SpecNote {
        SpecNote {
            field: field.into(),
            value: "v".into(),
            reading: "read as x".into(),
            fix: "write y".into(),
            holds,
            reason: super::super::TOLERATED,
        }
    }

    #[test]
    fn findings_list_each_refused_held_and_noted_value_with_its_fix() {
        let reading = Reading {
            spec: LoadBalancerSpec::default(),
            notes: vec![note("a", Holds::Nothing), note("b", Holds::New)],
            errors: vec![SpecError {
                field: "c".into(),
                value: "bad".into(),
                allowed: "allowed: 1 to 3".into(),
            }],
        };
        let new = reading.findings(false);
        let texts: Vec<&str> = new.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(
            texts,
            [
                "c=\"bad\" is invalid: allowed: 1 to 3. The Go CCM refuses it too. No AWS call was made; fix the Service",
                "b=\"v\": read as x; write y; no load balancer is made until it is fixed",
                "a=\"v\": read as x; write y",
            ]
        );
        assert_eq!(new[0].reason, SYNC_FAILED);
        // On a Service with a load balancer nothing is held back from being made.
        assert!(
            !reading.findings(true)[1]
                .message
                .contains("no load balancer")
        );
        assert!(
            reading
                .refusal(true)
                .is_some_and(|m| m.starts_with("Error syncing load balancer: c=\"bad\""))
        );
        let clean = Reading {
            notes: vec![],
            errors: vec![],
            ..reading
        };
        assert!(clean.findings(false).is_empty() && clean.refusal(false).is_none());
    }
}
