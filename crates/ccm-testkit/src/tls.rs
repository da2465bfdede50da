//! A TLS client for tests that reach the CCM's HTTPS endpoint, whose
//! certificate is self-signed or freshly generated: it accepts any server
//! certificate but still checks the handshake signatures. [`https_get`] is
//! the one GET the tests and the scale bench send it.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme, SupportedProtocolVersion};

/// An HTTPS server's answer to [`https_get_with`].
pub struct Answer {
    pub status: u16,
    pub body: String,
    /// The certificate the server presented (DER), empty if none.
    pub peer_cert: Vec<u8>,
}

/// GET `path` from the HTTPS server at `addr` (`host:port`) with this
/// bearer token, or none, accepting any server certificate: the status and
/// the body as text.
pub async fn https_get(
    addr: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    let answer = https_get_with(addr, path, token, rustls::DEFAULT_VERSIONS).await?;
    Ok((answer.status, answer.body))
}

/// [`https_get`] over a new connection limited to TLS `versions`, with the
/// certificate the server presented.
pub async fn https_get_with(
    addr: &str,
    path: &str,
    token: Option<&str>,
    versions: &[&'static SupportedProtocolVersion],
) -> anyhow::Result<Answer> {
    use http_body_util::{BodyExt, Empty};

    let config = client_trusting_any_server(versions)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let peer_cert = (tls.get_ref().1.peer_certificates())
        .and_then(|c| c.first())
        .map(|c| c.to_vec())
        .unwrap_or_default();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let mut req = http::Request::get(path).header("host", "localhost");
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let resp = sender
        .send_request(req.body(Empty::<bytes::Bytes>::new())?)
        .await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
        peer_cert,
    })
}

/// A client config limited to `versions` that trusts any server certificate.
pub fn client_trusting_any_server(
    versions: &[&'static SupportedProtocolVersion],
) -> Result<rustls::ClientConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(
        rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)))
            .with_no_client_auth(),
    )
}

#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
