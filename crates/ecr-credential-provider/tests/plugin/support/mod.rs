//! A world for the plugin: moto (ECR, STS) behind the fault proxy (which
//! also answers ECR Public), and the real binary run as the kubelet runs
//! it: request JSON on stdin, response on stdout, reason on stderr.

pub mod kubelet;

use std::path::PathBuf;
use std::process::Stdio;

use ccm_testkit::aws_proxy::{FaultProxy, ProxyConfig};
use ccm_testkit::moto::Moto;
use tokio::io::AsyncWriteExt as _;

/// The node's (instance profile's) credentials, as the SDK's default chain
/// finds them; the secret must never appear on stderr.
pub const NODE_ACCESS_KEY: &str = "AKIANODEEXAMPLE00001";
pub const NODE_SECRET_KEY: &str = "node-secret-key-never-logged-0123456789";

/// moto's fixed ECR token: base64 of `AWS:123456789012-auth-token`.
pub const MOTO_TOKEN_B64: &str = "QVdTOjEyMzQ1Njc4OTAxMi1hdXRoLXRva2Vu";
pub const MOTO_PASSWORD: &str = "123456789012-auth-token";

pub const V1: &str = "credentialprovider.kubelet.k8s.io/v1";
pub const V1BETA1: &str = "credentialprovider.kubelet.k8s.io/v1beta1";
pub const V1ALPHA1: &str = "credentialprovider.kubelet.k8s.io/v1alpha1";

pub const PRIVATE_HOST: &str = "123456789012.dkr.ecr.us-west-2.amazonaws.com";

pub struct World {
    // Dropped last: the proxy forwards to it.
    _moto: Moto,
    pub proxy: FaultProxy,
    home: tempfile::TempDir,
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    /// The response, parsed with the kubelet's v1 schema; panics (with the
    /// stderr) when the run failed.
    pub fn response(&self) -> kubelet::CredentialProviderResponse {
        assert_eq!(self.code, Some(0), "the plugin failed: {}", self.stderr);
        kubelet::parse_response(&self.stdout)
            .unwrap_or_else(|e| panic!("the kubelet could not decode {:?}: {e}", self.stdout))
    }

    /// The failure message; panics when the run succeeded.
    pub fn failure(&self) -> &str {
        assert_eq!(self.code, Some(1), "expected a failure, got {self:?}");
        assert!(
            self.stdout.is_empty(),
            "a failed run must write nothing on stdout: {:?}",
            self.stdout
        );
        &self.stderr
    }
}

impl World {
    pub async fn start() -> World {
        let moto = Moto::start().await.expect("moto starts");
        let proxy = FaultProxy::start(&moto.endpoint(), ProxyConfig::default())
            .await
            .expect("fault proxy starts");
        World {
            _moto: moto,
            proxy,
            home: tempfile::tempdir().expect("temporary HOME"),
        }
    }

    /// Runs the binary with `request` on stdin, `args`, and the node's
    /// environment plus `env`.
    pub async fn run(&self, request: &str, args: &[&str], env: &[(&str, &str)]) -> Outcome {
        let home = self.home.path();
        let mut command = tokio::process::Command::new(binary());
        command
            .args(args)
            .env_clear()
            .env("HOME", home)
            // No profile files of the machine's: only what the test says.
            .env("AWS_CONFIG_FILE", home.join("no-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", home.join("no-credentials"))
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ACCESS_KEY_ID", NODE_ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", NODE_SECRET_KEY)
            .env("AWS_ENDPOINT_URL", self.proxy.endpoint())
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("the plugin starts");
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(request.as_bytes())
            .await
            .expect("request written");
        drop(stdin);
        let output = child.wait_with_output().await.expect("the plugin exits");
        Outcome {
            code: output.status.code(),
            stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
        }
    }
}

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ecr-credential-provider"))
}

/// A request as the kubelet encodes it (kind, apiVersion, image).
pub fn request(api_version: &str, image: &str) -> String {
    serde_json::json!({
        "kind": "CredentialProviderRequest",
        "apiVersion": api_version,
        "image": image,
    })
    .to_string()
}

/// A v1 request of a kubelet with `tokenAttributes` (KEP-4412): the pod's
/// service account token and the annotations it was told to pass.
pub fn request_with_token(image: &str, token: &str, annotations: &[(&str, &str)]) -> String {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    serde_json::json!({
        "kind": "CredentialProviderRequest",
        "apiVersion": V1,
        "image": image,
        "serviceAccountToken": token,
        "serviceAccountAnnotations": annotations,
    })
    .to_string()
}
