//! Shared set-up for the AWS client's integration tests and benchmark: moto,
//! the fault proxy in front of it, seeding, and the check that every action
//! seen at the proxy is in the operation table.

#![allow(dead_code)] // the bench uses a subset

use std::time::Duration;

use aws_ccm::aws::client::clients::SdkClients;
use aws_ccm::aws::{Aws, AwsSettings, ClientOptions, Operation};
use aws_sdk_ec2::types::{InstanceType, ResourceType, Tag, TagSpecification};
use aws_smithy_types::retry::RetryConfig;
use ccm_testkit::aws_proxy::{FaultProxy, ProxyConfig};
use ccm_testkit::moto::{Moto, test_sdk_config};

pub const CLUSTER_ID: &str = "itest";
pub use ccm_testkit::moto::AMI;

/// moto, and the fault proxy in front of it.
pub struct World {
    pub moto: Moto,
    pub proxy: FaultProxy,
}

/// One seeded instance.
#[derive(Clone, Debug)]
pub struct Seeded {
    pub id: String,
    pub private_dns: String,
}

impl World {
    pub async fn start(proxy: ProxyConfig) -> World {
        let moto = Moto::start()
            .await
            .expect("start moto (run scripts/install-moto.sh)");
        let proxy = FaultProxy::start(&moto.endpoint(), proxy)
            .await
            .expect("start the fault proxy");
        let world = World { moto, proxy };
        // moto builds its EC2 backend (default VPC, subnets) on the first
        // EC2 request, which takes a second or two; do it here, straight at
        // moto, so no test times that.
        world
            .direct_ec2()
            .await
            .describe_vpcs()
            .send()
            .await
            .expect("warm up moto's EC2 backend");
        world
    }

    /// The client under test, talking to moto through the proxy.
    pub async fn client(&self, options: ClientOptions) -> Aws {
        self.client_with(options, AwsSettings::default()).await
    }

    /// [`Self::client`] with its caches kept as `settings` say.
    pub async fn client_with(&self, options: ClientOptions, settings: AwsSettings) -> Aws {
        Aws::new(
            sdk_clients(&self.proxy.endpoint()).await,
            CLUSTER_ID.to_string(),
            options,
            settings,
        )
    }

    /// An EC2 client straight to moto, for seeding: its calls do not show at
    /// the proxy, so the proxy counts only what the client under test sends.
    pub async fn direct_ec2(&self) -> aws_sdk_ec2::Client {
        sdk_clients(&self.moto.endpoint()).await.ec2
    }

    /// Launches `count` cluster instances (tagged
    /// `kubernetes.io/cluster/itest=owned`) in moto.
    pub async fn seed_instances(&self, count: usize) -> Vec<Seeded> {
        let ec2 = self.direct_ec2().await;
        let mut seeded = Vec::with_capacity(count);
        // moto launches any count in one call; chunks keep each response small.
        let mut left = count;
        while left > 0 {
            let batch = left.min(250);
            let out = ec2
                .run_instances()
                .image_id(AMI)
                .instance_type(InstanceType::T3Micro)
                .min_count(batch as i32)
                .max_count(batch as i32)
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .tags(
                            Tag::builder()
                                .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                                .value("owned")
                                .build(),
                        )
                        .build(),
                )
                .send()
                .await
                .expect("RunInstances at moto");
            for instance in out.instances() {
                seeded.push(Seeded {
                    id: instance.instance_id().unwrap_or_default().to_string(),
                    private_dns: instance.private_dns_name().unwrap_or_default().to_string(),
                });
            }
            left -= batch;
        }
        assert_eq!(seeded.len(), count, "moto launched what was asked");
        seeded
    }

    /// (service, action) pairs the proxy saw that the operation table lacks.
    pub fn unmapped_actions(&self) -> Vec<(String, String)> {
        self.proxy
            .calls()
            .iter()
            .filter(|(service, action, _)| Operation::from_names(service, action).is_none())
            .map(|(service, action, _)| (service.to_string(), action.to_string()))
            .collect()
    }

    pub fn assert_every_action_is_in_the_table(&self) {
        let missing = self.unmapped_actions();
        assert!(
            missing.is_empty(),
            "actions seen at the proxy but missing from the Operation table: {missing:?}"
        );
    }
}

/// SDK clients for `endpoint`, with SDK retries off as in production.
pub async fn sdk_clients(endpoint: &str) -> SdkClients {
    let config = test_sdk_config(endpoint)
        .await
        .to_builder()
        .retry_config(RetryConfig::disabled())
        .build();
    SdkClients {
        ec2: aws_sdk_ec2::Client::new(&config),
        elb: aws_sdk_elasticloadbalancing::Client::new(&config),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&config),
        sts: aws_sdk_sts::Client::new(&config),
        iam: aws_sdk_iam::Client::new(&config),
    }
}

/// Options for tests that inject failures: quick backoff so retries do not
/// dominate the test's time.
pub fn quick_retry(options: ClientOptions) -> ClientOptions {
    ClientOptions {
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(500),
        ..options
    }
}

/// Percentile (0..=100) of a sorted list.
pub fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() - 1) * pct) / 100;
    sorted[index]
}

/// What [`mixed_workload`] did.
#[derive(Debug, Default)]
pub struct WorkloadReport {
    pub calls: usize,
    pub errors: Vec<String>,
    pub throttling_errors: usize,
    pub elapsed: Duration,
    /// Caller-observed latency of each call, sorted.
    pub latencies: Vec<Duration>,
    /// The same, for the coalesced instance lookups only.
    pub lookup_latencies: Vec<Duration>,
}

/// `total` concurrent calls of the kinds a CCM makes, in fixed proportions:
/// 80 % single-instance lookups by ID, 10 % by private DNS name, 5 % other
/// EC2 reads, 2.5 % CreateTags, 2.5 % ELB/ELBv2 reads. Deterministic: the
/// i-th call is always the same request.
pub async fn mixed_workload(aws: &Aws, seeded: &[Seeded], total: usize) -> WorkloadReport {
    use aws_ccm::aws::AwsError;
    use futures::future::FutureExt;

    let start = std::time::Instant::now();
    let calls = (0..total).map(|i| {
        let aws = aws.clone();
        let instance = seeded[i % seeded.len()].clone();
        async move {
            let began = std::time::Instant::now();
            let result: Result<(), AwsError> = match i % 40 {
                0..=31 => aws.instance_by_id(&instance.id).await.map(|found| {
                    assert_eq!(
                        found.id, instance.id,
                        "a caller got someone else's instance"
                    );
                }),
                32..=35 => aws
                    .instance_by_private_dns(&instance.private_dns)
                    .await
                    .map(|found| {
                        assert_eq!(
                            found.id, instance.id,
                            "a caller got someone else's instance"
                        );
                    }),
                36 => ec2_read(&aws, i / 40).await,
                37 => ec2_read(&aws, i / 40 + 3).await,
                38 => aws
                    .ec2(Operation::Ec2CreateTags, |ec2| {
                        ec2.create_tags()
                            .resources(instance.id.clone())
                            .tags(Tag::builder().key("workload").value(i.to_string()).build())
                            .send()
                    })
                    .await
                    .map(drop),
                _ => {
                    if i % 80 == 39 {
                        aws.elb(Operation::ElbDescribeLoadBalancers, |elb| {
                            elb.describe_load_balancers().send()
                        })
                        .await
                        .map(drop)
                    } else {
                        aws.elbv2(Operation::Elbv2DescribeTargetGroups, |elbv2| {
                            elbv2.describe_target_groups().send()
                        })
                        .await
                        .map(drop)
                    }
                }
            };
            (result, began.elapsed(), i % 40 <= 35)
        }
        .boxed()
    });
    let results = futures::future::join_all(calls).await;
    let mut report = WorkloadReport {
        calls: total,
        elapsed: start.elapsed(),
        ..WorkloadReport::default()
    };
    for (result, latency, lookup) in results {
        report.latencies.push(latency);
        if lookup {
            report.lookup_latencies.push(latency);
        }
        if let Err(err) = result {
            if err.is_throttling() {
                report.throttling_errors += 1;
            }
            report.errors.push(err.to_string());
        }
    }
    report.latencies.sort();
    report.lookup_latencies.sort();
    report
}

/// One of six filtered EC2 reads, chosen by `which`.
pub async fn ec2_read(aws: &Aws, which: usize) -> Result<(), aws_ccm::aws::AwsError> {
    use aws_sdk_ec2::types::Filter;
    let vpc_filter = || {
        Filter::builder()
            .name("vpc-id")
            .values("vpc-00000000")
            .build()
    };
    match which % 6 {
        0 => aws
            .ec2(Operation::Ec2DescribeSubnets, |ec2| {
                ec2.describe_subnets().send()
            })
            .await
            .map(drop),
        1 => aws
            .ec2(Operation::Ec2DescribeVpcs, |ec2| ec2.describe_vpcs().send())
            .await
            .map(drop),
        2 => aws
            .ec2(Operation::Ec2DescribeSecurityGroups, |ec2| {
                // Filtered: an unfiltered, unpaginated call is charged to
                // AWS's smaller bucket.
                ec2.describe_security_groups().filters(vpc_filter()).send()
            })
            .await
            .map(drop),
        3 => aws
            .ec2(Operation::Ec2DescribeRouteTables, |ec2| {
                ec2.describe_route_tables().filters(vpc_filter()).send()
            })
            .await
            .map(drop),
        4 => aws
            .ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
                ec2.describe_availability_zones().send()
            })
            .await
            .map(drop),
        _ => aws
            .ec2(Operation::Ec2DescribeNetworkInterfaces, |ec2| {
                ec2.describe_network_interfaces()
                    .filters(vpc_filter())
                    .send()
            })
            .await
            .map(drop),
    }
}
