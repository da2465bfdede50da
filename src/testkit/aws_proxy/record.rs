//! Records which AWS actions the CCM itself sends, for the IAM policy
//! coverage test (`tests/iam_coverage.rs`).
//!
//! When `AWS_CCM_RECORD_ACTIONS` names a directory, every proxy appends each
//! distinct `service Action` it forwards from the CCM to its own file there.
//! The CCM is recognised by the `app/aws-ccm` app name its SDK clients put in
//! the user agent; test-side seeding and the proxy's own tests send no such
//! header and are not recorded.

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use http::HeaderMap;
use parking_lot::Mutex;

/// The environment variable naming the recording directory.
pub const RECORD_ENV: &str = "AWS_CCM_RECORD_ACTIONS";

/// What the CCM's SDK clients put in their user agent.
pub const CCM_APP_MARK: &str = "app/aws-ccm";

pub(super) struct Recorder {
    file: Option<PathBuf>,
    seen: Mutex<HashSet<(String, String)>>,
}

impl Recorder {
    /// A recorder writing to `<dir>/<pid>-<port>.actions` when
    /// `AWS_CCM_RECORD_ACTIONS` is set, else one that records nothing.
    pub(super) fn from_env(port: u16) -> Recorder {
        let file = std::env::var_os(RECORD_ENV)
            .filter(|d| !d.is_empty())
            .map(|dir| PathBuf::from(dir).join(format!("{}-{port}.actions", std::process::id())));
        Recorder {
            file,
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// Notes one call if it came from the CCM.
    pub(super) fn record(&self, headers: &HeaderMap, service: &str, action: &str) {
        let Some(path) = &self.file else { return };
        let from_ccm = ["user-agent", "x-amz-user-agent"].iter().any(|h| {
            headers
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains(CCM_APP_MARK))
        });
        if !from_ccm {
            return;
        }
        let mut seen = self.seen.lock();
        if !seen.insert((service.to_string(), action.to_string())) {
            return;
        }
        let line = format!("{service} {action}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(err) = written {
            tracing::warn!(path = %path.display(), %err, "cannot record AWS action");
        }
    }
}
