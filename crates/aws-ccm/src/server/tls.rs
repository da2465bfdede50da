//! TLS of the HTTPS endpoint: `--tls-min-version`, `--tls-cipher-suites`,
//! and a serving certificate that follows `--tls-cert-file` /
//! `--tls-private-key-file` on disk.
//!
//! Flag values are upstream's (component-base's `cliflag.TLSVersion` and
//! `cliflag.TLSCipherSuites`): Go's version names and the IANA suite names
//! Go's `crypto/tls` knows. rustls offers only TLS 1.2 and 1.3 and only
//! forward-secret AEAD suites, so the older versions and the CBC, RC4, 3DES
//! and static-RSA suites are refused at start-up with the list of what is
//! accepted, rather than silently served differently. As in Go, the cipher
//! list governs TLS 1.2 only: the TLS 1.3 suites are always on, and naming
//! them is accepted and changes nothing.
//!
//! The certificate pair is re-read every [`RELOAD_INTERVAL`] (upstream's
//! dynamic serving certificate watches the files too); a new pair is used
//! for new connections, and a pair that does not load keeps the old one
//! serving and logs an error once per change of the files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::crypto::aws_lc_rs::{self, cipher_suite as cs};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use tokio_util::sync::CancellationToken;

/// How often the certificate files are checked for a new pair.
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// The accepted `--tls-min-version` values.
const MIN_VERSIONS: &str = "VersionTLS12, VersionTLS13";

/// Every name upstream accepts, with the rustls suite when there is one.
/// TLS 1.3 suites are listed for completeness: they are always enabled.
const SUITES: &[(&str, Option<SupportedCipherSuite>)] = &[
    ("TLS_AES_128_GCM_SHA256", Some(cs::TLS13_AES_128_GCM_SHA256)),
    ("TLS_AES_256_GCM_SHA384", Some(cs::TLS13_AES_256_GCM_SHA384)),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        Some(cs::TLS13_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        Some(cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        Some(cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384),
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        Some(cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    // Go's older spelling, still accepted by component-base.
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        Some(cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        Some(cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        Some(cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        Some(cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        Some(cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256),
    ),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_ECDHE_ECDSA_WITH_RC4_128_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_ECDHE_RSA_WITH_RC4_128_SHA", None),
    ("TLS_RSA_WITH_AES_128_GCM_SHA256", None),
    ("TLS_RSA_WITH_AES_256_GCM_SHA384", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_256_CBC_SHA", None),
    ("TLS_RSA_WITH_AES_128_CBC_SHA256", None),
    ("TLS_RSA_WITH_3DES_EDE_CBC_SHA", None),
    ("TLS_RSA_WITH_RC4_128_SHA", None),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsFlagError {
    #[error(
        "--tls-min-version={0} is not supported: this implementation (rustls) speaks only TLS 1.2 and 1.3; use one of {MIN_VERSIONS}"
    )]
    OldVersion(String),
    #[error("--tls-min-version={0:?} is not a TLS version; use one of {MIN_VERSIONS}")]
    UnknownVersion(String),
    #[error(
        "--tls-cipher-suites: {0} is not supported by this implementation (rustls offers only forward-secret AEAD suites); supported: {supported}",
        supported = supported_names()
    )]
    Unsupported(String),
    #[error(
        "--tls-cipher-suites: {0:?} is not a cipher suite name; supported: {supported}",
        supported = supported_names()
    )]
    UnknownSuite(String),
}

fn supported_names() -> String {
    SUITES
        .iter()
        .filter(|(_, s)| s.is_some())
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `--tls-min-version` and `--tls-cipher-suites`, parsed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TlsPolicy {
    /// TLS 1.2 is refused (`--tls-min-version=VersionTLS13`).
    pub tls13_only: bool,
    /// The TLS 1.2 suites to offer; `None` = rustls's defaults.
    pub tls12_suites: Option<Vec<SupportedCipherSuite>>,
    /// HTTP/2 is not served (`--disable-http2-serving`): ALPN offers only
    /// `http/1.1` and a connection speaking HTTP/2 anyway is refused.
    pub http1_only: bool,
}

impl TlsPolicy {
    /// Parses the flag values as upstream spells them.
    pub fn parse(min_version: &str, cipher_suites: &[String]) -> Result<TlsPolicy, TlsFlagError> {
        let tls13_only = match min_version.trim() {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            v @ ("VersionTLS10" | "VersionTLS11") => {
                return Err(TlsFlagError::OldVersion(v.to_string()));
            }
            other => return Err(TlsFlagError::UnknownVersion(other.to_string())),
        };
        let mut tls12 = Vec::new();
        let mut any = false;
        for name in cipher_suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
        {
            any = true;
            match SUITES.iter().find(|(n, _)| *n == name) {
                None => return Err(TlsFlagError::UnknownSuite(name.to_string())),
                Some((_, None)) => return Err(TlsFlagError::Unsupported(name.to_string())),
                Some((_, Some(suite))) => {
                    if suite.tls13().is_none() && !tls12.contains(suite) {
                        tls12.push(*suite);
                    }
                }
            }
        }
        Ok(TlsPolicy {
            tls13_only,
            tls12_suites: any.then_some(tls12),
            http1_only: false,
        })
    }

    /// The crypto provider with this policy's suites.
    pub(crate) fn provider(&self) -> CryptoProvider {
        let mut provider = aws_lc_rs::default_provider();
        if let Some(tls12) = &self.tls12_suites {
            provider.cipher_suites.retain(|s| s.tls13().is_some());
            provider.cipher_suites.extend(tls12.iter().copied());
        }
        provider
    }

    fn versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        static BOTH: &[&SupportedProtocolVersion] =
            &[&rustls::version::TLS13, &rustls::version::TLS12];
        if self.tls13_only { TLS13_ONLY } else { BOTH }
    }

    /// A server configuration serving what `certs` resolves.
    pub(crate) fn server_config(
        &self,
        certs: Arc<dyn ResolvesServerCert>,
    ) -> Result<ServerConfig, rustls::Error> {
        let mut config = ServerConfig::builder_with_provider(Arc::new(self.provider()))
            .with_protocol_versions(self.versions())?
            .with_no_client_auth()
            .with_cert_resolver(certs);
        config.alpn_protocols = if self.http1_only {
            vec![b"http/1.1".to_vec()]
        } else {
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        };
        Ok(config)
    }
}

/// The certificate and key files to serve.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("reading {path}: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("{cert} and {key} are not a pair: {reason}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// Parses a PEM certificate chain and private key into a checked pair.
fn load_pair(
    files: &TlsFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<CertifiedKey, CertError> {
    let parse = |path: &PathBuf, reason: String| CertError::Parse {
        path: path.clone(),
        reason,
    };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| parse(&files.cert, format!("not PEM certificates: {e}")))?;
    if chain.is_empty() {
        return Err(parse(&files.cert, "no CERTIFICATE block".to_string()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| parse(&files.key, format!("no PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| CertError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason: e.to_string(),
    })
}

fn read(path: &PathBuf) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|error| CertError::Read {
        path: path.clone(),
        error,
    })
}

/// Hands every new connection the current pair.
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    current: parking_lot::RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCert {
    pub(crate) fn fixed(key: CertifiedKey) -> Arc<ReloadingCert> {
        Arc::new(ReloadingCert {
            current: parking_lot::RwLock::new(Arc::new(key)),
        })
    }

    fn set(&self, key: CertifiedKey) {
        *self.current.write() = Arc::new(key);
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().clone())
    }
}

/// Loads the pair now, then keeps `certs` following the files until `stop`.
pub(crate) fn load_and_watch(
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    interval: Duration,
    stop: CancellationToken,
) -> Result<Arc<ReloadingCert>, CertError> {
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs = ReloadingCert::fixed(load_pair(&files, &cert_pem, &key_pem, &provider)?);
    let watched = certs.clone();
    tokio::spawn(async move {
        let mut seen = (cert_pem, key_pem);
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => reload_once(&files, &provider, &watched, &mut seen),
            }
        }
    });
    Ok(certs)
}

/// One check of the files; `seen` is the content last acted on.
fn reload_once(
    files: &TlsFiles,
    provider: &CryptoProvider,
    certs: &ReloadingCert,
    seen: &mut (Vec<u8>, Vec<u8>),
) {
    let (cert_pem, key_pem) = match (read(&files.cert), read(&files.key)) {
        (Ok(c), Ok(k)) => (c, k),
        // Mid-rotation a file may be missing for a moment; check again later.
        (Err(e), _) | (_, Err(e)) => {
            tracing::debug!(error = %e, "serving certificate not readable; keeping the current one");
            return;
        }
    };
    if (&cert_pem, &key_pem) == (&seen.0, &seen.1) {
        return;
    }
    match load_pair(files, &cert_pem, &key_pem, provider) {
        Ok(key) => {
            certs.set(key);
            tracing::info!(cert = %files.cert.display(), "loaded a new serving certificate");
        }
        Err(e) => tracing::error!(
            error = %e,
            "the serving certificate files changed but do not load; still serving the previous pair"
        ),
    }
    *seen = (cert_pem, key_pem);
}

/// A self-signed pair for the host name, as upstream makes when no
/// certificate is configured.
pub(crate) fn self_signed(provider: &CryptoProvider) -> Result<CertifiedKey, String> {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let names = vec![host, "localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::try_from(cert.signing_key.serialize_der())?;
    CertifiedKey::from_der(vec![cert.cert.der().clone()], key, provider).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(min: &str, suites: &[&str]) -> Result<TlsPolicy, String> {
        let suites: Vec<String> = suites.iter().map(|s| s.to_string()).collect();
        TlsPolicy::parse(min, &suites).map_err(|e| e.to_string())
    }

    #[test]
    fn tls_min_version_accepts_12_and_13_and_names_the_rest() {
        assert!(!parse("", &[]).unwrap().tls13_only);
        assert!(!parse("VersionTLS12", &[]).unwrap().tls13_only);
        assert!(parse("VersionTLS13", &[]).unwrap().tls13_only);
        let err = parse("VersionTLS10", &[]).unwrap_err();
        assert!(
            err.contains("VersionTLS10") && err.contains("VersionTLS12, VersionTLS13"),
            "{err}"
        );
        let err = parse("TLS1.2", &[]).unwrap_err();
        assert!(
            err.contains("\"TLS1.2\"") && err.contains("VersionTLS13"),
            "{err}"
        );
    }

    #[test]
    fn tls_cipher_suites_map_iana_names_and_refuse_what_rustls_lacks() {
        let p = parse(
            "",
            &[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
            ],
        )
        .unwrap();
        assert_eq!(
            p.tls12_suites.clone().unwrap(),
            [
                cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            ]
        );
        // TLS 1.3 suites stay on, as in Go; only the two TLS 1.2 suites named.
        let provider = p.provider();
        assert_eq!(
            provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some())
                .count(),
            3
        );
        assert_eq!(provider.cipher_suites.len(), 5);
        let err = parse("", &["TLS_RSA_WITH_AES_128_GCM_SHA256"]).unwrap_err();
        assert!(
            err.contains("TLS_RSA_WITH_AES_128_GCM_SHA256")
                && err.contains("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"),
            "{err}"
        );
        let err = parse("", &["TLS_MADE_UP"]).unwrap_err();
        assert!(
            err.contains("TLS_MADE_UP") && err.contains("supported:"),
            "{err}"
        );
        assert_eq!(parse("", &[]).unwrap().tls12_suites, None);
    }

    #[test]
    fn a_pair_that_does_not_load_keeps_the_previous_one_serving() {
        let dir = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let write = |name: &str| {
            let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
            std::fs::write(&files.cert, c.cert.pem()).unwrap();
            std::fs::write(&files.key, c.signing_key.serialize_pem()).unwrap();
            c.cert.der().to_vec()
        };
        let provider = aws_lc_rs::default_provider();
        let a = write("a.example");
        let (cert_pem, key_pem) = (read(&files.cert).unwrap(), read(&files.key).unwrap());
        let certs =
            ReloadingCert::fixed(load_pair(&files, &cert_pem, &key_pem, &provider).unwrap());
        let mut seen = (cert_pem, key_pem);
        let served = |c: &ReloadingCert| c.current.read().cert[0].to_vec();

        // A key that is not the certificate's: refused, A still served.
        let other = rcgen::generate_simple_self_signed(vec!["x".to_string()]).unwrap();
        std::fs::write(&files.key, other.signing_key.serialize_pem()).unwrap();
        reload_once(&files, &provider, &certs, &mut seen);
        assert_eq!(served(&certs), a);
        std::fs::write(&files.cert, "not pem").unwrap();
        reload_once(&files, &provider, &certs, &mut seen);
        assert_eq!(served(&certs), a);
        let err = load_pair(&files, b"", &seen.1, &provider)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("tls.crt") && err.contains("CERTIFICATE"),
            "{err}"
        );

        let b = write("b.example");
        reload_once(&files, &provider, &certs, &mut seen);
        assert_eq!(served(&certs), b);
    }
}
