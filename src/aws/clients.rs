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

use super::client::CallOptions;
use super::door::Door;
use super::operations::{Operation, Service};
use crate::cloud_config::CloudConfig;

/// The raw SDK clients. Only `aws::client` holds these; controllers never do.
#[derive(Clone, Debug)]
pub struct SdkClients {
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancing::Client,
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    pub sts: aws_sdk_sts::Client,
}

impl SdkClients {
    /// Builds all four clients from one shared configuration, with no
    /// cloud.conf overrides (tests and tools).
    pub fn from_sdk_config(config: &SdkConfig) -> SdkClients {
        SdkClients {
            ec2: aws_sdk_ec2::Client::new(config),
            elb: aws_sdk_elasticloadbalancing::Client::new(config),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(config),
            sts: aws_sdk_sts::Client::new(config),
        }
    }
}

/// Session name used when assuming `RoleARN` (visible in CloudTrail).
const SESSION_NAME: &str = "aws-cloud-controller-manager";

/// The SDK app name (user agent `app/aws-ccm`).
pub const APP_NAME: &str = "aws-ccm";

/// Loads the shared SDK configuration for `region`, with SDK retries off
/// and a connect timeout (operation timeouts are the client layer's).
pub async fn base_config(region: &str) -> SdkConfig {
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
pub fn build(base: &SdkConfig, cloud: &CloudConfig, region: &str, door: &Arc<Door>) -> SdkClients {
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
    let ec2 = {
        let mut b = aws_sdk_ec2::config::Builder::from(&config);
        if let Some(o) = cloud.service_override("ec2", region) {
            warn_unsupported_signing(&o.service, &o.signing_method, &o.signing_name, "ec2");
            b = b
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        aws_sdk_ec2::Client::from_conf(b.build())
    };
    // Classic ELB and ELBv2 share the `elasticloadbalancing` service name and
    // therefore one override, as upstream.
    let elb_override = cloud.service_override("elasticloadbalancing", region);
    if let Some(o) = elb_override {
        warn_unsupported_signing(
            &o.service,
            &o.signing_method,
            &o.signing_name,
            "elasticloadbalancing",
        );
    }
    let elb = {
        let mut b = aws_sdk_elasticloadbalancing::config::Builder::from(&config);
        if let Some(o) = elb_override {
            b = b
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        aws_sdk_elasticloadbalancing::Client::from_conf(b.build())
    };
    let elbv2 = {
        let mut b = aws_sdk_elasticloadbalancingv2::config::Builder::from(&config);
        if let Some(o) = elb_override {
            b = b
                .endpoint_url(&o.url)
                .region(Region::new(o.signing_region.clone()));
        }
        aws_sdk_elasticloadbalancingv2::Client::from_conf(b.build())
    };
    let sts = sts_client(&config, cloud, region);
    SdkClients {
        ec2,
        elb,
        elbv2,
        sts,
    }
}

fn sts_client(config: &SdkConfig, cloud: &CloudConfig, region: &str) -> aws_sdk_sts::Client {
    let mut b = aws_sdk_sts::config::Builder::from(config);
    if let Some(o) = cloud.service_override("sts", region) {
        warn_unsupported_signing(&o.service, &o.signing_method, &o.signing_name, "sts");
        b = b
            .endpoint_url(&o.url)
            .region(Region::new(o.signing_region.clone()));
    }
    aws_sdk_sts::Client::from_conf(b.build())
}

fn warn_unsupported_signing(service: &str, method: &str, name: &str, default_name: &str) {
    if !(method.is_empty() || method.eq_ignore_ascii_case("v4")) {
        tracing::warn!(
            service,
            signing_method = method,
            "cloud.conf ServiceOverride SigningMethod is ignored: only SigV4 is supported"
        );
    }
    if !(name.is_empty() || name == default_name) {
        tracing::warn!(
            service,
            signing_name = name,
            "cloud.conf ServiceOverride SigningName is ignored: the service's own signing name is used"
        );
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
            .send(
                Service::Sts,
                Operation::StsAssumeRole,
                CallOptions::within(ASSUME_ROLE_DEADLINE),
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
pub mod imds {
    use aws_config::imds::Client;

    /// The region this instance runs in.
    pub async fn region() -> Result<String, String> {
        get("/latest/meta-data/placement/region").await
    }

    /// This instance's ID.
    pub async fn instance_id() -> Result<String, String> {
        get("/latest/meta-data/instance-id").await
    }

    async fn get(path: &str) -> Result<String, String> {
        // Honour the SDK's standard switch ourselves, so tests and off-EC2 runs
        // never send a packet to the link-local metadata address.
        if std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        {
            return Err(format!(
                "instance metadata {path}: disabled by AWS_EC2_METADATA_DISABLED=true"
            ));
        }
        let client = Client::builder().build();
        client.get(path).await.map(String::from).map_err(|e| {
            format!(
                "instance metadata {path}: {}",
                aws_smithy_types::error::display::DisplayErrorContext(&e)
            )
        })
    }
}
