//! An in-memory EC2 instance store that answers `DescribeInstances` on the
//! EC2 query wire protocol, for the scale benchmark only.
//!
//! moto cannot hold thousands of instances: it answers a 1,000-instance
//! `DescribeInstances` page in about 8 s (its generic serializer spends
//! ~8 ms per instance) and launches 5,000 instances in over a minute. The
//! benchmark plugs this store into the [`FaultProxy`](super::aws_proxy::FaultProxy)
//! with `serve_locally`: `DescribeInstances` is then answered here (after the
//! proxy's throttling and latency, like every call), and every other call
//! still goes to moto, which keeps the VPC, subnets, security groups and load
//! balancers. The instances reference moto's subnet, VPC and groups by ID.
//!
//! Only what the CCM sends is understood: the `instance-id`,
//! `private-dns-name`, `instance-state-name`, `tag-key`, `tag:<key>`,
//! `vpc-id` and `subnet-id` filters (exact values), `InstanceId.N`,
//! `MaxResults` and `NextToken`. Anything else is refused with EC2's own
//! error codes rather than answered wrongly.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::sync::Arc;

use parking_lot::RwLock;

use super::aws_proxy::{AwsError, LocalService, xml_escape as escape};

/// One instance as the simulator stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimInstance {
    pub id: String,
    pub private_dns_name: String,
    pub private_ip: Ipv4Addr,
    /// `running`, `stopped`, `terminated`, …
    pub state: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    /// `(group ID, group name)`: EC2 describes both.
    pub security_groups: Vec<(String, String)>,
    pub tags: BTreeMap<String, String>,
}

/// What [`InstanceSim::launch`] needs besides a count.
#[derive(Clone, Debug)]
pub struct LaunchTemplate {
    pub instance_type: String,
    pub availability_zone: String,
    pub subnet_id: String,
    pub vpc_id: String,
    /// `(group ID, group name)`.
    pub security_groups: Vec<(String, String)>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Default)]
struct Inner {
    instances: BTreeMap<String, SimInstance>,
    launched: u32,
}

/// The instance store; share it with the proxy as an `Arc`.
#[derive(Default)]
pub struct InstanceSim {
    inner: RwLock<Inner>,
}

const PAGE_MAX: usize = 1000;
const PAGE_MIN: usize = 5;
/// EC2 state codes, as the API reports them.
fn state_code(state: &str) -> u16 {
    match state {
        "pending" => 0,
        "running" => 16,
        "shutting-down" => 32,
        "terminated" => 48,
        "stopping" => 64,
        "stopped" => 80,
        _ => 0,
    }
}

impl InstanceSim {
    pub fn new() -> Arc<InstanceSim> {
        Arc::new(InstanceSim::default())
    }

    /// Adds `count` running instances with fresh IDs and private addresses
    /// from 10.0.0.0/8 (`ip-10-x-y-z.ec2.internal` names), as RunInstances
    /// would, and returns them.
    pub fn launch(&self, template: &LaunchTemplate, count: usize) -> Vec<SimInstance> {
        let mut inner = self.inner.write();
        (0..count)
            .map(|_| {
                inner.launched += 1;
                let n = inner.launched;
                let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + n);
                let [a, b, c, d] = ip.octets();
                let instance = SimInstance {
                    id: format!("i-{n:017x}"),
                    private_dns_name: format!("ip-{a}-{b}-{c}-{d}.ec2.internal"),
                    private_ip: ip,
                    state: "running".into(),
                    instance_type: template.instance_type.clone(),
                    availability_zone: template.availability_zone.clone(),
                    subnet_id: template.subnet_id.clone(),
                    vpc_id: template.vpc_id.clone(),
                    security_groups: template.security_groups.clone(),
                    tags: template.tags.clone(),
                };
                inner
                    .instances
                    .insert(instance.id.clone(), instance.clone());
                instance
            })
            .collect()
    }

    /// Sets an instance's state (`stopped`, `terminated`, …); false when
    /// there is no such instance.
    pub fn set_state(&self, id: &str, state: &str) -> bool {
        match self.inner.write().instances.get_mut(id) {
            Some(instance) => {
                instance.state = state.to_string();
                true
            }
            None => false,
        }
    }

    /// Forgets an instance, as EC2 does some time after termination.
    pub fn remove(&self, id: &str) -> bool {
        self.inner.write().instances.remove(id).is_some()
    }

    pub fn get(&self, id: &str) -> Option<SimInstance> {
        self.inner.read().instances.get(id).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner.read().instances.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Answers one `DescribeInstances` request given its decoded parameters.
    pub fn describe_instances(&self, params: &[(String, String)]) -> Result<String, AwsError> {
        let request = DescribeRequest::parse(params)?;
        let inner = self.inner.read();
        if let Some(missing) = request
            .instance_ids
            .iter()
            .find(|id| !inner.instances.contains_key(*id))
        {
            return Err(AwsError::new(
                400,
                "InvalidInstanceID.NotFound",
                format!("The instance ID '{missing}' does not exist"),
            ));
        }
        let start = request.next_token.as_deref().unwrap_or("");
        let limit = request.max_results.unwrap_or(usize::MAX);
        let mut page = Vec::new();
        let mut next_token = None;
        for (id, instance) in inner
            .instances
            .range::<str, _>((std::ops::Bound::Excluded(start), std::ops::Bound::Unbounded))
        {
            if !request.instance_ids.is_empty() && !request.instance_ids.contains(id) {
                continue;
            }
            if !request.filters.iter().all(|f| f.matches(instance)) {
                continue;
            }
            if page.len() == limit {
                next_token = page.last().map(|i: &&SimInstance| i.id.clone());
                break;
            }
            page.push(instance);
        }
        Ok(render(&page, next_token.as_deref()))
    }
}

impl LocalService for InstanceSim {
    fn answer(
        &self,
        service: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Option<Result<String, AwsError>> {
        (service == "ec2" && action == "DescribeInstances").then(|| self.describe_instances(params))
    }
}

struct DescribeRequest {
    instance_ids: Vec<String>,
    filters: Vec<Filter>,
    max_results: Option<usize>,
    next_token: Option<String>,
}

struct Filter {
    name: String,
    values: Vec<String>,
}

impl Filter {
    fn matches(&self, i: &SimInstance) -> bool {
        let any = |v: &str| self.values.iter().any(|want| want == v);
        match self.name.as_str() {
            "instance-id" => any(&i.id),
            "private-dns-name" => any(&i.private_dns_name),
            "instance-state-name" => any(&i.state),
            "vpc-id" => any(&i.vpc_id),
            "subnet-id" => any(&i.subnet_id),
            "tag-key" => i.tags.keys().any(|k| any(k)),
            name => name
                .strip_prefix("tag:")
                .and_then(|key| i.tags.get(key))
                .is_some_and(|v| any(v)),
        }
    }
}

const FILTERS: [&str; 6] = [
    "instance-id",
    "private-dns-name",
    "instance-state-name",
    "vpc-id",
    "subnet-id",
    "tag-key",
];

impl DescribeRequest {
    fn parse(params: &[(String, String)]) -> Result<DescribeRequest, AwsError> {
        let invalid = |message: String| AwsError::new(400, "InvalidParameterValue", message);
        let mut instance_ids = Vec::new();
        let mut filters: BTreeMap<u32, Filter> = BTreeMap::new();
        let mut max_results = None;
        let mut next_token = None;
        for (name, value) in params {
            let parts: Vec<&str> = name.split('.').collect();
            match parts.as_slice() {
                ["InstanceId", _] => instance_ids.push(value.clone()),
                ["Filter", n, "Name"] => {
                    filters
                        .entry(index(n)?)
                        .or_insert_with(|| Filter {
                            name: String::new(),
                            values: Vec::new(),
                        })
                        .name = value.clone();
                }
                ["Filter", n, "Value", _] => {
                    if value.contains('*') || value.contains('?') {
                        return Err(invalid(format!(
                            "the simulator matches filter values exactly; got the wildcard {value:?}"
                        )));
                    }
                    filters
                        .entry(index(n)?)
                        .or_insert_with(|| Filter {
                            name: String::new(),
                            values: Vec::new(),
                        })
                        .values
                        .push(value.clone());
                }
                ["MaxResults"] => {
                    let n: usize = value
                        .parse()
                        .map_err(|_| invalid(format!("MaxResults {value:?} is not a number")))?;
                    if !(PAGE_MIN..=PAGE_MAX).contains(&n) {
                        return Err(invalid(format!(
                            "Value ( {n} ) for parameter maxResults is invalid. Expecting a value between {PAGE_MIN} and {PAGE_MAX}."
                        )));
                    }
                    max_results = Some(n);
                }
                ["NextToken"] => next_token = Some(value.clone()),
                ["DryRun"] => {}
                _ => {
                    return Err(invalid(format!(
                        "the simulator does not know the parameter {name:?}"
                    )));
                }
            }
        }
        if max_results.is_some() && !instance_ids.is_empty() {
            return Err(invalid(
                "The parameter instancesSet cannot be used with the parameter maxResults".into(),
            ));
        }
        for filter in filters.values() {
            if !FILTERS.contains(&filter.name.as_str()) && !filter.name.starts_with("tag:") {
                return Err(invalid(format!("The filter '{}' is invalid", filter.name)));
            }
        }
        Ok(DescribeRequest {
            instance_ids,
            filters: filters.into_values().collect(),
            max_results,
            next_token,
        })
    }
}

fn index(n: &str) -> Result<u32, AwsError> {
    n.parse().map_err(|_| {
        AwsError::new(
            400,
            "InvalidParameterValue",
            format!("filter index {n:?} is not a number"),
        )
    })
}

/// The response body, one reservation per instance.
fn render(page: &[&SimInstance], next_token: Option<&str>) -> String {
    let mut xml = String::with_capacity(256 + page.len() * 1500);
    xml.push_str(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>sim</requestId><reservationSet>",
    );
    for i in page {
        let alive = !matches!(i.state.as_str(), "terminated" | "shutting-down");
        let _ = write!(
            xml,
            "<item><reservationId>r-{id}</reservationId><ownerId>123456789012</ownerId><instancesSet><item>\
             <instanceId>{id}</instanceId><imageId>{ami}</imageId>\
             <instanceState><code>{code}</code><name>{state}</name></instanceState>\
             <privateDnsName>{dns}</privateDnsName><dnsName></dnsName>\
             <instanceType>{itype}</instanceType>\
             <placement><availabilityZone>{az}</availabilityZone><tenancy>default</tenancy></placement>",
            id = escape(&i.id),
            ami = crate::moto::AMI,
            code = state_code(&i.state),
            state = escape(&i.state),
            dns = escape(&i.private_dns_name),
            itype = escape(&i.instance_type),
            az = escape(&i.availability_zone),
        );
        // A terminated instance has no network any more.
        if alive {
            let _ = write!(
                xml,
                "<subnetId>{subnet}</subnetId><vpcId>{vpc}</vpcId>\
                 <privateIpAddress>{ip}</privateIpAddress><sourceDestCheck>true</sourceDestCheck>\
                 <groupSet>",
                subnet = escape(&i.subnet_id),
                vpc = escape(&i.vpc_id),
                ip = i.private_ip,
            );
            for (id, name) in &i.security_groups {
                let _ = write!(
                    xml,
                    "<item><groupId>{}</groupId><groupName>{}</groupName></item>",
                    escape(id),
                    escape(name)
                );
            }
            let _ = write!(
                xml,
                "</groupSet><networkInterfaceSet><item>\
                 <networkInterfaceId>eni-{eni}</networkInterfaceId><status>in-use</status>\
                 <subnetId>{subnet}</subnetId><vpcId>{vpc}</vpcId>\
                 <privateIpAddress>{ip}</privateIpAddress>\
                 <attachment><deviceIndex>0</deviceIndex><status>attached</status></attachment>\
                 <privateIpAddressesSet><item><privateIpAddress>{ip}</privateIpAddress><primary>true</primary></item></privateIpAddressesSet>\
                 </item></networkInterfaceSet>",
                eni = escape(i.id.trim_start_matches("i-")),
                subnet = escape(&i.subnet_id),
                vpc = escape(&i.vpc_id),
                ip = i.private_ip,
            );
        }
        xml.push_str("<tagSet>");
        for (key, value) in &i.tags {
            let _ = write!(
                xml,
                "<item><key>{}</key><value>{}</value></item>",
                escape(key),
                escape(value)
            );
        }
        xml.push_str("</tagSet></item></instancesSet></item>");
    }
    xml.push_str("</reservationSet>");
    if let Some(token) = next_token {
        let _ = write!(xml, "<nextToken>{}</nextToken>", escape(token));
    }
    xml.push_str("</DescribeInstancesResponse>");
    xml
}
