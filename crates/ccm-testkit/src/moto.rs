//! moto (the AWS mock) as a child process of a test.
//!
//! [`Moto::start`] finds `moto_server`, starts it on 127.0.0.1 with an
//! ephemeral port, and returns once it answers. Dropping the [`Moto`] kills it.
//! moto also dies when the test process dies in any way, SIGKILL included:
//! it runs under a small `sh` watchdog that reads a pipe only the test process
//! holds open, and kills moto's whole process group when that pipe closes.
//! So no moto outlives the test that started it.
//!
//! A pip-installed moto_server is not started but forked from moto's fork
//! server ([`fork`]), a warm Python process shared by the run's tests: a
//! fresh moto_server spends about 3 s of CPU on imports and set-up before
//! its first answer, and the suite starts a few hundred. The connection that
//! asked for the fork is then the pipe: its closing kills that moto.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tempfile::NamedTempFile;

mod fork;

/// How long moto may take to answer after start (Python start-up on a busy
/// two-core machine takes a few seconds; this is the give-up point).
const START_DEADLINE: Duration = Duration::from_secs(60);

/// How many lines of moto's log an error message quotes.
const LOG_TAIL_LINES: usize = 20;

const NOT_FOUND_HINT: &str = "moto_server not found: run scripts/install-moto.sh (or make test), or set MOTO_SERVER to its path";

/// Runs `moto_server ARGS` in its own process group and kills that group as
/// soon as standard input reaches end of file. `$0` is the moto_server path.
///
/// The watcher gets a copy of the pipe on fd 3, taken before the background
/// job starts, because POSIX shells give background jobs /dev/null as stdin.
/// moto itself gets /dev/null, so only the test process holds the pipe's write
/// end: when it closes (Drop, panic, SIGKILL) the watcher fires. If moto
/// exits by itself, the launcher exits with moto's status (which start-up
/// errors report) and the watcher lingers, harmless, until the pipe closes.
const LAUNCHER: &str = r#"
exec 3<&0 0</dev/null
( cat <&3 >/dev/null 2>&1; kill -9 0 ) &
exec 3<&-
"$0" "$@" &
moto=$!
echo "moto-launcher: moto_server pid $moto" >&2
wait "$moto"
status=$?
echo "moto-launcher: moto_server exited with status $status" >&2
exit "$status"
"#;

/// The image every test launches its instances from: one of the default
/// Amazon AMIs moto 5.2.5 knows in us-east-1. Looking one up instead
/// (`DescribeImages` of Amazon's images) cost moto 2.6 s of CPU a call, to
/// serialize some 1,300 default images: three quarters of moto's CPU in the
/// integration suite.
pub const AMI: &str = "ami-12c6146b";

/// A running moto server owned by a test.
pub struct Moto {
    keeper: Keeper,
    port: u16,
    pid: Option<u32>,
    log: NamedTempFile,
}

/// What keeps a moto alive, and kills it when dropped.
enum Keeper {
    /// Started through [`LAUNCHER`]: closing the pipe (by dropping it)
    /// tells the launcher to kill moto.
    Launched {
        launcher: Child,
        lifeline: Option<ChildStdin>,
    },
    /// Forked by the fork server: closing the connection kills moto.
    Forked { lifeline: Option<UnixStream> },
}

/// moto_server's arguments: port 0, so the kernel picks a free port and
/// werkzeug reports it, and parallel tests never race for a port.
const ARGS: [&str; 4] = ["-H", "127.0.0.1", "-p", "0"];

impl Moto {
    /// Finds moto_server (`$MOTO_SERVER`, else `<repo>/.venv/bin/moto_server`
    /// found from `CARGO_MANIFEST_DIR` or the current directory upward, else
    /// `PATH`), starts it on 127.0.0.1 with a free ephemeral port and waits
    /// until it answers HTTP.
    pub async fn start() -> anyhow::Result<Moto> {
        let binary = find_moto_server()?;
        Moto::start_with(&binary).await
    }

    /// Like [`Moto::start`] with an explicit moto_server path.
    pub async fn start_with(moto_server: &Path) -> anyhow::Result<Moto> {
        crate::servers_allowed("moto")?;
        let log = tempfile::Builder::new()
            .prefix("moto-")
            .suffix(".log")
            .tempfile()
            .context("cannot create a temporary file for moto's log")?;
        let (keeper, pid) = match fork::interpreter(moto_server) {
            Some(python) => {
                let (server, log_path) = (moto_server.to_owned(), log.path().to_owned());
                let forked = tokio::task::spawn_blocking(move || {
                    fork::fork(&python, &server, &ARGS, &moto_env(), &log_path)
                })
                .await
                .context("the request to moto's fork server panicked")??;
                let keeper = Keeper::Forked {
                    lifeline: Some(forked.lifeline),
                };
                (keeper, Some(forked.pid))
            }
            None => (launch(moto_server, &log)?, None),
        };
        let mut moto = Moto {
            keeper,
            port: 0,
            pid,
            log,
        };
        moto.wait_until_ready(moto_server).await?;
        Ok(moto)
    }

    async fn wait_until_ready(&mut self, moto_server: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_DEADLINE;
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let mut poll_interval = Duration::from_millis(25);
        loop {
            let said_exit = self.read_log_facts();
            if let Some(status) = self.exit_status(said_exit)? {
                bail!(
                    "{} exited before answering ({status}); {}",
                    moto_server.display(),
                    self.log_tail_message()
                );
            }
            if self.port != 0 {
                let url = format!("{}/moto-api/", self.endpoint());
                let uri: http::Uri = url
                    .parse()
                    .with_context(|| format!("moto endpoint {url} is not a valid URL"))?;
                if let Ok(Ok(response)) =
                    tokio::time::timeout(Duration::from_secs(2), client.get(uri)).await
                    && response.status().is_success()
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "moto_server ({}) did not answer within {:?}; {}",
                    moto_server.display(),
                    START_DEADLINE,
                    self.log_tail_message()
                );
            }
            tokio::time::sleep(poll_interval).await;
            poll_interval = (poll_interval * 2).min(Duration::from_millis(200));
        }
    }

    /// Picks moto's pid (from the launcher or the fork server) and port
    /// (from werkzeug's "Running on http://127.0.0.1:PORT") out of the log,
    /// and returns the exit status moto's last line gives, if it wrote one.
    fn read_log_facts(&mut self) -> Option<String> {
        let file = std::fs::File::open(self.log.path()).ok()?;
        let mut said_exit = None;
        for line in BufReader::new(file).lines().map_while(Result::ok) {
            if let Some(pid) = line.strip_prefix("moto-launcher: moto_server pid ") {
                self.pid = pid.trim().parse().ok();
            }
            if let Some(code) = line.strip_prefix("moto-launcher: moto_server exited with status ")
            {
                said_exit = Some(format!("exit status: {}", code.trim()));
            }
            if self.port == 0
                && let Some(port) = running_port(&line)
            {
                self.port = port;
            }
        }
        said_exit
    }

    fn log_tail_message(&self) -> String {
        match std::fs::read_to_string(self.log.path()) {
            Ok(text) => {
                let mut tail: VecDeque<&str> = VecDeque::with_capacity(LOG_TAIL_LINES);
                for line in text.lines() {
                    if tail.len() == LOG_TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line);
                }
                let tail: Vec<&str> = tail.into_iter().collect();
                format!(
                    "last lines of its log {}:\n{}",
                    self.log.path().display(),
                    tail.join("\n")
                )
            }
            Err(err) => format!(
                "its log {} could not be read: {err}",
                self.log.path().display()
            ),
        }
    }

    /// How moto ended, if it has: the launcher's status, or for a forked
    /// moto (not our child) what its last log line said, or that it is gone
    /// without one.
    fn exit_status(&mut self, said_exit: Option<String>) -> anyhow::Result<Option<String>> {
        match &mut self.keeper {
            Keeper::Launched { launcher, .. } => Ok(launcher
                .try_wait()
                .context("cannot check whether moto_server is still running")?
                .map(|status| status.to_string())),
            Keeper::Forked { .. } => {
                let gone = self.pid.is_some_and(process_is_gone);
                Ok(said_exit.or_else(|| gone.then(|| "gone without a word".to_owned())))
            }
        }
    }

    /// Closes the lifeline: moto's process group is then killed.
    fn close_lifeline(&mut self) {
        match &mut self.keeper {
            Keeper::Launched { lifeline, .. } => drop(lifeline.take()),
            Keeper::Forked { lifeline } => drop(lifeline.take()),
        }
    }

    /// Whether moto is gone (a launched one's launcher reaped).
    fn is_gone(&mut self) -> bool {
        match &mut self.keeper {
            Keeper::Launched { launcher, .. } => !matches!(launcher.try_wait(), Ok(None)),
            Keeper::Forked { .. } => self.pid.is_none_or(process_is_gone),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The port moto listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// moto_server's process id, as reported by the launcher.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Where moto's stdout and stderr go (deleted when the `Moto` is dropped).
    pub fn log_path(&self) -> &Path {
        self.log.path()
    }

    /// Clears every moto backend (`POST /moto-api/reset`).
    pub async fn reset(&self) -> anyhow::Result<()> {
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let url = format!("{}/moto-api/reset", self.endpoint());
        let request = http::Request::post(&url)
            .body(Empty::new())
            .with_context(|| format!("cannot build the request POST {url}"))?;
        let response = client
            .request(request)
            .await
            .with_context(|| format!("POST {url} failed: is moto still running?"))?;
        let status = response.status();
        if !status.is_success() {
            let body = response
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            bail!("POST {url} answered {status}: {body}");
        }
        Ok(())
    }

    /// SDK configuration for tests against this moto: region us-east-1,
    /// static test credentials, `endpoint_url` = [`Moto::endpoint`].
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        test_sdk_config(&self.endpoint()).await
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        // Closing the lifeline kills moto's process group; wait so moto is
        // gone when drop returns.
        self.close_lifeline();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.is_gone() {
            if Instant::now() >= deadline {
                // The watchdog did not act (should not happen): kill moto
                // by pid, and a launcher with it.
                if let Some(pid) = self.pid {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                }
                if let Keeper::Launched { launcher, .. } = &mut self.keeper {
                    let _ = launcher.kill();
                    let _ = launcher.wait();
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Starts `moto_server` under [`LAUNCHER`], its output in `log`.
fn launch(moto_server: &Path, log: &NamedTempFile) -> anyhow::Result<Keeper> {
    let log_out = log
        .reopen()
        .context("cannot open moto's log file for writing")?;
    let log_err = log_out
        .try_clone()
        .context("cannot duplicate moto's log file handle")?;
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(LAUNCHER)
        .arg(moto_server)
        .args(ARGS)
        .stdin(Stdio::piped())
        .stdout(log_out)
        .stderr(log_err)
        .env_clear()
        .envs(moto_env());
    // Its own process group, so killing the group takes moto and any
    // children with it and nothing else.
    {
        use std::os::unix::process::CommandExt as _;
        command.process_group(0);
    }
    let mut launcher = command
        .spawn()
        .with_context(|| format!("cannot start {} through /bin/sh", moto_server.display()))?;
    let lifeline = launcher.stdin.take();
    Ok(Keeper::Launched { launcher, lifeline })
}

/// moto's environment: the test's, less a developer's real AWS profile,
/// with Python's output unbuffered so the log is read as it is written.
fn moto_env() -> BTreeMap<String, String> {
    let mut env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k != "AWS_PROFILE")
        .collect();
    env.insert("PYTHONUNBUFFERED".into(), "1".into());
    env
}

/// True once `pid` has exited (or is a zombie nobody reaped yet).
pub fn process_is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) STATE ...": comm may hold spaces, so read after ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// SDK configuration for tests: region us-east-1, static test credentials and
/// the given endpoint (moto, or a [`FaultProxy`](super::aws_proxy::FaultProxy)
/// in front of it). Callers layer their own retry configuration on top.
pub async fn test_sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_credential_types::Credentials::new(
            "testing",
            "testing",
            None,
            None,
            "aws-ccm-testkit",
        ))
        .endpoint_url(endpoint)
        .load()
        .await
}

/// The port in werkzeug's " * Running on http://127.0.0.1:PORT" line.
fn running_port(line: &str) -> Option<u16> {
    let rest = line.split("Running on http://127.0.0.1:").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().filter(|port| *port != 0)
}

/// Where moto_server is: `$MOTO_SERVER`, then `.venv/bin/moto_server` in the
/// crate directory or the current directory or any of their parents, then
/// `PATH`.
pub fn find_moto_server() -> anyhow::Result<PathBuf> {
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        starts.push(PathBuf::from(dir));
    }
    starts.push(PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    if let Ok(dir) = std::env::current_dir() {
        starts.push(dir);
    }
    locate_moto_server(
        std::env::var_os("MOTO_SERVER"),
        &starts,
        std::env::var_os("PATH"),
    )
}

/// The search behind [`find_moto_server`], with its inputs passed in.
fn locate_moto_server(
    explicit: Option<OsString>,
    starts: &[PathBuf],
    path_var: Option<OsString>,
) -> anyhow::Result<PathBuf> {
    if let Some(explicit) = explicit {
        let path = PathBuf::from(explicit);
        if is_executable(&path) {
            return Ok(path);
        }
        bail!(
            "MOTO_SERVER={} is not an executable file; {NOT_FOUND_HINT}",
            path.display()
        );
    }
    for start in starts {
        for dir in start.ancestors() {
            let candidate = dir.join(".venv/bin/moto_server");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    if let Some(path_var) = path_var {
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join("moto_server");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    let searched: Vec<String> = starts.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "{NOT_FOUND_HINT} (looked for .venv/bin/moto_server in and above {} and for moto_server on PATH)",
        searched.join(", ")
    )
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_port_werkzeug_prints() {
        assert_eq!(
            running_port(" * Running on http://127.0.0.1:42009"),
            Some(42009)
        );
        assert_eq!(
            running_port("\u{1b}[0m * Running on http://127.0.0.1:5000\u{1b}[0m"),
            Some(5000)
        );
        assert_eq!(running_port("Press CTRL+C to quit"), None);
    }

    #[test]
    fn missing_moto_server_names_the_fix() {
        let nowhere = [PathBuf::from("/nonexistent/definitely/not/here")];
        let err = locate_moto_server(None, &nowhere, Some(OsString::from("/nonexistent/bin")))
            .expect_err("no moto there");
        let text = err.to_string();
        assert!(text.starts_with("moto_server not found"), "{text}");
        assert!(text.contains("scripts/install-moto.sh"), "{text}");

        let err = locate_moto_server(
            Some(OsString::from("/nonexistent/moto_server")),
            &nowhere,
            None,
        )
        .expect_err("MOTO_SERVER points nowhere");
        assert!(
            err.to_string()
                .contains("MOTO_SERVER=/nonexistent/moto_server"),
            "{err}"
        );
    }

    #[test]
    fn finds_the_venv_above_a_start_directory() {
        let repo = tempfile::tempdir().expect("temporary directory");
        let bin = repo.path().join(".venv/bin");
        std::fs::create_dir_all(&bin).expect("create .venv/bin");
        let moto = bin.join("moto_server");
        std::fs::write(&moto, "#!/bin/sh\n").expect("write fake moto_server");
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&moto, std::fs::Permissions::from_mode(0o755))
                .expect("make it executable");
        }
        let nested = repo.path().join("src/testkit");
        std::fs::create_dir_all(&nested).expect("create nested directory");
        let found = locate_moto_server(None, &[nested], None).expect("found above");
        assert_eq!(found, moto);
    }
}
