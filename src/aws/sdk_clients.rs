//! Stand-in for `clients::SdkClients` until the lead's `clients.rs` lands on
//! `main`: same name and fields, so switching is a one-line `use` change.

/// The SDK clients the [`super::client::AwsClient`] wraps. Build them with SDK
/// retries disabled (`RetryConfig::disabled()`) and no operation timeout: the
/// client layer owns both.
#[derive(Clone, Debug)]
pub struct SdkClients {
    pub ec2: aws_sdk_ec2::Client,
    pub elb: aws_sdk_elasticloadbalancing::Client,
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    pub sts: aws_sdk_sts::Client,
}

impl SdkClients {
    /// Builds all four clients from one shared configuration.
    pub fn from_sdk_config(config: &aws_types::SdkConfig) -> SdkClients {
        SdkClients {
            ec2: aws_sdk_ec2::Client::new(config),
            elb: aws_sdk_elasticloadbalancing::Client::new(config),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(config),
            sts: aws_sdk_sts::Client::new(config),
        }
    }
}
