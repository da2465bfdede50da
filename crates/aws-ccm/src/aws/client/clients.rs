//! Construction of the AWS SDK clients, in one place.
//!
//! Clients come from the shared `aws_config` defaults, so IRSA
//! (`AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`), instance profiles, and
//! `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_<SERVICE>` all work unchanged.
//! On top of that, cloud.conf may name a `RoleARN` to assume (with
//! `SourceARN` sent as the confused-deputy headers, as upstream does) and
//! `[ServiceOverride]` endpoints per service.
//!
//! The SDK's own retries are disabled: the client layer (`aws::client`) owns
//! retries, so the two never multiply. The `RoleARN` credentials provider
//! calls STS `AssumeRole` through that layer too (its [`Door`]), so the call
//! is throttled, retried and counted like any other.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::default_provider::credentials::DefaultCredentialsChain;
use aws_config::identity::IdentityCache;
use aws_config::provider_config::ProviderConfig;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_credential_types::provider::{
    self, ProvideCredentials, SharedCredentialsProvider, error::CredentialsError,
};
use aws_smithy_runtime_api::client::endpoint::{
    EndpointFuture, EndpointResolverParams, ResolveEndpoint, SharedEndpointResolver,
};
use aws_smithy_types::Document;
use aws_smithy_types::endpoint::Endpoint;

use super::CallOptions;
use super::door::Door;
use super::operations::{Operation, Service};
use super::throttle::Priority;
use crate::cloud_config::{CloudConfig, OverrideService};

/// The raw SDK clients. Only `aws::client` holds these; controllers never do.
#[derive(Clone, Debug)]
pub struct SdkClients {
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancing::Client,
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    pub sts: aws_sdk_sts::Client,
    /// Only `aws-ccm doctor`'s policy simulation. IAM has one global
    /// endpoint; `AWS_ENDPOINT_URL_IAM` (or `AWS_ENDPOINT_URL`) moves it.
    pub iam: aws_sdk_iam::Client,
}

/// Session name used when assuming `RoleARN` (visible in CloudTrail).
const SESSION_NAME: &str = "aws-cloud-controller-manager";

/// The SDK app name (user agent `app/aws-ccm`).
const APP_NAME: &str = "aws-ccm";

/// Loads the shared SDK configuration for `region`, with SDK retries off
/// and a connect timeout (operation timeouts are the client layer's).
pub(crate) async fn base_config(region: &str) -> SdkConfig {
    let mut loader = aws_config::defaults(BehaviorVersion::latest());
    // `app/aws-ccm` in every request's user agent: visible in CloudTrail,
    // and how the test proxy tells the CCM's calls from test seeding.
    if let Ok(name) = aws_config::AppName::new(APP_NAME) {
        loader = loader.app_name(name);
    }
    loader
        .region(Region::new(region.to_string()))
        .credentials_provider(credentials_chain(region).await)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .build(),
        )
        .load()
        .await
}

/// How long one `AssumeRole` may take, retries included: the door gives up
/// at this deadline, a little before the identity cache stops waiting for it
/// ([`ASSUME_ROLE_LOAD_TIMEOUT`]), which is itself below the door's default
/// 30 s attempt timeout of the call that needed the credentials.
const ASSUME_ROLE_DEADLINE: Duration = Duration::from_secs(20);

/// How long the identity cache waits for the `RoleARN` provider.
const ASSUME_ROLE_LOAD_TIMEOUT: Duration = Duration::from_secs(25);

/// How long before expiry the assumed credentials are replaced: room for
/// `AssumeRole` to be retried while the old ones still work.
const ASSUME_ROLE_REFRESH_BEFORE_EXPIRY: Duration = Duration::from_secs(60);

/// The SDK's default credentials chain (environment, profile, web identity,
/// container, instance metadata), with standard retries for the STS and
/// metadata clients inside it. Left to the loader, the chain would inherit
/// its `RetryConfig::disabled()` (set for the service clients, whose retries
/// the door owns) and IRSA's `AssumeRoleWithWebIdentity` would get one
/// attempt.
///
/// That call does not go through the door: the chain builds its own STS
/// client from a provider configuration that takes no interceptor, app name
/// or client, so routing it through the door would mean re-implementing the
/// chain's order and each provider. It is made once per credentials
/// lifetime, retried by the SDK, but not counted in our metrics and without
/// the `app/aws-ccm` user-agent mark.
async fn credentials_chain(region: &str) -> DefaultCredentialsChain {
    let region = Region::new(region.to_string());
    let config = ProviderConfig::default()
        .with_region(Some(region.clone()))
        .with_retry_config(RetryConfig::standard());
    DefaultCredentialsChain::builder()
        .configure(config)
        .region(region)
        .build()
        .await
}

/// Builds every client for `region` from `base`, applying cloud.conf's
/// RoleARN and ServiceOverride sections. `door` is the client layer the
/// RoleARN provider calls STS through.
pub(crate) fn build(
    base: &SdkConfig,
    cloud: &CloudConfig,
    region: &str,
    door: &Arc<Door>,
) -> SdkClients {
    let config = match &cloud.role_arn {
        Some(role_arn) => {
            let provider = AssumeRoleProvider {
                // Signed with the base credentials (IRSA, instance profile…).
                sts: sts_client(base, cloud, region),
                door: door.clone(),
                role_arn: role_arn.clone(),
                source_arn: cloud.source_arn.clone(),
            };
            // One cache shared by every client built from this config: STS
            // is asked once per credentials lifetime, not per request, and
            // again shortly before they expire.
            let cache = IdentityCache::lazy()
                .load_timeout(ASSUME_ROLE_LOAD_TIMEOUT)
                .buffer_time(ASSUME_ROLE_REFRESH_BEFORE_EXPIRY)
                .build();
            base.to_builder()
                .credentials_provider(SharedCredentialsProvider::new(provider))
                .identity_cache(cache)
                .build()
        }
        None => base.clone(),
    };
    for note in cloud.override_notes() {
        tracing::warn!("cloud.conf {note}");
    }
    let mut ec2 = aws_sdk_ec2::config::Builder::from(&config);
    ec2.set_endpoint_resolver(override_resolver(cloud, OverrideService::Ec2, region));
    let mut elb = aws_sdk_elasticloadbalancing::config::Builder::from(&config);
    elb.set_endpoint_resolver(override_resolver(cloud, OverrideService::Elb, region));
    let mut elbv2 = aws_sdk_elasticloadbalancingv2::config::Builder::from(&config);
    elbv2.set_endpoint_resolver(override_resolver(cloud, OverrideService::Elbv2, region));
    SdkClients {
        ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
        elb: aws_sdk_elasticloadbalancing::Client::from_conf(elb.build()),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::from_conf(elbv2.build()),
        sts: sts_client(&config, cloud, region),
        iam: aws_sdk_iam::Client::new(&config),
    }
}

fn sts_client(config: &SdkConfig, cloud: &CloudConfig, region: &str) -> aws_sdk_sts::Client {
    let mut sts = aws_sdk_sts::config::Builder::from(config);
    sts.set_endpoint_resolver(override_resolver(cloud, OverrideService::Sts, region));
    aws_sdk_sts::Client::from_conf(sts.build())
}

/// A `[ServiceOverride]` as an SDK endpoint resolver: its URL, with the
/// SigV4 signing region and (when set) signing name carried the way the
/// SDK's signer reads them, from the endpoint's `authSchemes` property.
/// `None` without an override for `service` in `region`: the SDK's own
/// endpoint.
fn override_resolver(
    cloud: &CloudConfig,
    service: OverrideService,
    region: &str,
) -> Option<SharedEndpointResolver> {
    let o = cloud.endpoint_override(service, region)?;
    Some(SharedEndpointResolver::new(OverrideEndpoint {
        url: o.url.clone(),
        signing_region: o.signing_region.clone(),
        signing_name: (!o.signing_name.is_empty()).then(|| o.signing_name.clone()),
    }))
}

/// The fixed endpoint of one `[ServiceOverride]`. Each client is built for
/// one region and the override already matched it, so parameters are not
/// consulted.
#[derive(Debug)]
struct OverrideEndpoint {
    url: String,
    signing_region: String,
    /// `None`: the service's own signing name (`ec2`, `elasticloadbalancing`, `sts`).
    signing_name: Option<String>,
}

impl ResolveEndpoint for OverrideEndpoint {
    fn resolve_endpoint<'a>(&'a self, _params: &'a EndpointResolverParams) -> EndpointFuture<'a> {
        let mut scheme = HashMap::from([
            ("name".to_string(), Document::from("sigv4")),
            (
                "signingRegion".to_string(),
                Document::from(self.signing_region.as_str()),
            ),
        ]);
        if let Some(name) = &self.signing_name {
            scheme.insert("signingName".to_string(), Document::from(name.as_str()));
        }
        let endpoint = Endpoint::builder()
            .url(self.url.clone())
            .property("authSchemes", vec![Document::Object(scheme)])
            .build();
        EndpointFuture::ready(Ok(endpoint))
    }
}

/// Assumes `RoleARN` through STS, by way of the door (throttle, retries,
/// metrics). With `SourceARN`, sends the `x-amz-source-arn` /
/// `x-amz-source-account` headers so the role's trust policy can pin
/// `aws:SourceArn` / `aws:SourceAccount` (confused deputy).
#[derive(Debug)]
struct AssumeRoleProvider {
    sts: aws_sdk_sts::Client,
    door: Arc<Door>,
    role_arn: String,
    source_arn: Option<String>,
}

impl AssumeRoleProvider {
    async fn assume(&self) -> provider::Result {
        let attempt = || {
            let source = self.source_arn.clone();
            self.sts
                .assume_role()
                .role_arn(&self.role_arn)
                .role_session_name(SESSION_NAME)
                .customize()
                .mutate_request(move |req| {
                    if let Some(arn) = &source {
                        req.headers_mut().insert("x-amz-source-arn", arn.clone());
                        // arn:partition:service:region:account:resource
                        if let Some(account) = arn.split(':').nth(4).filter(|a| !a.is_empty()) {
                            req.headers_mut()
                                .insert("x-amz-source-account", account.to_string());
                        }
                    }
                })
                .send()
        };
        let response = self
            .door
            .call(
                Service::Sts,
                Operation::StsAssumeRole,
                CallOptions::within(ASSUME_ROLE_DEADLINE),
                Priority::Normal,
                attempt,
            )
            .await
            .map_err(|e| {
                CredentialsError::provider_error(format!(
                    "assuming cloud.conf RoleARN {}: {e}",
                    self.role_arn
                ))
            })?;
        let c = response.credentials.ok_or_else(|| {
            CredentialsError::provider_error(format!(
                "STS AssumeRole {} returned no credentials",
                self.role_arn
            ))
        })?;
        let expiry = SystemTime::try_from(c.expiration).ok();
        Ok(Credentials::new(
            c.access_key_id,
            c.secret_access_key,
            Some(c.session_token),
            expiry,
            "CloudConfigRoleARN",
        ))
    }
}

impl ProvideCredentials for AssumeRoleProvider {
    fn provide_credentials<'a>(&'a self) -> provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        provider::future::ProvideCredentials::new(self.assume())
    }
}

/// Facts read from the instance metadata service (IMDSv2) at start-up.
pub(crate) mod imds {
    use aws_config::imds::Client;

    /// The region this instance runs in. `endpoint` is cloud.conf's
    /// `[ServiceOverride]` for `ec2imds`, if any.
    pub(crate) async fn region(endpoint: Option<&str>) -> Result<String, String> {
        get("/latest/meta-data/placement/region", endpoint).await
    }

    /// This instance's ID.
    pub(crate) async fn instance_id(endpoint: Option<&str>) -> Result<String, String> {
        get("/latest/meta-data/instance-id", endpoint).await
    }

    /// The subnet of this instance's primary network interface.
    pub(crate) async fn subnet_id(endpoint: Option<&str>) -> Result<String, String> {
        let mac = get("/latest/meta-data/mac", endpoint).await?;
        get(
            &format!(
                "/latest/meta-data/network/interfaces/macs/{}/subnet-id",
                mac.trim()
            ),
            endpoint,
        )
        .await
    }

    async fn get(path: &str, endpoint: Option<&str>) -> Result<String, String> {
        // Honour the SDK's standard switch ourselves, so tests and off-EC2 runs
        // never send a packet to the link-local metadata address.
        if std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Err(format!(
                "instance metadata {path}: disabled by AWS_EC2_METADATA_DISABLED=true"
            ));
        }
        let mut builder = Client::builder();
        if let Some(url) = endpoint {
            builder = builder.endpoint(url).map_err(|e| {
                format!("cloud.conf [ServiceOverride] ec2imds URL {url:?} is not usable: {e}")
            })?;
        }
        let client = builder.build();
        client.get(path).await.map(String::from).map_err(|e| {
            format!(
                "instance metadata {path}: {}",
                aws_smithy_types::error::display::DisplayErrorContext(&e)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::aws::client::ClientOptions;

    /// Accepts one HTTP request and returns its head (request line and headers).
    async fn capture_one(listener: tokio::net::TcpListener) -> String {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = sock.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        let reply =
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        sock.write_all(reply).await.unwrap();
        String::from_utf8_lossy(&got).into_owned()
    }

    async fn test_base() -> SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("AKIDTEST", "secret", None, None, "test"))
            .retry_config(RetryConfig::disabled())
            .load()
            .await
    }

    /// Sends one call of `service`'s client under `cloud` and returns the
    /// request head the override's endpoint received.
    async fn request_under(conf: &str, service: OverrideService) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(capture_one(listener));
        let cloud =
            CloudConfig::parse(&conf.replace("ADDR", &addr.to_string()), Path::new("t")).unwrap();
        let door = Door::new(&ClientOptions::default());
        let sdk = build(&test_base().await, &cloud, "us-east-1", &door);
        match service {
            OverrideService::Ec2 => drop(sdk.ec2.describe_regions().send().await),
            OverrideService::Elb => drop(sdk.elb.describe_load_balancers().send().await),
            OverrideService::Elbv2 => drop(sdk.elbv2.describe_load_balancers().send().await),
            OverrideService::Sts => drop(sdk.sts.get_caller_identity().send().await),
            OverrideService::Imds => unreachable!("IMDS is not an SDK client"),
        }
        server.await.unwrap()
    }

    #[tokio::test]
    async fn override_url_signing_region_and_signing_name_are_applied() {
        let head = request_under(
            "[ServiceOverride \"1\"]\nService = EC2\nRegion = us-east-1\nURL = http://ADDR\n\
             SigningRegion = eu-test-9\nSigningName = custom-ec2\n",
            OverrideService::Ec2,
        )
        .await;
        assert!(
            head.contains("/eu-test-9/custom-ec2/aws4_request"),
            "request not signed for the override's region and name:\n{head}"
        );
    }

    #[tokio::test]
    async fn classic_elb_and_elbv2_overrides_are_separate() {
        let conf = "[ServiceOverride \"clb\"]\nService = Elastic Load Balancing\nRegion = us-east-1\n\
                    URL = http://ADDR\nSigningRegion = us-east-1\n\
                    [ServiceOverride \"v2\"]\nService = Elastic Load Balancing v2\nRegion = us-east-1\n\
                    URL = http://127.0.0.1:9\nSigningRegion = us-east-1\nSigningName = other\n";
        // The classic client reaches the classic override, signed with the
        // service's own name (no SigningName there).
        let head = request_under(conf, OverrideService::Elb).await;
        assert!(
            head.contains("/us-east-1/elasticloadbalancing/aws4_request"),
            "{head}"
        );
        let conf = conf.replace("http://ADDR", "http://127.0.0.1:9").replacen(
            "URL = http://127.0.0.1:9\nSigningRegion = us-east-1\nSigningName",
            "URL = http://ADDR\nSigningRegion = us-east-1\nSigningName",
            1,
        );
        let head = request_under(&conf, OverrideService::Elbv2).await;
        assert!(head.contains("/us-east-1/other/aws4_request"), "{head}");
    }

    /// A tiny IMDSv2: answers the token PUT, then the GET with `body`,
    /// on one keep-alive connection or several.
    async fn fake_imds(listener: tokio::net::TcpListener, body: &'static str) {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                loop {
                    let n = match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let answer = if head.starts_with("PUT ") {
                        "token"
                    } else {
                        body
                    };
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nx-aws-ec2-metadata-token-ttl-seconds: 21600\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if sock.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    }

    #[tokio::test]
    async fn imds_override_is_the_metadata_endpoint() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(fake_imds(listener, "us-test-1"));
        let region = imds::region(Some(&url)).await;
        server.abort();
        assert_eq!(region.as_deref(), Ok("us-test-1"));
    }
}
