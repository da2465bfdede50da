//! Lines on stderr, klog-style verbosity (`-v=N`), nothing else.
//!
//! The kubelet shows a failed plugin's stderr in its own log and events, so
//! every line is written to be read there. No logging framework is installed:
//! the AWS SDK's own `tracing` events (which at trace level describe
//! requests and answers) go nowhere, at any verbosity. What this plugin
//! writes never holds a secret: tokens and passwords are `Secret`s, whose
//! formatting is `<redacted>`.

use std::io::Write as _;

#[derive(Clone, Copy, Debug, Default)]
pub struct Log {
    verbosity: u8,
}

impl Log {
    pub fn new(verbosity: u8) -> Log {
        Log { verbosity }
    }

    /// A line shown from verbosity `level` up.
    pub fn info(&self, level: u8, message: &str) {
        if self.verbosity >= level {
            line("", message);
        }
    }

    /// A failure: always shown.
    pub fn error(&self, message: &str) {
        line("error: ", message);
    }
}

fn line(prefix: &str, message: &str) {
    let mut stderr = std::io::stderr().lock();
    // Nothing to do if stderr is gone: the exit code still tells.
    let _ = writeln!(stderr, "ecr-credential-provider: {prefix}{message}");
}
