//! Records the AWS requests the CCM itself sends, for the IAM evaluation
//! test (`crates/aws-ccm/tests/iam_policy.rs`).
//!
//! When `AWS_CCM_RECORD_ACTIONS` names a directory, every proxy appends each
//! distinct request it receives from the CCM to its own file there, one JSON
//! [`RecordedRequest`] per line: parameters, region, and the tags the named
//! resources had just before it was forwarded. Reads are written once per
//! action (AWS authorizes them against `*`), writes every time they differ.
//! The CCM is recognised by the `app/aws-ccm` app name its SDK clients put in
//! the user agent; test-side seeding and the proxy's own tests send no such
//! header and are not recorded.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use http::HeaderMap;
use parking_lot::Mutex;

use crate::iam::RecordedRequest;

/// The environment variable naming the recording directory.
pub const RECORD_ENV: &str = "AWS_CCM_RECORD_ACTIONS";

/// What the CCM's SDK clients put in their user agent.
pub const CCM_APP_MARK: &str = "app/aws-ccm";

pub(super) struct Recorder {
    file: Option<PathBuf>,
    seen: Mutex<HashSet<String>>,
}

/// Whether a request came from the CCM (by its user agent's app name).
pub(super) fn from_ccm(headers: &HeaderMap) -> bool {
    ["user-agent", "x-amz-user-agent"].iter().any(|h| {
        headers
            .get(*h)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains(CCM_APP_MARK))
    })
}

impl Recorder {
    /// A recorder writing to `<dir>/<pid>-<port>.requests` when
    /// `AWS_CCM_RECORD_ACTIONS` is set, else one that records nothing.
    pub(super) fn from_env(port: u16) -> Recorder {
        let file = std::env::var_os(RECORD_ENV)
            .filter(|d| !d.is_empty())
            .map(|dir| PathBuf::from(dir).join(format!("{}-{port}.requests", std::process::id())));
        Recorder {
            file,
            seen: Mutex::new(HashSet::new()),
        }
    }

    pub(super) fn is_on(&self) -> bool {
        self.file.is_some()
    }

    /// Notes one request from the CCM.
    pub(super) fn record(&self, request: &RecordedRequest) {
        let Some(path) = &self.file else { return };
        let read = ["Describe", "Get", "List"]
            .iter()
            .any(|p| request.action.starts_with(p));
        let line = if read {
            let bare = RecordedRequest {
                service: request.service.clone(),
                action: request.action.clone(),
                region: request.region.clone(),
                ..RecordedRequest::default()
            };
            serde_json::to_string(&bare)
        } else {
            serde_json::to_string(request)
        };
        let Ok(mut line) = line else { return };
        if !self.seen.lock().insert(line.clone()) {
            return;
        }
        line.push('\n');
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "cannot record AWS request");
        }
    }
}
