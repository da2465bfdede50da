//! EC2 instances as the rest of the project sees them.
//!
//! [`Ec2Instance`] is converted from the SDK's `Instance` once, at the door,
//! so controllers never handle SDK types and every field they read is already
//! parsed (IP addresses are `IpAddr`s, the state is an enum).
//!
//! Here: the instance model and the one conversion both readers share
//! ([`RawInstance::convert`]). `plan.rs` says what the lookups ask (their
//! filters) and shares repeated strings; `io.rs` sends `DescribeInstances`
//! and the tag writes through the one door; `describe_xml.rs` is the slim
//! page decoder.

use std::borrow::Cow;
use std::net::Ipv4Addr;

use aws_sdk_ec2::types::Filter;

use super::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG, cluster_tag_key};
/// The instance model is the provider's (cloud-neutral); parsing it off
/// EC2's answers is here.
pub use crate::provider::instances::{
    Instance as Ec2Instance, InstanceState, InstanceTags, NetworkInterface, SecurityGroupRef,
    Shared,
};
use plan::Interner;

pub(crate) mod cache;
pub mod describe_xml;
pub(crate) mod io;
pub mod plan;
mod topology;

/// An EC2 filter.
pub fn filter(name: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Filter {
    Filter::builder()
        .name(name)
        .set_values(Some(values.into_iter().map(Into::into).collect()))
        .build()
}

/// The instance tags the CCM reads: cluster membership
/// (`kubernetes.io/cluster/*`, `KubernetesCluster`). Every instance of the
/// cluster is cached in the sweep, and instances launched by kOps, Karpenter
/// or an autoscaling group carry ten or more tags the CCM never looks at
/// (`Name`, launch template, autoscaling group, CloudFormation, cost
/// allocation): they are dropped as the instance is parsed.
fn kept_tags(tags: &[TextPair<'_>], strings: &mut Interner) -> InstanceTags {
    let mut kept = InstanceTags::default();
    for (key, value) in tags {
        if let Some(key) = key.as_deref()
            && (key.starts_with(CLUSTER_TAG_PREFIX) || key == LEGACY_CLUSTER_TAG)
        {
            kept.insert_shared(
                strings.get(key),
                strings.get(value.as_deref().unwrap_or_default()),
            );
        }
    }
    kept.0.shrink_to_fit();
    kept
}

/// Parses an optional address. EC2 sends empty strings for "none" in some
/// places; an address that does not parse is dropped with a warning rather
/// than failing the whole instance (one odd field must not hide a node).
fn parse_ip<T: std::str::FromStr>(
    instance_id: &str,
    field: &str,
    value: Option<&str>,
) -> Option<T> {
    let value = present(value)?;
    match value.parse() {
        Ok(ip) => Some(ip),
        Err(_) => {
            tracing::warn!(
                instance_id,
                field,
                value,
                "EC2 returned an unparseable IP address; ignoring it"
            );
            None
        }
    }
}

/// `value` trimmed; `None` when absent or empty.
fn present(value: Option<&str>) -> Option<&str> {
    value.map(str::trim).filter(|v| !v.is_empty())
}

fn non_empty(value: Option<&str>) -> Option<String> {
    present(value).map(str::to_string)
}

/// A field as read off the wire: text, when present.
type Text<'a> = Option<Cow<'a, str>>;
/// Two fields of one list entry (a tag's key and value, a group's ID and
/// name).
type TextPair<'a> = (Text<'a>, Text<'a>);

/// An instance as read off the wire, before it is parsed: what the CCM
/// keeps, as text. Both readers (the SDK's model, and the slim XML decoder
/// in [`describe_xml`]) fill one of these, so every rule of
/// [`RawInstance::convert`] holds for both.
#[derive(Debug, Default)]
struct RawInstance<'a> {
    id: Text<'a>,
    availability_zone: Text<'a>,
    instance_type: Text<'a>,
    state: Text<'a>,
    private_dns_name: Text<'a>,
    public_dns_name: Text<'a>,
    private_ip: Text<'a>,
    public_ip: Text<'a>,
    subnet_id: Text<'a>,
    vpc_id: Text<'a>,
    source_dest_check: Option<bool>,
    /// `(group ID, group name)`.
    security_groups: Vec<TextPair<'a>>,
    /// `(key, value)`, every tag.
    tags: Vec<TextPair<'a>>,
    network_interfaces: Vec<RawInterface<'a>>,
}

/// A network interface as read off the wire.
#[derive(Debug, Default)]
struct RawInterface<'a> {
    id: Text<'a>,
    /// `in-use`, `available`, `attaching`, `detaching`, ...
    status: Text<'a>,
    device_index: Option<i32>,
    /// The interface's primary private address.
    private_ip: Text<'a>,
    /// Every private address, with whether it is the primary one.
    private_ips: Vec<(Text<'a>, bool)>,
    ipv6_addresses: Vec<Text<'a>>,
    public_ip: Text<'a>,
}

impl RawInstance<'_> {
    /// Parses the instance, sharing repeated strings through `strings`.
    /// `None` when it has no instance ID (which EC2 never sends; such an
    /// entry cannot be matched to anything).
    fn convert(self, strings: &mut Interner) -> Option<Ec2Instance> {
        let id = non_empty(self.id.as_deref())?;
        let mut network_interfaces: Vec<NetworkInterface> = self
            .network_interfaces
            .into_iter()
            // An entry without an ID is not an attached interface; one not
            // `in-use` (attaching, detaching) gives the node no address, as
            // upstream's node addresses skip it (nothing else reads them).
            .filter(|eni| non_empty(eni.id.as_deref()).is_some())
            .filter(|eni| eni.status.as_deref() == Some("in-use"))
            .map(|mut eni| {
                // Primary address first, as the Go CCM orders node addresses.
                eni.private_ips.sort_by_key(|(_, primary)| !primary);
                let mut private_ips: Vec<Ipv4Addr> = (eni.private_ips.iter())
                    .filter_map(|(a, _)| parse_ip(&id, "private_ip_addresses", a.as_deref()))
                    .collect();
                if private_ips.is_empty() {
                    private_ips.extend(parse_ip::<Ipv4Addr>(
                        &id,
                        "private_ip_address",
                        eni.private_ip.as_deref(),
                    ));
                }
                NetworkInterface {
                    device_index: eni.device_index,
                    ipv6_addresses: (eni.ipv6_addresses.iter())
                        .filter_map(|a| parse_ip(&id, "ipv6_addresses", a.as_deref()))
                        .collect(),
                    public_ip: parse_ip(&id, "association.public_ip", eni.public_ip.as_deref()),
                    private_ips,
                }
            })
            .collect();
        network_interfaces.sort_by_key(|eni| eni.device_index.unwrap_or(i32::MAX));
        // The collect reuses the raw list's buffer (raw entries are twice
        // the size, and four were reserved on the first push): about 500
        // bytes an instance, 2.5 MB of a 5,000-instance sweep, for one
        // 64-byte entry. Measured with heaptrack in the scale bench.
        network_interfaces.shrink_to_fit();
        let mut security_groups: Vec<SecurityGroupRef> = (self.security_groups.iter())
            .filter_map(|(id, name)| {
                Some(SecurityGroupRef {
                    id: strings.non_empty(id.as_deref())?,
                    name: strings.non_empty(name.as_deref()),
                })
            })
            .collect();
        security_groups.shrink_to_fit();
        Some(Ec2Instance {
            availability_zone: strings.non_empty(self.availability_zone.as_deref()),
            instance_type: strings.non_empty(self.instance_type.as_deref()),
            state: self
                .state
                .map(|n| InstanceState::parse(&n))
                .unwrap_or_else(|| InstanceState::Other("unknown".to_string())),
            private_dns_name: non_empty(self.private_dns_name.as_deref()),
            public_dns_name: non_empty(self.public_dns_name.as_deref()),
            private_ip: parse_ip(&id, "private_ip_address", self.private_ip.as_deref()),
            public_ip: parse_ip(&id, "public_ip_address", self.public_ip.as_deref()),
            network_interfaces,
            tags: kept_tags(&self.tags, strings),
            source_dest_check: self.source_dest_check,
            subnet_id: strings.non_empty(self.subnet_id.as_deref()),
            vpc_id: strings.non_empty(self.vpc_id.as_deref()),
            security_groups,
            id,
        })
    }
}

impl Ec2Instance {
    /// The Kubernetes provider ID (see [`crate::ids::format_provider_id`]).
    pub fn provider_id(&self) -> String {
        crate::ids::format_provider_id(self.availability_zone.as_deref(), &self.id)
    }

    /// Whether the instance belongs to `cluster_id`, by the same rule as the
    /// Go CCM: the `kubernetes.io/cluster/<id>` tag key is present (any
    /// value), or the legacy `KubernetesCluster` tag equals the ID.
    pub fn is_in_cluster(&self, cluster_id: &str) -> bool {
        self.tags.contains_key(&cluster_tag_key(cluster_id))
            || self
                .tags
                .get(LEGACY_CLUSTER_TAG)
                .is_some_and(|v| v == cluster_id)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::Ipv6Addr;
    use std::sync::Arc;

    use super::*;
    use aws_sdk_ec2::types::{
        GroupIdentifier, Instance, InstanceIpv6Address, InstanceNetworkInterface,
        InstanceNetworkInterfaceAttachment, InstancePrivateIpAddress, InstanceStateName,
        InstanceType, NetworkInterfaceStatus, Placement, Tag,
    };

    fn sample() -> Instance {
        Instance::builder()
            .instance_id("i-0123456789abcdef0")
            .placement(Placement::builder().availability_zone("us-east-1a").build())
            .instance_type(InstanceType::M5Large)
            .state(
                aws_sdk_ec2::types::InstanceState::builder()
                    .name(InstanceStateName::Running)
                    .build(),
            )
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .public_dns_name("")
            .private_ip_address("10.0.0.5")
            .public_ip_address("not-an-ip")
            .network_interfaces(
                InstanceNetworkInterface::builder()
                    .network_interface_id("eni-2")
                    .status(NetworkInterfaceStatus::InUse)
                    .attachment(
                        InstanceNetworkInterfaceAttachment::builder()
                            .device_index(1)
                            .build(),
                    )
                    .private_ip_addresses(
                        InstancePrivateIpAddress::builder()
                            .private_ip_address("10.0.1.9")
                            .build(),
                    )
                    .build(),
            )
            .network_interfaces(
                InstanceNetworkInterface::builder()
                    .network_interface_id("eni-3")
                    .status(NetworkInterfaceStatus::Detaching)
                    .attachment(
                        InstanceNetworkInterfaceAttachment::builder()
                            .device_index(2)
                            .build(),
                    )
                    .private_ip_addresses(
                        InstancePrivateIpAddress::builder()
                            .private_ip_address("10.0.2.7")
                            .build(),
                    )
                    .build(),
            )
            .network_interfaces(
                InstanceNetworkInterface::builder()
                    .network_interface_id("eni-1")
                    .status(NetworkInterfaceStatus::InUse)
                    .attachment(
                        InstanceNetworkInterfaceAttachment::builder()
                            .device_index(0)
                            .build(),
                    )
                    .private_ip_addresses(
                        InstancePrivateIpAddress::builder()
                            .private_ip_address("10.0.0.6")
                            .primary(false)
                            .build(),
                    )
                    .private_ip_addresses(
                        InstancePrivateIpAddress::builder()
                            .private_ip_address("10.0.0.5")
                            .primary(true)
                            .build(),
                    )
                    .ipv6_addresses(
                        InstanceIpv6Address::builder()
                            .ipv6_address("2600:1f18::5")
                            .build(),
                    )
                    .subnet_id("subnet-1")
                    .vpc_id("vpc-1")
                    .build(),
            )
            .tags(
                Tag::builder()
                    .key("kubernetes.io/cluster/demo")
                    .value("owned")
                    .build(),
            )
            .tags(Tag::builder().key("Name").value("node-a").build())
            .tags(
                Tag::builder()
                    .key("aws:autoscaling:groupName")
                    .value("nodes-us-east-1a")
                    .build(),
            )
            .source_dest_check(true)
            .subnet_id("subnet-1")
            .vpc_id("vpc-1")
            .security_groups(
                GroupIdentifier::builder()
                    .group_id("sg-1")
                    .group_name("nodes")
                    .build(),
            )
            .build()
    }

    #[test]
    fn converts_every_field_once() {
        let instance =
            Ec2Instance::from_sdk(&sample(), &mut Interner::default()).expect("has an id");
        assert_eq!(instance.id, "i-0123456789abcdef0");
        assert_eq!(instance.availability_zone.as_deref(), Some("us-east-1a"));
        assert_eq!(instance.instance_type.as_deref(), Some("m5.large"));
        assert_eq!(instance.state, InstanceState::Running);
        assert_eq!(
            instance.private_dns_name.as_deref(),
            Some("ip-10-0-0-5.ec2.internal")
        );
        assert_eq!(instance.public_dns_name, None, "empty string means none");
        assert_eq!(instance.private_ip, Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(instance.public_ip, None, "unparseable address dropped");
        assert_eq!(
            instance.network_interfaces.len(),
            2,
            "an interface not in-use (detaching) gives no address, as upstream"
        );
        let primary = &instance.network_interfaces[0];
        assert_eq!(primary.device_index, Some(0), "sorted by device index");
        assert_eq!(
            primary.private_ips,
            vec![Ipv4Addr::new(10, 0, 0, 5), Ipv4Addr::new(10, 0, 0, 6)],
            "primary address first"
        );
        assert_eq!(
            primary.ipv6_addresses,
            vec!["2600:1f18::5".parse::<Ipv6Addr>().expect("literal")]
        );
        assert_eq!(instance.network_interfaces[1].device_index, Some(1));
        assert_eq!(
            instance.network_interfaces[1].private_ips,
            vec![Ipv4Addr::new(10, 0, 1, 9)]
        );
        // Only the tags the CCM reads are kept.
        assert_eq!(
            instance.tags,
            InstanceTags::from(BTreeMap::from([(
                "kubernetes.io/cluster/demo".to_string(),
                "owned".to_string()
            )]))
        );
        assert_eq!(instance.source_dest_check, Some(true));
        assert_eq!(instance.subnet_id.as_deref(), Some("subnet-1"));
        assert_eq!(instance.vpc_id.as_deref(), Some("vpc-1"));
        assert_eq!(
            instance.security_groups,
            vec![SecurityGroupRef {
                id: "sg-1".into(),
                name: Some("nodes".into())
            }]
        );
        assert_eq!(
            instance.provider_id(),
            "aws:///us-east-1a/i-0123456789abcdef0"
        );
    }

    /// `sample()` as EC2 writes it, with elements the CCM does not read
    /// (nested ones reusing names it does read) and a second reservation.
    const SAMPLE_XML: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">
  <requestId>8f7724cf-496f-496e-8fe3-example</requestId>
  <reservationSet>
    <item>
      <reservationId>r-1</reservationId>
      <ownerId>123456789012</ownerId>
      <groupSet/>
      <instancesSet>
        <item>
          <instanceId>i-0123456789abcdef0</instanceId>
          <imageId>ami-1</imageId>
          <instanceState><code>16</code><name>running</name></instanceState>
          <privateDnsName>ip-10-0-0-5.ec2.internal</privateDnsName>
          <dnsName/>
          <instanceType>m5.large</instanceType>
          <placement><availabilityZone>us-east-1a</availabilityZone><groupName/><tenancy>default</tenancy></placement>
          <subnetId>subnet-1</subnetId>
          <vpcId>vpc-1</vpcId>
          <privateIpAddress>10.0.0.5</privateIpAddress>
          <ipAddress>not-an-ip</ipAddress>
          <sourceDestCheck>true</sourceDestCheck>
          <groupSet><item><groupId>sg-1</groupId><groupName>nodes</groupName></item></groupSet>
          <blockDeviceMapping><item><deviceName>/dev/xvda</deviceName><ebs><volumeId>vol-1</volumeId><status>attached</status></ebs></item></blockDeviceMapping>
          <networkInterfaceSet>
            <item>
              <networkInterfaceId>eni-2</networkInterfaceId>
              <status>in-use</status>
              <attachment><attachmentId>eni-attach-2</attachmentId><deviceIndex>1</deviceIndex></attachment>
              <privateIpAddressesSet><item><privateIpAddress>10.0.1.9</privateIpAddress></item></privateIpAddressesSet>
              <groupSet><item><groupId>sg-9</groupId><groupName>other</groupName></item></groupSet>
            </item>
            <item>
              <networkInterfaceId>eni-3</networkInterfaceId>
              <status>detaching</status>
              <attachment><deviceIndex>2</deviceIndex><status>detaching</status></attachment>
              <privateIpAddressesSet><item><privateIpAddress>10.0.2.7</privateIpAddress></item></privateIpAddressesSet>
            </item>
            <item>
              <networkInterfaceId>eni-1</networkInterfaceId>
              <status>in-use</status>
              <subnetId>subnet-1</subnetId>
              <vpcId>vpc-1</vpcId>
              <attachment><deviceIndex>0</deviceIndex><status>attached</status></attachment>
              <privateIpAddressesSet>
                <item><privateIpAddress>10.0.0.6</privateIpAddress><primary>false</primary></item>
                <item><privateIpAddress>10.0.0.5</privateIpAddress><primary>true</primary></item>
              </privateIpAddressesSet>
              <ipv6AddressesSet><item><ipv6Address>2600:1f18::5</ipv6Address></item></ipv6AddressesSet>
            </item>
          </networkInterfaceSet>
          <tagSet>
            <item><key>kubernetes.io/cluster/demo</key><value>owned</value></item>
            <item><key>Name</key><value>node-a</value></item>
            <item><key>aws:autoscaling:groupName</key><value>nodes-us-east-1a</value></item>
          </tagSet>
        </item>
      </instancesSet>
    </item>
    <item>
      <reservationId>r-2</reservationId>
      <instancesSet>
        <item>
          <instanceId>i-2</instanceId>
          <instanceState><name>stopped</name></instanceState>
          <tagSet><item><key>KubernetesCluster</key><value>a &amp; &lt;b&gt;</value></item></tagSet>
        </item>
        <item><imageId>ami-without-an-instance-id</imageId></item>
      </instancesSet>
    </item>
  </reservationSet>
  <nextToken>tok+/=</nextToken>
</DescribeInstancesResponse>"#;

    /// The slim decoder and the SDK's model give the same instance.
    #[test]
    fn the_slim_decoder_reads_what_the_sdk_model_converts_to() {
        let page = super::describe_xml::decode_page(SAMPLE_XML).expect("decodes");
        let want = Ec2Instance::from_sdk(&sample(), &mut Interner::default()).expect("has an id");
        assert_eq!(page.instances.len(), 2, "an entry without an ID is skipped");
        assert_eq!(page.instances[0], want);
        assert_eq!(page.instances[1].id, "i-2");
        assert_eq!(page.instances[1].state, InstanceState::Stopped);
        assert_eq!(
            page.instances[1].tags.get(LEGACY_CLUSTER_TAG),
            Some("a & <b>")
        );
        assert_eq!(page.next_token.as_deref(), Some("tok+/="));
        let last = super::describe_xml::decode_page(
            "<DescribeInstancesResponse><reservationSet/><nextToken/></DescribeInstancesResponse>",
        )
        .expect("decodes");
        assert!(last.instances.is_empty());
        assert_eq!(last.next_token, None, "an empty token ends the read");
        assert!(super::describe_xml::decode_page("<Response><Errors/></Response>").is_err());
        let cut = &SAMPLE_XML[..SAMPLE_XML.find("<nextToken>").expect("has a token")];
        assert!(
            super::describe_xml::decode_page(cut).is_err(),
            "a page cut short"
        );
    }

    /// Instances converted with one interner share each repeated string;
    /// their own (ID, DNS name) stay their own.
    #[test]
    fn one_read_shares_repeated_strings() {
        let mut strings = Interner::default();
        let a = Ec2Instance::from_sdk(&sample(), &mut strings).expect("has an id");
        let b = Ec2Instance::from_sdk(&sample(), &mut strings).expect("has an id");
        let same = |x: &Option<Shared>, y: &Option<Shared>| {
            Arc::ptr_eq(x.as_ref().expect("set"), y.as_ref().expect("set"))
        };
        assert!(same(&a.availability_zone, &b.availability_zone));
        assert!(same(&a.instance_type, &b.instance_type));
        assert!(same(&a.subnet_id, &b.subnet_id));
        assert!(same(&a.vpc_id, &b.vpc_id));
        assert!(Arc::ptr_eq(
            &a.security_groups[0].id,
            &b.security_groups[0].id
        ));
        assert!(Arc::ptr_eq(&a.tags.0[0].0, &b.tags.0[0].0));
        assert!(Arc::ptr_eq(&a.tags.0[0].1, &b.tags.0[0].1));
        assert_ne!(a.id.as_ptr(), b.id.as_ptr());
        // A fresh interner (the next read) shares nothing with the last.
        let c = Ec2Instance::from_sdk(&sample(), &mut Interner::default()).expect("has an id");
        assert!(!same(&a.vpc_id, &c.vpc_id));
        assert_eq!(a, c);
    }

    #[test]
    fn cluster_membership_follows_the_go_ccm_rule() {
        let mut instance =
            Ec2Instance::from_sdk(&sample(), &mut Interner::default()).expect("has an id");
        assert!(instance.is_in_cluster("demo"));
        assert!(!instance.is_in_cluster("other"));
        instance.tags.clear();
        instance.tags.insert(LEGACY_CLUSTER_TAG, "legacy");
        assert!(instance.is_in_cluster("legacy"));
        assert!(!instance.is_in_cluster("demo"));
    }

    #[test]
    fn an_instance_without_id_is_skipped() {
        assert!(
            Ec2Instance::from_sdk(&Instance::builder().build(), &mut Interner::default()).is_none()
        );
    }
}
