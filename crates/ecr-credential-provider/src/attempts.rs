//! One stderr line per failed attempt, from verbosity 2: which call, which
//! attempt, what came back. Only the HTTP status and the error type header
//! are read, never a body or a request, so nothing secret can show.

use std::sync::atomic::{AtomicU32, Ordering};

use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::FinalizerInterceptorContextRef;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

use crate::log::Log;

/// The verbosity from which failed attempts are shown.
pub const LEVEL: u8 = 2;

#[derive(Debug)]
pub struct AttemptLog {
    call: &'static str,
    log: Log,
    attempts: AtomicU32,
}

impl AttemptLog {
    pub fn new(call: &'static str, log: Log) -> AttemptLog {
        AttemptLog {
            call,
            log,
            attempts: AtomicU32::new(0),
        }
    }
}

impl Intercept for AttemptLog {
    fn name(&self) -> &'static str {
        "AttemptLog"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let failed = !matches!(context.output_or_error(), Some(Ok(_)));
        if !failed {
            return Ok(());
        }
        let what = match context.response() {
            Some(response) => {
                let status = response.status().as_u16();
                match response.headers().get("x-amzn-errortype") {
                    // "ThrottlingException:http://internal..." on some APIs.
                    Some(kind) => {
                        format!("HTTP {status} {}", kind.split(':').next().unwrap_or(kind))
                    }
                    None => format!("HTTP {status}"),
                }
            }
            None => "no answer (connection failed or timed out)".to_owned(),
        };
        self.log.info(
            LEVEL,
            &format!("{} attempt {attempt} failed: {what}", self.call),
        );
        Ok(())
    }
}
