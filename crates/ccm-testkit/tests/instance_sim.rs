//! The EC2 instance simulator served through the fault proxy, read by the
//! AWS SDK and by the CCM's own DescribeInstances decoders: it must answer
//! as EC2 does. These start the fault proxy, so they live here and not in
//! the library's unit tests (`make unit` starts no server).

use std::sync::Arc;

use aws_ccm::aws::instances::{Ec2Instance, InstanceState, filter};
use ccm_testkit::aws_proxy::{FaultProxy, ProxyConfig};
use ccm_testkit::instance_sim::{InstanceSim, LaunchTemplate};
use ccm_testkit::moto::test_sdk_config;

const TAG: &str = "kubernetes.io/cluster/sim";

fn template(tags: &[(&str, &str)]) -> LaunchTemplate {
    LaunchTemplate {
        instance_type: "m5.large".into(),
        availability_zone: "us-east-1a".into(),
        subnet_id: "subnet-1".into(),
        vpc_id: "vpc-1".into(),
        security_groups: vec![("sg-nodes".into(), "nodes".into())],
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// An EC2 client whose every answer comes from `sim` (nothing listens
/// upstream of the proxy).
async fn served(sim: &Arc<InstanceSim>) -> (FaultProxy, aws_sdk_ec2::Client) {
    let proxy = FaultProxy::start("http://127.0.0.1:9", ProxyConfig::default())
        .await
        .unwrap();
    proxy.serve_locally(Some(sim.clone()));
    let ec2 = aws_sdk_ec2::Client::new(&test_sdk_config(&proxy.endpoint()).await);
    (proxy, ec2)
}

/// The SDK, through the proxy, sees the simulator as EC2: pages, filters,
/// errors, and instances the CCM's own conversion reads fully.
#[tokio::test]
async fn answers_describe_instances_on_the_wire_as_ec2_does() {
    let sim = InstanceSim::new();
    let tagged = sim.launch(&template(&[(TAG, "owned")]), 2500);
    let untagged = sim.launch(&template(&[]), 3);
    let (proxy, ec2) = served(&sim).await;

    // A filtered sweep comes in pages of 1,000 with a token.
    let mut seen = Vec::new();
    let mut token = None;
    let mut pages = 0;
    loop {
        let page = ec2
            .describe_instances()
            .filters(filter("tag-key", [TAG]))
            .max_results(1000)
            .set_next_token(token)
            .send()
            .await
            .unwrap();
        pages += 1;
        seen.extend(
            page.reservations()
                .iter()
                .flat_map(|r| r.instances())
                .map(|i| Ec2Instance::from_sdk(i, &mut Default::default()).unwrap()),
        );
        token = page.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 3);
    let ids: Vec<&str> = seen.iter().map(|i| i.id.as_str()).collect();
    let want: Vec<&str> = tagged.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, want);
    assert_eq!(proxy.calls().get("ec2", "DescribeInstances").forwarded, 3);

    // Every field the CCM reads survives the wire.
    let first = &seen[0];
    assert_eq!(first.private_ip, Some(tagged[0].private_ip));
    assert_eq!(
        first.private_dns_name.as_deref(),
        Some(tagged[0].private_dns_name.as_str())
    );
    assert_eq!(first.availability_zone.as_deref(), Some("us-east-1a"));
    assert_eq!(first.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(first.state, InstanceState::Running);
    assert_eq!(&*first.security_groups[0].id, "sg-nodes");
    assert_eq!(first.security_groups[0].name.as_deref(), Some("nodes"));
    assert_eq!(
        first.network_interfaces[0].private_ips,
        vec![tagged[0].private_ip]
    );
    assert!(first.is_in_cluster("sim"));
    assert_eq!(
        first.provider_id(),
        format!("aws:///us-east-1a/{}", tagged[0].id)
    );

    // Lookup by name among live states; a stopped one drops out.
    assert!(sim.set_state(&tagged[1].id, "stopped"));
    let by_name = ec2
        .describe_instances()
        .filters(filter(
            "private-dns-name",
            [
                &tagged[0].private_dns_name,
                &tagged[1].private_dns_name,
                &untagged[0].private_dns_name,
            ],
        ))
        .filters(filter("instance-state-name", ["running", "pending"]))
        .send()
        .await
        .unwrap();
    let mut names: Vec<String> = by_name
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.private_dns_name().map(str::to_string))
        .collect();
    names.sort();
    let mut want = vec![
        tagged[0].private_dns_name.clone(),
        untagged[0].private_dns_name.clone(),
    ];
    want.sort();
    assert_eq!(names, want);

    // EC2's errors, in EC2's encoding.
    let err = ec2
        .describe_instances()
        .instance_ids("i-doesnotexist")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&err),
        Some("InvalidInstanceID.NotFound")
    );
    let err = ec2
        .describe_instances()
        .filters(filter("ip-address", ["10.0.0.1"]))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&err),
        Some("InvalidParameterValue")
    );

    // Removal is seen at once.
    assert!(sim.remove(&tagged[0].id));
    assert_eq!(sim.len(), 2502);
    let out = ec2
        .describe_instances()
        .filters(filter("instance-id", [&tagged[0].id]))
        .send()
        .await
        .unwrap();
    assert!(out.reservations().is_empty());
}

/// The slim decoder reads every page as the SDK's model converts it,
/// hands the SDK the same next-page token, and leaves errors to the
/// SDK.
#[tokio::test]
async fn the_slim_decoder_reads_pages_as_the_sdk_does() {
    use aws_ccm::aws::instances::describe_xml::{SlimDecoder, Slot};
    use aws_ccm::aws::instances::plan::Interner;
    let sim = InstanceSim::new();
    // An escaped value the CCM keeps: the reader unescapes it as the SDK does.
    let tagged = sim.launch(
        &template(&[(TAG, "owned"), ("KubernetesCluster", "sim & <co>")]),
        1500,
    );
    sim.launch(&template(&[]), 3);
    assert!(sim.set_state(&tagged[7].id, "stopped"));
    let (_proxy, ec2) = served(&sim).await;

    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut seen = 0;
    loop {
        let request = || {
            ec2.describe_instances()
                .filters(filter("tag-key", [TAG]))
                .max_results(1000)
                .set_next_token(token.clone())
        };
        let plain = request().send().await.unwrap();
        let slot = Slot::default();
        let slim = request()
            .customize()
            .interceptor(SlimDecoder::new(slot.clone()))
            .send()
            .await
            .unwrap();
        let decoded = slot.take().expect("the slim decoder read the page");
        let want: Vec<Ec2Instance> = (plain.reservations().iter())
            .flat_map(|r| r.instances())
            .filter_map(|i| Ec2Instance::from_sdk(i, &mut Interner::default()))
            .collect();
        assert!(!want.is_empty());
        assert_eq!(decoded.instances, want);
        assert!(
            slim.reservations().is_empty(),
            "the SDK got no instances to model"
        );
        assert_eq!(slim.next_token(), plain.next_token());
        assert_eq!(decoded.next_token.as_deref(), plain.next_token());
        pages += 1;
        seen += want.len();
        token = plain.next_token().map(str::to_string);
        if token.is_none() {
            break;
        }
    }
    assert_eq!((pages, seen), (2, 1500));

    // An error is the SDK's, code and all, and leaves nothing behind.
    let slot = Slot::default();
    let err = ec2
        .describe_instances()
        .instance_ids("i-doesnotexist")
        .customize()
        .interceptor(SlimDecoder::new(slot.clone()))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        aws_sdk_ec2::error::ProvideErrorMetadata::code(&err),
        Some("InvalidInstanceID.NotFound")
    );
    assert!(slot.take().is_none());
}
