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

use http::HeaderMap;

use crate::iam::RecordedRequest;
use crate::records::JsonLines;

/// The environment variable naming the recording directory.
pub const RECORD_ENV: &str = "AWS_CCM_RECORD_ACTIONS";

/// What the CCM's SDK clients put in their user agent.
pub const CCM_APP_MARK: &str = "app/aws-ccm";

pub(super) struct Recorder {
    lines: JsonLines,
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
        Recorder {
            lines: JsonLines::from_env(RECORD_ENV, port, "requests"),
        }
    }

    pub(super) fn is_on(&self) -> bool {
        self.lines.is_on()
    }

    /// Notes one request from the CCM.
    pub(super) fn record(&self, request: &RecordedRequest) {
        if !self.is_on() {
            return;
        }
        let read = ["Describe", "Get", "List"]
            .iter()
            .any(|p| request.action.starts_with(p));
        if read {
            let bare = RecordedRequest {
                service: request.service.clone(),
                action: request.action.clone(),
                region: request.region.clone(),
                ..RecordedRequest::default()
            };
            self.lines.append(&bare, "AWS request");
        } else {
            self.lines.append(request, "AWS request");
        }
    }
}
