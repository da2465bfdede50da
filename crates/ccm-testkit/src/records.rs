//! What the test servers saw, for the coverage tests that run after the
//! suite (`crates/aws-ccm/tests/iam_policy.rs`, `.../rbac_policy.rs`): each
//! server appends every distinct record to its own file in a directory named
//! by an environment variable, one JSON value per line; the test reads them
//! all back.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Appends each distinct record once to `<dir>/<pid>-<port>.<suffix>`.
pub struct JsonLines {
    file: Option<PathBuf>,
    seen: Mutex<HashSet<String>>,
}

impl JsonLines {
    /// Writing under `dir` (`None`: recording is off).
    pub fn new(dir: Option<&Path>, port: u16, suffix: &str) -> JsonLines {
        JsonLines {
            file: dir.map(|d| d.join(format!("{}-{port}.{suffix}", std::process::id()))),
            seen: Mutex::new(HashSet::new()),
        }
    }

    /// Writing under the directory `env` names, when it is set and not empty.
    pub fn from_env(env: &str, port: u16, suffix: &str) -> JsonLines {
        let dir = std::env::var_os(env)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        JsonLines::new(dir.as_deref(), port, suffix)
    }

    pub fn is_on(&self) -> bool {
        self.file.is_some()
    }

    /// Appends `record` unless an equal one was written already; `what`
    /// names the recording in the warning when the file cannot be written.
    pub fn append<T: Serialize>(&self, record: &T, what: &str) {
        let Some(path) = &self.file else { return };
        let Ok(mut line) = serde_json::to_string(record) else {
            return;
        };
        // Checked and written under the lock, so lines never interleave.
        let mut seen = self.seen.lock();
        if seen.contains(&line) {
            return;
        }
        line.push('\n');
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        match written {
            Ok(()) => {
                line.pop();
                seen.insert(line);
            }
            Err(err) => tracing::warn!(path = %path.display(), %err, "cannot record {what}"),
        }
    }
}

/// Every record in every file of the directory `env` names.
///
/// # Panics
/// When `env` is unset or a file cannot be read or parsed: the coverage
/// tests run only after the suite recorded (`make test`).
pub fn read_all<T: DeserializeOwned>(env: &str) -> Vec<T> {
    let dir = std::env::var_os(env).unwrap_or_else(|| {
        panic!("{env} is not set: run `make test`, which records the suite's requests and then runs this")
    });
    let mut out = Vec::new();
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", PathBuf::from(&dir).display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            out.push(
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("{}: {e}: {line}", path.display())),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_distinct_record_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let lines = JsonLines::new(Some(dir.path()), 1, "test");
        assert!(lines.is_on());
        for n in [1, 2, 1, 3, 2] {
            lines.append(&n, "numbers");
        }
        let file = dir.path().join(format!("{}-1.test", std::process::id()));
        assert_eq!(std::fs::read_to_string(file).expect("written"), "1\n2\n3\n");
        let off = JsonLines::new(None, 1, "test");
        assert!(!off.is_on());
        off.append(&1, "numbers");
    }
}
