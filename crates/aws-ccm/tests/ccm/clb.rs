//! Classic ELB end to end, annotation by annotation and update by update: the
//! real binary against the API test server and moto, its AWS calls counted at
//! the fault proxy so "minimal change" is asserted call by call.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, ResourceType};
use aws_sdk_elasticloadbalancing::types::LoadBalancerDescription;
use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule};
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::service::{group_by_name, hostname, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);
const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";

fn cluster_tag() -> String {
    format!("kubernetes.io/cluster/{CLUSTER_ID}")
}

/// A VPC laid out to exercise subnet discovery, with node groups and helpers
/// to make instances.
struct Vpc {
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    vpc_id: String,
    /// us-east-1a, public, `kubernetes.io/role/elb`, cluster-shared.
    public_a: String,
    /// us-east-1b, public, `kubernetes.io/role/elb`, cluster-shared.
    public_b: String,
    /// us-east-1a, private, `kubernetes.io/role/internal-elb`, Name `private-a`.
    private_a: String,
    /// The cluster-tagged node security groups.
    node_group: String,
    node_group2: String,
}

impl Vpc {
    async fn subnet(
        &self,
        cidr: &str,
        zone: &str,
        pairs: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let out = self
            .ec2
            .create_subnet()
            .vpc_id(&self.vpc_id)
            .cidr_block(cidr)
            .availability_zone(zone)
            .tag_specifications(tags(ResourceType::Subnet, pairs))
            .send()
            .await?;
        Ok(out
            .subnet()
            .and_then(|s| s.subnet_id())
            .unwrap()
            .to_string())
    }

    async fn group(&self, name: &str, pairs: &[(&str, &str)]) -> anyhow::Result<String> {
        let mut req = self
            .ec2
            .create_security_group()
            .group_name(name)
            .description(name)
            .vpc_id(&self.vpc_id);
        if !pairs.is_empty() {
            req = req.tag_specifications(tags(ResourceType::SecurityGroup, pairs));
        }
        Ok(req.send().await?.group_id().unwrap().to_string())
    }

    /// A cluster-tagged node instance in `subnet` with `group`.
    async fn instance(&self, subnet: &str, group: &str) -> anyhow::Result<String> {
        let ct = cluster_tag();
        let run = self
            .ec2
            .run_instances()
            .image_id(ccm_testkit::moto::AMI)
            .min_count(1)
            .max_count(1)
            .subnet_id(subnet)
            .security_group_ids(group)
            .tag_specifications(tags(ResourceType::Instance, &[(&ct, "owned")]))
            .send()
            .await?;
        Ok(run.instances()[0].instance_id().unwrap().to_string())
    }

    async fn describe(&self, name: &str) -> Option<LoadBalancerDescription> {
        let out = self
            .elb
            .describe_load_balancers()
            .load_balancer_names(name)
            .send()
            .await
            .ok()?;
        out.load_balancer_descriptions().first().cloned()
    }

    async fn lb_tags(&self, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let out = self
            .elb
            .describe_tags()
            .load_balancer_names(name)
            .send()
            .await?;
        Ok(out
            .tag_descriptions()
            .iter()
            .flat_map(|d| d.tags())
            .map(|t| {
                (
                    t.key().to_string(),
                    t.value().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }

    /// Rules of a group as `proto:from-to<-source` strings.
    async fn rules(&self, group_id: &str) -> anyhow::Result<BTreeSet<String>> {
        let out = self
            .ec2
            .describe_security_groups()
            .group_ids(group_id)
            .send()
            .await?;
        let mut rules = BTreeSet::new();
        for g in out.security_groups() {
            for p in g.ip_permissions() {
                let head = format!(
                    "{}:{}-{}",
                    p.ip_protocol().unwrap_or_default(),
                    p.from_port().unwrap_or(-1),
                    p.to_port().unwrap_or(-1)
                );
                for r in p.ip_ranges() {
                    rules.insert(format!("{head}<-{}", r.cidr_ip().unwrap_or_default()));
                }
                for s in p.user_id_group_pairs() {
                    rules.insert(format!("{head}<-{}", s.group_id().unwrap_or_default()));
                }
            }
        }
        Ok(rules)
    }

    /// Everything in AWS carrying this cluster's tag or made for it, except
    /// the node groups themselves: load balancers, groups, and node-group
    /// rules that admit another group. Empty once every Service is gone.
    /// The orphan audit of `aws-ccm orphans` (the library's
    /// `ops::orphans::find` over the live Services and Nodes) must find
    /// nothing either.
    async fn cluster_leftovers(&self, env: &Env) -> anyhow::Result<Vec<String>> {
        let live = aws_ccm::ops::orphans::Live::read(&env.api.client().await?).await?;
        let scope = aws_ccm::ops::orphans::Scope {
            cluster_id: CLUSTER_ID.into(),
            routes: None,
        };
        let mut left: Vec<String> =
            aws_ccm::ops::orphans::find(&aws_client(env).await, &live, &scope)
                .await?
                .orphans
                .into_iter()
                .map(|o| format!("orphan {} {}: {}", o.kind.as_str(), o.id, o.recognised))
                .collect();
        let lbs = self.elb.describe_load_balancers().send().await?;
        for lb in lbs.load_balancer_descriptions() {
            let name = lb.load_balancer_name().unwrap_or_default();
            if self.lb_tags(name).await?.contains_key(&cluster_tag()) {
                left.push(format!("load balancer {name}"));
            }
        }
        let groups = self
            .ec2
            .describe_security_groups()
            .filters(
                Filter::builder()
                    .name("tag-key")
                    .values(cluster_tag())
                    .build(),
            )
            .send()
            .await?;
        for g in groups.security_groups() {
            let id = g.group_id().unwrap_or_default();
            if id == self.node_group || id == self.node_group2 {
                for p in g.ip_permissions() {
                    for s in p.user_id_group_pairs() {
                        left.push(format!(
                            "rule in {id} from {}",
                            s.group_id().unwrap_or_default()
                        ));
                    }
                }
            } else {
                left.push(format!(
                    "security group {id} {}",
                    g.group_name().unwrap_or_default()
                ));
            }
        }
        Ok(left)
    }
}

/// A VPC with subnets in three zones: public-a and public-b (role elb,
/// cluster-shared, routed to an internet gateway through the main table),
/// private-a (role internal-elb, own route table without a gateway),
/// public-b-plain (no tags), public-c tagged for another cluster. With
/// `public: false` there is no gateway and only one untagged private subnet.
async fn vpc(env: &Env, public: bool) -> anyhow::Result<Vpc> {
    let conf = env.sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let elb = aws_sdk_elasticloadbalancing::Client::new(&conf);
    let out = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await?;
    let vpc_id = out.vpc().and_then(|v| v.vpc_id()).unwrap().to_string();
    let mut v = Vpc {
        ec2,
        elb,
        vpc_id,
        public_a: String::new(),
        public_b: String::new(),
        private_a: String::new(),
        node_group: String::new(),
        node_group2: String::new(),
    };
    let ct = cluster_tag();
    if public {
        v.public_a = v
            .subnet(
                "10.0.1.0/24",
                "us-east-1a",
                &[(&ct, "shared"), ("kubernetes.io/role/elb", "1")],
            )
            .await?;
        v.public_b = v
            .subnet(
                "10.0.2.0/24",
                "us-east-1b",
                &[(&ct, "shared"), ("kubernetes.io/role/elb", "1")],
            )
            .await?;
        v.subnet("10.0.5.0/24", "us-east-1b", &[("Name", "public-b-plain")])
            .await?;
        v.subnet(
            "10.0.6.0/24",
            "us-east-1c",
            &[
                ("kubernetes.io/cluster/other", "owned"),
                ("kubernetes.io/role/elb", "1"),
            ],
        )
        .await?;
        let igw = v.ec2.create_internet_gateway().send().await?;
        let igw_id = igw
            .internet_gateway()
            .and_then(|g| g.internet_gateway_id())
            .unwrap()
            .to_string();
        v.ec2
            .attach_internet_gateway()
            .vpc_id(&v.vpc_id)
            .internet_gateway_id(&igw_id)
            .send()
            .await?;
        let tables = v
            .ec2
            .describe_route_tables()
            .filters(Filter::builder().name("vpc-id").values(&v.vpc_id).build())
            .send()
            .await?;
        let main = tables.route_tables()[0]
            .route_table_id()
            .unwrap()
            .to_string();
        v.ec2
            .create_route()
            .route_table_id(&main)
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id(&igw_id)
            .send()
            .await?;
        v.private_a = v
            .subnet(
                "10.0.3.0/24",
                "us-east-1a",
                &[
                    ("kubernetes.io/role/internal-elb", "1"),
                    ("Name", "private-a"),
                ],
            )
            .await?;
        let private_table = v.ec2.create_route_table().vpc_id(&v.vpc_id).send().await?;
        v.ec2
            .associate_route_table()
            .route_table_id(
                private_table
                    .route_table()
                    .and_then(|t| t.route_table_id())
                    .unwrap(),
            )
            .subnet_id(&v.private_a)
            .send()
            .await?;
    } else {
        v.private_a = v
            .subnet("10.0.3.0/24", "us-east-1a", &[("Name", "private-a")])
            .await?;
    }
    v.node_group = v.group("nodes", &[(&ct, "owned")]).await?;
    v.node_group2 = v.group("nodes2", &[(&ct, "owned")]).await?;
    Ok(v)
}

/// A `type: LoadBalancer` Service with named TCP ports and extra spec fields.
fn lb_svc(
    name: &str,
    annotations: serde_json::Value,
    ports: &[(&str, i32)],
    extra_spec: serde_json::Value,
) -> Service {
    let mut spec = serde_json::json!({
        "type": "LoadBalancer",
        "selector": {"app": name},
        "ports": ports.iter().map(|(n, p)| serde_json::json!({"name": n, "port": p, "targetPort": 8080})).collect::<Vec<_>>(),
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn lb_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.clone().unwrap();
    format!("a{}", uid.replace('-', ""))[..32].to_string()
}

fn node_ports(svc: &Service) -> Vec<i32> {
    svc.spec
        .as_ref()
        .unwrap()
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.node_port.unwrap())
        .collect()
}

/// Mutating AWS calls the proxy saw, by action, attempts counted.
fn mutations(proxy: &FaultProxy) -> BTreeMap<String, u64> {
    crate::support::mutations(proxy)
        .into_iter()
        .map(|(k, n)| {
            (
                k.split_once(':').map_or(k.clone(), |(_, a)| a.to_string()),
                n,
            )
        })
        .collect()
}

fn calls(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|(a, n)| (a.to_string(), *n)).collect()
}

/// Completed ensures of one Service, from the CCM's log.
fn ensured(ccm: &Ccm, svc: &str) -> usize {
    let key = format!("service=default/{svc}");
    ccm.logs()
        .lines()
        .filter(|l| l.contains("load balancer ensured") && l.contains(&key))
        .count()
}

async fn wait_ensured(ccm: &Ccm, svc: &str, after: usize) -> anyhow::Result<()> {
    eventually(&format!("another ensure of {svc}"), WAIT, || async {
        (ensured(ccm, svc) > after).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

async fn wait_hostname(services: &Api<Service>, ccm: &Ccm, name: &str) -> anyhow::Result<String> {
    eventually(&format!("a hostname for {name}"), WAIT, || async {
        services.get(name).await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

/// The note of the first event with `reason` about Service `name`.
async fn event_note(client: &kube::Client, name: &str, reason: &str) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let e = eventually(&format!("a {reason} event for {name}"), WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(name)
            })
    })
    .await?;
    Ok(e.message.unwrap_or_default())
}

async fn start(env: &Env) -> anyhow::Result<(FaultProxy, Ccm)> {
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    Ok((proxy, ccm))
}

fn set<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn clb_annotations_each_show_up_in_aws() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let custom = v.group("custom-lb", &[]).await?;
    let extra = v.group("extra-lb", &[]).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let cert = "arn:aws:iam::123456789012:server-certificate/web";
    let tls = services
        .create(
            &pp,
            &lb_svc(
                "tls",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": cert,
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-ports": "https",
                    "service.beta.kubernetes.io/aws-load-balancer-backend-protocol": "http",
                    "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy": "ELBSecurityPolicy-TLS-1-2-2017-01",
                }),
                &[("http", 80), ("https", 443)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let tuned = services
        .create(
            &pp,
            &lb_svc(
                "tuned",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol": "*",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol": "http",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path": "/ready",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port": "32500",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold": "3",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold": "4",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "20",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout": "7",
                    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
                    "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled": "true",
                    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name": "logs-bucket",
                    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix": "web/",
                    "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval": "5",
                    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled": "true",
                    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout": "45",
                    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout": "180",
                    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=web,env=test",
                    "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8, 192.168.0.0/16",
                }),
                &[("http", 80), ("alt", 8080)],
                serde_json::json!({}),
            ),
        )
        .await?;
    services
        .create(
            &pp,
            &lb_svc(
                "local",
                serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}),
                &[("http", 80)],
                serde_json::json!({"externalTrafficPolicy": "Local", "loadBalancerSourceRanges": ["172.16.0.0/12"]}),
            ),
        )
        .await?;
    let groups = services
        .create(
            &pp,
            &lb_svc(
                "groups",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-security-groups": custom,
                    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups": extra,
                    "service.beta.kubernetes.io/aws-load-balancer-subnets": format!("{}, private-a", v.public_b),
                }),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let (proxy, ccm) = start(&env).await?;
    for name in ["tls", "tuned", "local", "groups"] {
        let host = wait_hostname(&services, &ccm, name).await?;
        assert!(host.ends_with(".elb.amazonaws.com"), "{name}: {host}");
    }

    // TLS: HTTPS with the certificate on the named ssl port, HTTP elsewhere
    // (backend-protocol http), the negotiation policy on the TLS listener.
    let name = lb_name(&tls);
    let lb = v.describe(&name).await.expect("tls load balancer");
    let np = node_ports(&tls);
    // moto echoes the front protocol as InstanceProtocol (it does not store
    // it), so the listeners' back ends are read from the request at the proxy.
    let asked = proxy.requests("CreateLoadBalancer");
    let asked = asked
        .iter()
        .find(|c| c.params.get("LoadBalancerName") == Some(&name))
        .expect("the CreateLoadBalancer call");
    let mut sent: Vec<(String, String, String, String, String)> = (1..=2)
        .map(|i| {
            let f = |k: &str| {
                asked
                    .params
                    .get(&format!("Listeners.member.{i}.{k}"))
                    .cloned()
                    .unwrap_or_default()
            };
            (
                f("LoadBalancerPort"),
                f("Protocol"),
                f("InstancePort"),
                f("InstanceProtocol"),
                f("SSLCertificateId"),
            )
        })
        .collect();
    sent.sort();
    let s = |x: &str| x.to_string();
    assert_eq!(
        sent,
        vec![
            (s("443"), s("HTTPS"), np[1].to_string(), s("HTTP"), s(cert)),
            (s("80"), s("HTTP"), np[0].to_string(), s("HTTP"), s("")),
        ]
    );
    let mut listeners: Vec<_> = lb
        .listener_descriptions()
        .iter()
        .map(|d| {
            let l = d.listener().unwrap();
            (
                l.load_balancer_port(),
                l.protocol().to_string(),
                l.instance_port(),
                l.ssl_certificate_id().map(str::to_string),
                d.policy_names().to_vec(),
            )
        })
        .collect();
    listeners.sort();
    let ssl_policy = "k8s-SSLNegotiationPolicy-ELBSecurityPolicy-TLS-1-2-2017-01".to_string();
    assert_eq!(
        listeners,
        vec![
            (80, "HTTP".into(), np[0], None, vec![]),
            (
                443,
                "HTTPS".into(),
                np[1],
                Some(cert.to_string()),
                vec![ssl_policy.clone()]
            ),
        ]
    );
    let policies = v
        .elb
        .describe_load_balancer_policies()
        .load_balancer_name(&name)
        .policy_names(&ssl_policy)
        .send()
        .await?;
    let p = &policies.policy_descriptions()[0];
    assert_eq!(p.policy_type_name(), Some("SSLNegotiationPolicyType"));
    assert!(
        p.policy_attribute_descriptions().iter().any(|a| {
            a.attribute_name() == Some("Reference-Security-Policy")
                && a.attribute_value() == Some("ELBSecurityPolicy-TLS-1-2-2017-01")
        }),
        "{p:?}"
    );

    // Proxy protocol on every backend port; health check, attributes, tags
    // and source ranges from the annotations.
    let name = lb_name(&tuned);
    let lb = v.describe(&name).await.expect("tuned load balancer");
    let np = node_ports(&tuned);
    let backends: BTreeMap<i32, Vec<String>> = lb
        .backend_server_descriptions()
        .iter()
        .map(|b| (b.instance_port().unwrap(), b.policy_names().to_vec()))
        .collect();
    let pp_policy = vec!["k8s-proxyprotocol-enabled".to_string()];
    assert_eq!(
        backends,
        BTreeMap::from([(np[0], pp_policy.clone()), (np[1], pp_policy.clone())])
    );
    assert!(
        lb.policies()
            .unwrap()
            .other_policies()
            .contains(&"k8s-proxyprotocol-enabled".to_string())
    );
    let hc = lb.health_check().unwrap();
    assert_eq!(
        (
            hc.target(),
            hc.healthy_threshold(),
            hc.unhealthy_threshold(),
            hc.interval(),
            hc.timeout()
        ),
        ("HTTP:32500/ready", 3, 4, 20, 7)
    );
    let attrs = v
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(&name)
        .send()
        .await?;
    let a = attrs.load_balancer_attributes().unwrap();
    assert!(a.cross_zone_load_balancing().unwrap().enabled());
    let log = a.access_log().unwrap();
    assert_eq!(
        (
            log.enabled(),
            log.s3_bucket_name(),
            log.s3_bucket_prefix(),
            log.emit_interval()
        ),
        (true, Some("logs-bucket"), Some("web/"), Some(5))
    );
    let draining = a.connection_draining().unwrap();
    assert_eq!((draining.enabled(), draining.timeout()), (true, Some(45)));
    assert_eq!(a.connection_settings().unwrap().idle_timeout(), 180);
    let lb_tags = v.lb_tags(&name).await?;
    for (k, val) in [
        ("team", "web"),
        ("env", "test"),
        (cluster_tag().as_str(), "owned"),
        ("kubernetes.io/service-name", "default/tuned"),
    ] {
        assert_eq!(lb_tags.get(k).map(String::as_str), Some(val), "{lb_tags:?}");
    }
    // Internet-facing: one public subnet per zone, role-tagged first; not the
    // private one, not the other cluster's.
    assert_eq!(
        lb.subnets().iter().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([v.public_a.clone(), v.public_b.clone()])
    );
    assert_eq!(lb.scheme(), Some("internet-facing"));
    let owned = group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
        .await
        .expect("owned group");
    let owned_id = owned.group_id().unwrap().to_string();
    assert_eq!(lb.security_groups(), std::slice::from_ref(&owned_id));
    assert!(
        owned
            .tags()
            .iter()
            .any(|t| t.key() == Some("team") && t.value() == Some("web"))
    );
    assert_eq!(
        v.rules(&owned_id).await?,
        set([
            "icmp:3-4<-10.0.0.0/8",
            "icmp:3-4<-192.168.0.0/16",
            "tcp:80-80<-10.0.0.0/8",
            "tcp:80-80<-192.168.0.0/16",
            "tcp:8080-8080<-10.0.0.0/8",
            "tcp:8080-8080<-192.168.0.0/16",
        ])
    );

    // externalTrafficPolicy Local: HTTP to the healthCheckNodePort /healthz,
    // default thresholds; internal; spec.loadBalancerSourceRanges.
    let local = services.get("local").await?;
    let name = lb_name(&local);
    let lb = v.describe(&name).await.expect("local load balancer");
    let hcnp = local.spec.as_ref().unwrap().health_check_node_port.unwrap();
    let hc = lb.health_check().unwrap();
    assert_eq!(
        (
            hc.target(),
            hc.healthy_threshold(),
            hc.unhealthy_threshold(),
            hc.interval(),
            hc.timeout()
        ),
        (format!("HTTP:{hcnp}/healthz").as_str(), 2, 6, 10, 5)
    );
    assert_eq!(lb.scheme(), Some("internal"));
    // Internal: internal-elb role first (private-a), then the cluster tag.
    assert_eq!(
        lb.subnets().iter().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([v.private_a.clone(), v.public_b.clone()])
    );
    let owned = group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
        .await
        .expect("owned group");
    assert_eq!(
        v.rules(owned.group_id().unwrap()).await?,
        set(["icmp:3-4<-172.16.0.0/12", "tcp:80-80<-172.16.0.0/12"])
    );

    // security-groups replaces the owned group, extra-security-groups adds;
    // the subnets annotation by ID and by Name tag.
    let name = lb_name(&groups);
    let lb = v.describe(&name).await.expect("groups load balancer");
    assert_eq!(
        lb.security_groups()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([custom.clone(), extra.clone()])
    );
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
            .await
            .is_none()
    );
    assert_eq!(
        lb.subnets().iter().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from([v.public_b.clone(), v.private_a.clone()])
    );
    // The annotated groups' rules are the user's: untouched.
    assert!(v.rules(&custom).await?.is_empty());
    // Every load balancer's own group may reach the node group.
    let node_rules = v.rules(&v.node_group).await?;
    assert!(
        node_rules.contains(&format!("-1:-1--1<-{custom}")),
        "{node_rules:?}"
    );

    // Everything above reads back as converged: a fresh process changes
    // nothing. Not the TLS Service: moto does not store a listener's
    // InstanceProtocol (it echoes the front protocol), so its HTTPS->HTTP
    // listener would look different at every read there, not on AWS.
    services.delete("tls", &DeleteParams::default()).await?;
    eventually("tls to be gone", WAIT, || async {
        matches!(services.get_opt("tls").await, Ok(None)).then_some(())
    })
    .await?;
    drop(ccm);
    let before = proxy.calls();
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &["--controllers=service"])
        .await?;
    for name in ["tuned", "local", "groups"] {
        wait_ensured(&ccm, name, 0).await?;
    }
    let after = proxy.calls();
    let changed: Vec<String> = after
        .iter()
        .filter(|(s, a, c)| {
            !a.starts_with("Describe")
                && !a.ends_with("+DryRun")
                && c.received > before.get(s, a).received
        })
        .map(|(_, a, _)| a.to_string())
        .collect();
    assert_eq!(changed, Vec::<String>::new(), "logs:\n{}", ccm.logs());
    env.finish().await
}

/// Applies a merge patch to Service `name`.
async fn patch_svc(
    services: &Api<Service>,
    name: &str,
    patch: serde_json::Value,
) -> anyhow::Result<()> {
    services
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

fn registered(lb: &LoadBalancerDescription) -> BTreeSet<String> {
    lb.instances()
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn clb_updates_make_only_the_minimal_change() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let i2 = v.instance(&v.public_a, &v.node_group).await?;
    let i3 = v.instance(&v.public_b, &v.node_group).await?;
    let i4 = v.instance(&v.public_b, &v.node_group).await?;
    let i5 = v.instance(&v.public_b, &v.node_group2).await?;
    let custom = v.group("custom-lb", &[]).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    for (n, i) in [("n1", &i1), ("n2", &i2), ("n3", &i3)] {
        nodes.create(&pp, &node(n, i)).await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &pp,
            &lb_svc(
                "web",
                serde_json::json!({}),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let name = lb_name(&svc);
    let (proxy, ccm) = start(&env).await?;
    wait_hostname(&services, &ccm, "web").await?;
    let lb = v.describe(&name).await.expect("load balancer");
    assert_eq!(registered(&lb), set([&i1, &i2, &i3].map(|s| s.as_str())));
    let owned_id = group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_string();
    let from_owned = format!("-1:-1--1<-{owned_id}");

    // Each step: the change, then exactly the calls it needs. Syncs are
    // counted from the log, which is read asynchronously: count them from the
    // known total, not from what has been read so far.
    let mut syncs = 1;
    wait_ensured(&ccm, "web", 0).await?;
    macro_rules! step {
        ($what:expr, $change:expr, $expect:expr) => {{
            proxy.reset_counts();
            $change;
            wait_ensured(&ccm, "web", syncs).await?;
            syncs += 1;
            assert_eq!(
                mutations(&proxy),
                calls($expect),
                "{}; logs:\n{}",
                $what,
                ccm.logs()
            );
        }};
    }

    step!(
        "add a port",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_ports(&svc)[0]},
            {"name": "alt", "port": 8443, "targetPort": 8080}]}})
        )
        .await?,
        &[
            ("AuthorizeSecurityGroupIngress", 1),
            ("CreateLoadBalancerListeners", 1)
        ]
    );
    let lb = v.describe(&name).await.unwrap();
    let ports: BTreeSet<i32> = lb
        .listener_descriptions()
        .iter()
        .map(|d| d.listener().unwrap().load_balancer_port())
        .collect();
    assert_eq!(ports, BTreeSet::from([80, 8443]));
    assert!(
        v.rules(&owned_id)
            .await?
            .contains("tcp:8443-8443<-0.0.0.0/0")
    );

    step!(
        "remove a port",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080, "nodePort": node_ports(&svc)[0]}]}})
        )
        .await?,
        &[
            ("DeleteLoadBalancerListeners", 1),
            ("RevokeSecurityGroupIngress", 1)
        ]
    );
    assert_eq!(
        v.rules(&owned_id).await?,
        set(["icmp:3-4<-0.0.0.0/0", "tcp:80-80<-0.0.0.0/0"])
    );
    assert_eq!(
        v.describe(&name)
            .await
            .unwrap()
            .listener_descriptions()
            .len(),
        1
    );

    step!(
        "add a node",
        nodes.create(&pp, &node("n4", &i4)).await?,
        &[("RegisterInstancesWithLoadBalancer", 1)]
    );
    assert_eq!(
        registered(&v.describe(&name).await.unwrap()),
        set([&i1, &i2, &i3, &i4].map(|s| s.as_str()))
    );

    step!(
        "add a node in another node group",
        nodes.create(&pp, &node("n5", &i5)).await?,
        &[
            ("AuthorizeSecurityGroupIngress", 1),
            ("RegisterInstancesWithLoadBalancer", 1)
        ]
    );
    assert!(v.rules(&v.node_group2).await?.contains(&from_owned));

    step!(
        "remove the only node of that group",
        nodes.delete("n5", &DeleteParams::default()).await?,
        &[
            ("DeregisterInstancesFromLoadBalancer", 1),
            ("RevokeSecurityGroupIngress", 1)
        ]
    );
    assert!(v.rules(&v.node_group2).await?.is_empty());
    assert!(v.rules(&v.node_group).await?.contains(&from_owned));

    step!(
        "exclude a node by label",
        nodes
            .patch(
                "n2",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                    "node.kubernetes.io/exclude-from-external-load-balancers": ""}}}))
            )
            .await?,
        &[("DeregisterInstancesFromLoadBalancer", 1)]
    );
    assert_eq!(
        registered(&v.describe(&name).await.unwrap()),
        set([&i1, &i3, &i4].map(|s| s.as_str()))
    );

    // Label n1 before the next node event: the label alone triggers no sync
    // (no Service selects nodes by it yet), and the Node watch is one ordered
    // stream, so once the sync for n4's deletion has run the CCM has seen the
    // label. Patching it just before the Service races the two watches: the
    // Service sync could see no node with the label and deregister them all.
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"pool": "web"}}})),
        )
        .await?;
    step!(
        "remove a node",
        nodes.delete("n4", &DeleteParams::default()).await?,
        &[("DeregisterInstancesFromLoadBalancer", 1)]
    );

    step!(
        "target-node-labels",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-target-node-labels": "pool=web"}}})
        )
        .await?,
        &[("DeregisterInstancesFromLoadBalancer", 1)]
    );
    assert_eq!(
        registered(&v.describe(&name).await.unwrap()),
        set([i1.as_str()])
    );

    step!(
        "idle timeout",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout": "300"}}})
        )
        .await?,
        &[("ModifyLoadBalancerAttributes", 1)]
    );
    let attrs = v
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(&name)
        .send()
        .await?;
    assert_eq!(
        attrs
            .load_balancer_attributes()
            .unwrap()
            .connection_settings()
            .unwrap()
            .idle_timeout(),
        300
    );

    step!(
        "source ranges annotation",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8"}}})
        )
        .await?,
        &[
            ("AuthorizeSecurityGroupIngress", 1),
            ("RevokeSecurityGroupIngress", 1)
        ]
    );
    assert_eq!(
        v.rules(&owned_id).await?,
        set(["icmp:3-4<-10.0.0.0/8", "tcp:80-80<-10.0.0.0/8"])
    );

    step!(
        "spec.loadBalancerSourceRanges adds a range",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"spec": {"loadBalancerSourceRanges": ["10.0.0.0/8", "192.168.0.0/16"]}})
        )
        .await?,
        &[("AuthorizeSecurityGroupIngress", 1)]
    );
    assert_eq!(
        v.rules(&owned_id).await?,
        set([
            "icmp:3-4<-10.0.0.0/8",
            "icmp:3-4<-192.168.0.0/16",
            "tcp:80-80<-10.0.0.0/8",
            "tcp:80-80<-192.168.0.0/16"
        ])
    );

    step!(
        "subnets annotation",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-subnets": format!("private-a, {}", v.public_b)}}})
        )
        .await?,
        &[
            ("AttachLoadBalancerToSubnets", 1),
            ("DetachLoadBalancerFromSubnets", 1)
        ]
    );
    assert_eq!(
        v.describe(&name)
            .await
            .unwrap()
            .subnets()
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([v.private_a.clone(), v.public_b.clone()])
    );

    // internal cannot change in place: a new load balancer, the old gone,
    // the owned group kept (same name), nothing else left behind.
    proxy.reset_counts();
    patch_svc(
        &services,
        "web",
        serde_json::json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-internal": "true"}}}),
    )
    .await?;
    wait_ensured(&ccm, "web", syncs).await?;
    syncs += 1;
    let m = mutations(&proxy);
    assert_eq!(
        (m.get("DeleteLoadBalancer"), m.get("CreateLoadBalancer")),
        (Some(&1), Some(&1)),
        "{m:?}"
    );
    assert!(
        !m.contains_key("CreateSecurityGroup")
            && !m.contains_key("ApplySecurityGroupsToLoadBalancer"),
        "{m:?}"
    );
    let lb = v.describe(&name).await.unwrap();
    assert_eq!(lb.scheme(), Some("internal"));
    assert_eq!(registered(&lb), set([i1.as_str()]));
    let all = v.elb.describe_load_balancers().send().await?;
    assert_eq!(all.load_balancer_descriptions().len(), 1);
    let groups = v
        .ec2
        .describe_security_groups()
        .filters(
            Filter::builder()
                .name("tag-key")
                .values(cluster_tag())
                .build(),
        )
        .send()
        .await?;
    let mut names: Vec<&str> = groups
        .security_groups()
        .iter()
        .filter_map(|g| g.group_name())
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![format!("k8s-elb-{name}").as_str(), "nodes", "nodes2"]
    );

    // security-groups replaces the owned group: applied, the node rule moved
    // to the new group, the owned group's rule and the group itself gone.
    step!(
        "security-groups replaces the owned group",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-security-groups": custom}}})
        )
        .await?,
        &[
            ("ApplySecurityGroupsToLoadBalancer", 1),
            ("AuthorizeSecurityGroupIngress", 1),
            ("DeleteSecurityGroup", 1),
            ("RevokeSecurityGroupIngress", 1)
        ]
    );
    assert_eq!(
        v.describe(&name).await.unwrap().security_groups(),
        std::slice::from_ref(&custom)
    );
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
            .await
            .is_none()
    );
    assert_eq!(
        v.rules(&v.node_group).await?,
        set([format!("-1:-1--1<-{custom}").as_str()])
    );

    // A node change that changes no backend starts no sync; the next sync
    // (an unrelated annotation) finds nothing to do after all of the above.
    nodes
        .patch(
            "n3",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"unrelated": "x"}}})),
        )
        .await?;
    step!(
        "an unrelated annotation",
        patch_svc(
            &services,
            "web",
            serde_json::json!({"metadata": {"annotations": {"example.com/owner": "team-a"}}})
        )
        .await?,
        &[]
    );
    assert_eq!(syncs, 16);
    assert_eq!(ensured(&ccm, "web"), syncs, "one sync per change, no more");
    env.finish().await
}

/// What the Go CCM leaves behind for Service `key` (LB `name`, node port
/// `np`, backend `instance`): its owned group (cluster tag only), the rules,
/// the internet-facing load balancer in both public subnets with its tags,
/// health check, instance, and the node group's rule.
async fn go_made_clb(
    v: &Vpc,
    name: &str,
    key: &str,
    np: i32,
    instance: &str,
) -> anyhow::Result<()> {
    let ct = cluster_tag();
    let owned = v
        .ec2
        .create_security_group()
        .group_name(format!("k8s-elb-{name}"))
        .description(format!("Security group for Kubernetes ELB {name} ({key})"))
        .vpc_id(&v.vpc_id)
        .tag_specifications(tags(ResourceType::SecurityGroup, &[(&ct, "owned")]))
        .send()
        .await?
        .group_id()
        .unwrap()
        .to_string();
    use aws_sdk_ec2::types::{IpPermission, IpRange, UserIdGroupPair};
    let anywhere = IpRange::builder().cidr_ip("0.0.0.0/0").build();
    v.ec2
        .authorize_security_group_ingress()
        .group_id(&owned)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(anywhere.clone())
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(anywhere)
                .build(),
        )
        .send()
        .await?;
    v.ec2
        .authorize_security_group_ingress()
        .group_id(&v.node_group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(&owned).build())
                .build(),
        )
        .send()
        .await?;
    use aws_sdk_elasticloadbalancing::types as elbt;
    v.elb
        .create_load_balancer()
        .load_balancer_name(name)
        .listeners(
            elbt::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_protocol("TCP")
                .instance_port(np)
                .build()?,
        )
        .subnets(&v.public_a)
        .subnets(&v.public_b)
        .security_groups(&owned)
        .tags(elbt::Tag::builder().key(&ct).value("owned").build()?)
        .tags(
            elbt::Tag::builder()
                .key("kubernetes.io/service-name")
                .value(key)
                .build()?,
        )
        .send()
        .await?;
    v.elb
        .configure_health_check()
        .load_balancer_name(name)
        .health_check(
            elbt::HealthCheck::builder()
                .target(format!("TCP:{np}"))
                .healthy_threshold(2)
                .unhealthy_threshold(6)
                .interval(10)
                .timeout(5)
                .build()?,
        )
        .send()
        .await?;
    v.elb
        .register_instances_with_load_balancer()
        .load_balancer_name(name)
        .instances(elbt::Instance::builder().instance_id(instance).build())
        .send()
        .await?;
    Ok(())
}

#[tokio::test]
async fn clb_made_by_the_go_ccm_is_adopted_without_a_single_mutation() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &lb_svc(
                "web",
                serde_json::json!({}),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let name = lb_name(&svc);
    let np = node_ports(&svc)[0];

    go_made_clb(&v, &name, "default/web", np, &i1).await?;
    let made = v.describe(&name).await.unwrap();

    let (proxy, ccm) = start(&env).await?;
    let host = wait_hostname(&services, &ccm, "web").await?;
    wait_ensured(&ccm, "web", 0).await?;
    assert_eq!(Some(host.as_str()), made.dns_name());
    assert!(
        proxy
            .calls()
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .forwarded
            > 0
    );
    assert_eq!(
        mutations(&proxy),
        calls(&[]),
        "adoption must not change AWS"
    );
    let svc = services.get("web").await?;
    assert!(
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string())
    );
    env.finish().await
}

/// Swap with drifted annotations: the Go CCM read `internal` only at
/// creation and refuses type changes, so a Service may say `internal: true`
/// over an internet-facing CLB, or `type: nlb` over a CLB. Neither is
/// deleted, recreated or converted: zero mutating calls, a Warning event
/// saying what differs and how to apply it.
#[tokio::test]
async fn go_made_clbs_with_drifted_annotations_are_neither_recreated_nor_converted()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let subnets = format!("{},{}", v.public_a, v.public_b);
    let mut made = Vec::new();
    for (svc, annotations) in [
        (
            "web",
            serde_json::json!({
                "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
                "service.beta.kubernetes.io/aws-load-balancer-subnets": subnets,
            }),
        ),
        (
            "typed",
            serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
        ),
    ] {
        let created = services
            .create(
                &PostParams::default(),
                &lb_svc(svc, annotations, &[("http", 80)], serde_json::json!({})),
            )
            .await?;
        let name = lb_name(&created);
        go_made_clb(
            &v,
            &name,
            &format!("default/{svc}"),
            node_ports(&created)[0],
            &i1,
        )
        .await?;
        made.push(name);
    }

    let (proxy, ccm) = start(&env).await?;
    let host = wait_hostname(&services, &ccm, "web").await?;
    assert_eq!(
        Some(host.as_str()),
        v.describe(&made[0]).await.unwrap().dns_name()
    );
    let note = event_note(&client, "web", "LoadBalancerSettingNotApplied").await?;
    assert!(
        note.contains("its scheme is internet-facing and the Service asks for internal")
            && note.contains("delete and recreate the Service"),
        "{note}"
    );
    let refused = event_note(&client, "typed", "SyncLoadBalancerFailed").await?;
    assert!(
        refused.contains("has a Classic ELB")
            && refused.contains("remove service.beta.kubernetes.io/aws-load-balancer-type"),
        "{refused}"
    );
    assert_eq!(
        mutations(&proxy),
        calls(&[]),
        "drifted annotations on Go-made load balancers must not change AWS\nlogs:\n{}",
        ccm.logs()
    );
    for name in &made {
        let lb = v.describe(name).await.unwrap();
        assert_eq!(lb.scheme(), Some("internet-facing"));
    }
    env.finish().await
}

#[tokio::test]
async fn clb_malformed_services_get_warnings_and_no_aws_calls() -> anyhow::Result<()> {
    let env = Env::start().await?;
    // Only a private subnet: internal load balancers fit, internet-facing ones do not.
    let v = vpc(&env, false).await?;
    let i1 = v.instance(&v.private_a, &v.node_group).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    let a = |k: &str, val: &str| serde_json::json!({ k: val });
    let internal = "service.beta.kubernetes.io/aws-load-balancer-internal";
    // A source range that is not a CIDR never reaches the CCM: kube-apiserver
    // refuses the Service (ValidateService parses the annotation with
    // GetLoadBalancerSourceRanges), and so does the API test server.
    let refused = services
        .create(
            &pp,
            &lb_svc(
                "bad-cidr",
                a(
                    "service.beta.kubernetes.io/load-balancer-source-ranges",
                    "10.0.0.0/33",
                ),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await
        .expect_err("the API server validates source ranges");
    let kube::Error::Api(status) = &refused else {
        panic!("expected an API error, got {refused:?}");
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains("load-balancer-source-ranges"),
        "{status:?}"
    );
    let cases: Vec<(&str, serde_json::Value, serde_json::Value, Vec<&str>)> = vec![
        (
            "bad-interval",
            a(
                "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval",
                "often",
            ),
            serde_json::json!({}),
            vec![
                "healthcheck-interval",
                "often",
                "whole number from 5 to 300",
            ],
        ),
        (
            "bad-protocol",
            // Without a certificate the Go CCM builds TCP listeners for any
            // value; with one it maps only the four lower-case words.
            serde_json::json!({
                "service.beta.kubernetes.io/aws-load-balancer-backend-protocol": "udp",
                "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": "arn:aws:acm:us-east-1:123456789012:certificate/c",
                internal: "true",
            }),
            serde_json::json!({}),
            vec!["backend-protocol", "udp", "http, https, ssl or tcp"],
        ),
        (
            "nlb-only",
            a(
                "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes",
                "preserve_client_ip.enabled=true",
            ),
            serde_json::json!({}),
            vec![
                "target-group-attributes",
                "preserve_client_ip.enabled=true",
                "only supported on an NLB",
            ],
        ),
        (
            "lb-ip",
            a(internal, "true"),
            serde_json::json!({"loadBalancerIP": "10.0.3.10"}),
            vec![
                "spec.loadBalancerIP",
                "10.0.3.10",
                "remove spec.loadBalancerIP",
            ],
        ),
    ];
    for (name, ann, spec, _) in &cases {
        services
            .create(
                &pp,
                &lb_svc(name, ann.clone(), &[("http", 80)], spec.clone()),
            )
            .await?;
    }
    let public = services
        .create(
            &pp,
            &lb_svc(
                "no-subnet",
                serde_json::json!({}),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let ok = services
        .create(
            &pp,
            &lb_svc(
                "ok",
                a(internal, "true"),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;

    let (proxy, ccm) = start(&env).await?;
    wait_hostname(&services, &ccm, "ok").await?;
    for (name, _, _, words) in &cases {
        let note = event_note(&client, name, "SyncLoadBalancerFailed").await?;
        for w in words {
            assert!(note.contains(w), "{name}: {note:?} lacks {w:?}");
        }
        let svc = services.get(name).await?;
        assert!(hostname(&svc).is_none(), "{name}");
        // Refused before anything: not even the finalizer.
        assert!(
            svc.metadata.finalizers.unwrap_or_default().is_empty(),
            "{name}"
        );
    }
    let note = event_note(&client, "no-subnet", "SyncLoadBalancerFailed").await?;
    for w in [
        "no suitable subnet",
        "kubernetes.io/role/elb",
        "kubernetes.io/cluster/ccm-test",
        "internet gateway",
    ] {
        assert!(note.contains(w), "{note:?} lacks {w:?}");
    }
    // Every mutating call the CCM made is the valid Service's creation; the
    // malformed ones and the one without a subnet made none.
    assert_eq!(
        mutations(&proxy),
        calls(&[
            ("AuthorizeSecurityGroupIngress", 2),
            ("ConfigureHealthCheck", 1),
            ("CreateLoadBalancer", 1),
            ("CreateSecurityGroup", 1),
            ("RegisterInstancesWithLoadBalancer", 1),
        ])
    );
    let all = v.elb.describe_load_balancers().send().await?;
    let names: Vec<&str> = all
        .load_balancer_descriptions()
        .iter()
        .filter_map(|l| l.load_balancer_name())
        .collect();
    assert_eq!(names, vec![lb_name(&ok).as_str()]);
    assert!(v.describe(&lb_name(&public)).await.is_none());
    env.finish().await
}

/// Whether the Service still exists, pending deletion, with the finalizer.
async fn pending_with_finalizer(services: &Api<Service>, name: &str) -> anyhow::Result<bool> {
    let svc = services.get(name).await?;
    Ok(svc.metadata.deletion_timestamp.is_some()
        && svc
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&FINALIZER.to_string()))
}

#[tokio::test]
async fn clb_deletion_retries_dependency_violation_and_keeps_the_finalizer_on_failure()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let i2 = v.instance(&v.public_b, &v.node_group2).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    nodes
        .create(&PostParams::default(), &node("n2", &i2))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut names = BTreeMap::new();
    for name in ["web", "stuck", "retyped"] {
        // A finalizer of someone else's keeps the object readable after ours goes.
        let mut svc = lb_svc(
            name,
            serde_json::json!({}),
            &[("http", 80)],
            serde_json::json!({}),
        );
        svc.metadata.finalizers = Some(vec!["example.com/keep".into()]);
        let svc = services.create(&PostParams::default(), &svc).await?;
        names.insert(name, lb_name(&svc));
    }
    let (proxy, ccm) = start(&env).await?;
    for name in ["web", "stuck", "retyped"] {
        wait_hostname(&services, &ccm, name).await?;
    }

    // No longer type LoadBalancer: everything goes, then the finalizer and
    // the status; the Service itself stays.
    patch_svc(
        &services,
        "retyped",
        serde_json::json!({"spec": {"type": "ClusterIP", "allocateLoadBalancerNodePorts": null,
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    )
    .await?;
    let retyped = eventually("retyped to lose our finalizer", WAIT, || async {
        let svc = services.get("retyped").await.ok()?;
        (!svc
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .contains(&FINALIZER.to_string()))
        .then_some(svc)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(hostname(&retyped).is_none());
    assert!(v.describe(&names["retyped"]).await.is_none());
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{}", names["retyped"]))
            .await
            .is_none()
    );
    let web_group = group_by_name(&v.ec2, &format!("k8s-elb-{}", names["web"]))
        .await
        .unwrap()
        .group_id()
        .unwrap()
        .to_string();

    // The group is "still in use" three times: retried within the bound; the
    // finalizer stays until the group is gone.
    proxy.reset_counts();
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 400,
            code: "DependencyViolation".into(),
            message: format!("resource {web_group} has a dependent object"),
        })
        .for_action("DeleteSecurityGroup")
        .at_most(3),
    ]);
    services.delete("web", &DeleteParams::default()).await?;
    eventually("two refused group deletions", WAIT, || async {
        (proxy.calls().get("ec2", "DeleteSecurityGroup").faulted >= 2).then_some(())
    })
    .await?;
    assert!(pending_with_finalizer(&services, "web").await?);
    assert!(
        v.describe(&names["web"]).await.is_none(),
        "LB deleted first"
    );
    eventually("our finalizer to go from web", WAIT, || async {
        (!pending_with_finalizer(&services, "web").await.ok()?).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let c = proxy.calls().get("ec2", "DeleteSecurityGroup");
    assert_eq!((c.received, c.faulted), (4, 3));
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{}", names["web"]))
            .await
            .is_none()
    );
    assert!(
        !event_note(&client, "web", "DeletedLoadBalancer")
            .await?
            .is_empty()
    );

    // A failure that does not pass: a Warning, the finalizer kept; once it
    // clears, the retry finishes the job.
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 403,
            code: "UnauthorizedOperation".into(),
            message: "You are not authorized to perform this operation.".into(),
        })
        .for_action("DeleteSecurityGroup"),
    ]);
    services.delete("stuck", &DeleteParams::default()).await?;
    let note = event_note(&client, "stuck", "DeleteLoadBalancerFailed").await?;
    assert!(
        note.contains("UnauthorizedOperation") || note.contains("not authorized"),
        "{note}"
    );
    assert!(pending_with_finalizer(&services, "stuck").await?);
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{}", names["stuck"]))
            .await
            .is_some()
    );
    proxy.set_faults(vec![]);
    eventually("our finalizer to go from stuck", WAIT, || async {
        (!pending_with_finalizer(&services, "stuck").await.ok()?).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // Nothing of this cluster's is left: no load balancer, no owned group,
    // no rule in either node group.
    assert_eq!(v.cluster_leftovers(&env).await?, Vec::<String>::new());
    env.finish().await
}

#[tokio::test]
async fn clb_cloud_conf_group_disabled_ingress_and_shared_probe() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let global = v.group("global-elb", &[]).await?;
    std::fs::write(
        &env.cloud_conf,
        format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n\
             ElbSecurityGroup = {global}\nDisableSecurityGroupIngress = true\n\
             ClusterServiceLoadBalancerHealthProbeMode = Shared\n\
             ClusterServiceSharedLoadBalancerHealthProbePort = 10300\n\
             ClusterServiceSharedLoadBalancerHealthProbePath = /livez\n"
        ),
    )?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &lb_svc(
                "web",
                serde_json::json!({}),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let name = lb_name(&svc);
    let (proxy, ccm) = start(&env).await?;
    wait_hostname(&services, &ccm, "web").await?;
    wait_ensured(&ccm, "web", 0).await?;
    let lb = v.describe(&name).await.expect("load balancer");
    // The cloud.conf group instead of an owned one, its rules left alone;
    // no rule in the node group; the shared kube-proxy probe.
    assert_eq!(lb.security_groups(), std::slice::from_ref(&global));
    assert!(
        group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
            .await
            .is_none()
    );
    assert!(v.rules(&global).await?.is_empty());
    assert!(v.rules(&v.node_group).await?.is_empty());
    assert_eq!(lb.health_check().unwrap().target(), "HTTP:10300/livez");
    let m = mutations(&proxy);
    assert!(
        !m.contains_key("CreateSecurityGroup") && !m.contains_key("AuthorizeSecurityGroupIngress"),
        "{m:?}"
    );

    // Deleting leaves the cloud.conf group in place (it is not this Service's).
    services.delete("web", &DeleteParams::default()).await?;
    eventually("web to be gone", WAIT, || async {
        matches!(services.get_opt("web").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(v.describe(&name).await.is_none());
    assert!(group_by_name(&v.ec2, "global-elb").await.is_some());
    assert_eq!(v.cluster_leftovers(&env).await?, Vec::<String>::new());
    env.finish().await
}

#[tokio::test]
async fn clb_shared_group_node_rule_goes_when_no_load_balancer_needs_it() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let i2 = v.instance(&v.public_b, &v.node_group2).await?;
    let shared = v.group("shared-lb", &[]).await?;
    // A group outside the cluster that someone opened to the shared group
    // by hand: not the CCM's to revoke, ever.
    let outsider = v.group("outsider", &[]).await?;
    v.ec2
        .authorize_security_group_ingress()
        .group_id(&outsider)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(
                    aws_sdk_ec2::types::UserIdGroupPair::builder()
                        .group_id(&shared)
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    let mut n1 = node("n1", &i1);
    n1.metadata.labels = Some(BTreeMap::from([("pool".into(), "one".into())]));
    nodes.create(&pp, &n1).await?;
    nodes.create(&pp, &node("n2", &i2)).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let groups = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
    // a: every node; b: only n1 (node group 1). Both behind the shared group.
    services
        .create(
            &pp,
            &lb_svc(
                "a",
                serde_json::json!({ groups: shared }),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    services
        .create(
            &pp,
            &lb_svc(
                "b",
                serde_json::json!({
                    groups: shared,
                    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels": "pool=one",
                }),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let (proxy, ccm) = start(&env).await?;
    wait_hostname(&services, &ccm, "a").await?;
    wait_hostname(&services, &ccm, "b").await?;
    let from_shared = format!("-1:-1--1<-{shared}");
    assert!(v.rules(&v.node_group).await?.contains(&from_shared));
    assert!(v.rules(&v.node_group2).await?.contains(&from_shared));

    // n2 leaves a; no load balancer with the shared group reaches node
    // group 2 any more: its rule goes, node group 1's stays.
    // One sync of a so far (the log is read asynchronously: wait for it).
    wait_ensured(&ccm, "a", 0).await?;
    let before = 1;
    proxy.reset_counts();
    nodes
        .patch(
            "n2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "node.kubernetes.io/exclude-from-external-load-balancers": ""}}})),
        )
        .await?;
    wait_ensured(&ccm, "a", before).await?;
    assert_eq!(
        mutations(&proxy),
        calls(&[
            ("DeregisterInstancesFromLoadBalancer", 1),
            ("RevokeSecurityGroupIngress", 1)
        ])
    );
    assert!(v.rules(&v.node_group2).await?.is_empty());
    assert!(v.rules(&v.node_group).await?.contains(&from_shared));

    // Deleting a: b still needs node group 1's rule.
    services.delete("a", &DeleteParams::default()).await?;
    eventually("a to be gone", WAIT, || async {
        matches!(services.get_opt("a").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(v.rules(&v.node_group).await?.contains(&from_shared));

    // Deleting b, the last user: the rule goes; the shared group stays.
    services.delete("b", &DeleteParams::default()).await?;
    eventually("b to be gone", WAIT, || async {
        matches!(services.get_opt("b").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(v.cluster_leftovers(&env).await?, Vec::<String>::new());
    assert!(group_by_name(&v.ec2, "shared-lb").await.is_some());
    assert!(
        v.rules(&outsider).await?.contains(&from_shared),
        "the outsider group's own rule stays"
    );
    env.finish().await
}

/// The node group's permissions as moto (like AWS) reports them: per
/// permission, its protocol and the groups of its pairs.
async fn node_permissions(v: &Vpc) -> anyhow::Result<Vec<(String, BTreeSet<String>)>> {
    let out = v
        .ec2
        .describe_security_groups()
        .group_ids(&v.node_group)
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .map(|p| {
            let pairs = p
                .user_id_group_pairs()
                .iter()
                .filter_map(|s| s.group_id().map(str::to_string))
                .collect();
            (p.ip_protocol().unwrap_or_default().to_string(), pairs)
        })
        .collect())
}

/// Upstream's #1473: a node group whose one all-traffic permission holds
/// both its self-reference and the owned group's pair (as the console or
/// Terraform writes it). The managed-to-BYO change (`security-groups`)
/// revokes the owned group's pair only: the revoke the CCM sends names one
/// pair, and the self-reference stays.
#[tokio::test]
async fn clb_byo_groups_revoke_only_the_owned_pair_of_a_shared_permission() -> anyhow::Result<()> {
    use aws_sdk_ec2::types::{IpPermission, UserIdGroupPair};
    let env = Env::start().await?;
    let v = vpc(&env, true).await?;
    let i1 = v.instance(&v.public_a, &v.node_group).await?;
    let custom = v.group("custom-lb", &[]).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &i1))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &lb_svc(
                "web",
                serde_json::json!({}),
                &[("http", 80)],
                serde_json::json!({}),
            ),
        )
        .await?;
    let name = lb_name(&svc);
    go_made_clb(&v, &name, "default/web", node_ports(&svc)[0], &i1).await?;
    let owned = group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
        .await
        .and_then(|g| g.group_id().map(str::to_string))
        .expect("the owned group");
    // The node rule written again as one permission with both pairs.
    let pair = |id: &str| UserIdGroupPair::builder().group_id(id).build();
    v.ec2
        .revoke_security_group_ingress()
        .group_id(&v.node_group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(pair(&owned))
                .build(),
        )
        .send()
        .await?;
    v.ec2
        .authorize_security_group_ingress()
        .group_id(&v.node_group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(pair(&v.node_group))
                .user_id_group_pairs(pair(&owned))
                .build(),
        )
        .send()
        .await?;
    let both = BTreeSet::from([v.node_group.clone(), owned.clone()]);
    assert_eq!(
        node_permissions(&v).await?,
        vec![("-1".to_string(), both)],
        "one permission holding two pairs, as AWS reports it"
    );

    let (proxy, ccm) = start(&env).await?;
    wait_hostname(&services, &ccm, "web").await?;
    wait_ensured(&ccm, "web", 0).await?;
    assert_eq!(mutations(&proxy), calls(&[]), "adopted as it is");
    patch_svc(
        &services,
        "web",
        serde_json::json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-security-groups": custom}}}),
    )
    .await?;
    wait_ensured(&ccm, "web", 1).await?;
    eventually("the owned group to be gone", WAIT, || async {
        group_by_name(&v.ec2, &format!("k8s-elb-{name}"))
            .await
            .is_none()
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // The one revoke sent to the node group names the owned group's pair
    // and nothing else of the permission.
    let revokes: Vec<_> = proxy
        .requests("RevokeSecurityGroupIngress")
        .into_iter()
        .filter(|c| c.params.get("GroupId") == Some(&v.node_group))
        .collect();
    let [revoke] = revokes.as_slice() else {
        panic!("one revoke on the node group: {revokes:#?}");
    };
    let named: Vec<(&str, &str)> = revoke
        .params
        .iter()
        .filter(|(k, _)| k.starts_with("IpPermissions."))
        .map(|(k, val)| (k.as_str(), val.as_str()))
        .collect();
    assert_eq!(
        named,
        vec![
            ("IpPermissions.1.Groups.1.GroupId", owned.as_str()),
            ("IpPermissions.1.IpProtocol", "-1"),
        ],
        "{revoke:#?}"
    );
    // The self-reference stays, beside the BYO group's new rule.
    assert_eq!(
        v.rules(&v.node_group).await?,
        set([
            format!("-1:-1--1<-{}", v.node_group).as_str(),
            format!("-1:-1--1<-{custom}").as_str()
        ])
    );
    services.delete("web", &DeleteParams::default()).await?;
    eventually("web to be gone", WAIT, || async {
        matches!(services.get_opt("web").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(
        v.rules(&v.node_group)
            .await?
            .contains(&format!("-1:-1--1<-{}", v.node_group)),
        "the self-reference outlives the Service"
    );
    env.finish().await
}
