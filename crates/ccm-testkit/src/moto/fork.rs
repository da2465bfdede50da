//! Asking moto's fork server (`fork_server.py`, whose top says why it
//! exists) for a moto_server, and starting that server when none runs.
//!
//! One server serves every test process of a run that uses the same
//! interpreter, moto_server and `MOTO_*` settings: its socket's name is a
//! hash of those and of the server's own text, so a changed script or venv
//! never meets an old server. A test that finds no server starts one under
//! a file lock, so parallel tests start one between them.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const SERVER: &str = include_str!("fork_server.py");

/// How long the server stays without a request. A suite asks every few
/// seconds; between two `make test` steps it may leave and start again.
const IDLE: Duration = Duration::from_secs(30);

/// How long a request may wait for the server's answer: a fork.
const ANSWER_DEADLINE: Duration = Duration::from_secs(20);

/// The interpreter of a moto_server that pip installed: its `#!` line names
/// a Python by absolute path. Anything else (a wrapper script, a test's
/// fake) is started directly.
pub(super) fn interpreter(moto_server: &Path) -> Option<PathBuf> {
    let text = std::fs::read(moto_server).ok()?;
    let first = text.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(first).ok()?.strip_prefix("#!")?.trim();
    let python = PathBuf::from(line.split_whitespace().next()?);
    let named_python = python
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"));
    (python.is_absolute() && named_python && python.exists()).then_some(python)
}

/// A forked moto_server: its pid, and the connection whose closing kills it.
pub(super) struct Forked {
    pub pid: u32,
    pub lifeline: UnixStream,
}

/// Asks the fork server of `python` for a moto_server run with `args`,
/// logging to `log`, with the environment `env`; starts the server first if
/// none answers.
pub(super) fn fork(
    python: &Path,
    moto_server: &Path,
    args: &[&str],
    env: &BTreeMap<String, String>,
    log: &Path,
) -> anyhow::Result<Forked> {
    let socket = socket_path(python, moto_server, env);
    let request = serde_json::json!({ "args": args, "env": env, "log": log }).to_string();
    if let Ok(forked) = ask(&socket, &request) {
        return Ok(forked);
    }
    let lock_path = socket.with_extension("lock");
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("cannot create {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("cannot lock {}", lock_path.display()))?;
    // Another test may have started one while this one waited.
    if let Ok(forked) = ask(&socket, &request) {
        return Ok(forked);
    }
    let server_log = socket.with_extension("log");
    start_server(python, &socket, env, &server_log)?;
    let deadline = Instant::now() + super::START_DEADLINE;
    loop {
        match ask(&socket, &request) {
            Ok(forked) => return Ok(forked),
            Err(err) if Instant::now() >= deadline => {
                let tail = std::fs::read_to_string(&server_log).unwrap_or_default();
                bail!(
                    "moto's fork server ({} {}) did not answer on {} within {:?}: {err:#}; its log {}:\n{tail}",
                    python.display(),
                    socket.with_extension("py").display(),
                    socket.display(),
                    super::START_DEADLINE,
                    server_log.display()
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// One request: connect, send it, read the child's pid.
fn ask(socket: &Path, request: &str) -> anyhow::Result<Forked> {
    let mut stream = UnixStream::connect(socket)
        .with_context(|| format!("cannot connect to {}", socket.display()))?;
    stream.set_read_timeout(Some(ANSWER_DEADLINE))?;
    stream.write_all(request.as_bytes())?;
    stream.write_all(b"\n")?;
    let mut answer = String::new();
    BufReader::new(&stream).read_line(&mut answer)?;
    let pid = serde_json::from_str::<serde_json::Value>(&answer)
        .ok()
        .and_then(|v| v.get("pid")?.as_u64())
        .and_then(|pid| u32::try_from(pid).ok())
        .with_context(|| format!("the fork server answered {answer:?}"))?;
    stream.set_read_timeout(None)?;
    Ok(Forked {
        pid,
        lifeline: stream,
    })
}

/// Starts the server detached (it forks itself away and leads its own
/// session), with its output in `log`.
fn start_server(
    python: &Path,
    socket: &Path,
    env: &BTreeMap<String, String>,
    log: &Path,
) -> anyhow::Result<()> {
    // A server killed without cleaning up leaves its socket behind.
    let _ = std::fs::remove_file(socket);
    // Run from a file, so `ps` shows a name and not the whole text.
    let script = socket.with_extension("py");
    let written = script.with_extension(format!("py.{}", std::process::id()));
    std::fs::write(&written, SERVER)
        .and_then(|()| std::fs::rename(&written, &script))
        .with_context(|| format!("cannot write {}", script.display()))?;
    let out = std::fs::File::create(log)
        .with_context(|| format!("cannot create the fork server's log {}", log.display()))?;
    let err = out.try_clone()?;
    let status = Command::new(python)
        .arg(&script)
        .arg(socket)
        .arg(IDLE.as_secs().to_string())
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .with_context(|| format!("cannot start {} for moto's fork server", python.display()))?;
    if !status.success() {
        bail!(
            "moto's fork server exited at start ({status}); its log {}:\n{}",
            log.display(),
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
    Ok(())
}

/// `$TMPDIR/aws-ccm-moto-<hash>.sock`: one name per interpreter,
/// moto_server, server text and `MOTO_*` setting.
fn socket_path(python: &Path, moto_server: &Path, env: &BTreeMap<String, String>) -> PathBuf {
    let mut hasher = std::hash::DefaultHasher::new();
    python.hash(&mut hasher);
    moto_server.hash(&mut hasher);
    SERVER.hash(&mut hasher);
    for (key, value) in env.iter().filter(|(k, _)| k.starts_with("MOTO_")) {
        (key, value).hash(&mut hasher);
    }
    std::env::temp_dir().join(format!("aws-ccm-moto-{:016x}.sock", hasher.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, text: &str) -> PathBuf {
        let path = dir.join("moto_server");
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn only_a_pip_installed_moto_server_is_forked() {
        let dir = tempfile::tempdir().unwrap();
        let python = dir.path().join("python3.11");
        std::fs::write(&python, "").unwrap();
        let pip = script(dir.path(), &format!("#!{}\nimport re\n", python.display()));
        assert_eq!(interpreter(&pip), Some(python.clone()));
        let shell = script(dir.path(), "#!/bin/sh\nexit 3\n");
        assert_eq!(interpreter(&shell), None);
        let via_env = script(dir.path(), "#!/usr/bin/env python3\n");
        assert_eq!(interpreter(&via_env), None);
        let missing = script(dir.path(), "#!/nonexistent/bin/python\n");
        assert_eq!(interpreter(&missing), None);
    }

    #[test]
    fn the_socket_changes_with_moto_settings_only() {
        let python = Path::new("/venv/bin/python");
        let server = Path::new("/venv/bin/moto_server");
        let mut env = BTreeMap::from([("PATH".to_owned(), "/bin".to_owned())]);
        let plain = socket_path(python, server, &env);
        env.insert("HOME".into(), "/root".into());
        assert_eq!(socket_path(python, server, &env), plain);
        env.insert("MOTO_EC2_LOAD_DEFAULT_AMIS".into(), "false".into());
        assert_ne!(socket_path(python, server, &env), plain);
        assert_ne!(
            socket_path(Path::new("/other/python"), server, &BTreeMap::new()),
            plain
        );
    }
}
