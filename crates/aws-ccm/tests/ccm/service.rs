//! Service controller and Classic ELB end to end: the real binary against the
//! API test server and moto.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use k8s_openapi::api::core::v1::{Event, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

struct Cloud {
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    node_group: String,
    instance: String,
}

/// A VPC with one public subnet, a cluster-tagged node group and one node instance.
async fn seed(env: &Env) -> anyhow::Result<Cloud> {
    let seeded = seed_cluster(env, 1).await?;
    Ok(Cloud {
        elb: aws_sdk_elasticloadbalancing::Client::new(&seeded.conf),
        ec2: seeded.ec2,
        node_group: seeded.node_group,
        instance: seeded.instances[0].clone(),
    })
}

pub fn node(name: &str, instance: &str) -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"providerID": format!("aws:///us-east-1a/{instance}")}
    }))
    .unwrap()
}

pub fn lb_service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

/// The Service's `LoadBalancerSynced` condition, if it carries one.
pub(crate) fn sync_condition(svc: Service) -> Option<Condition> {
    (svc.status?.conditions?)
        .into_iter()
        .find(|c| c.type_ == "LoadBalancerSynced")
}

pub fn hostname(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

pub async fn group_by_name(
    ec2: &aws_sdk_ec2::Client,
    name: &str,
) -> Option<aws_sdk_ec2::types::SecurityGroup> {
    let out = ec2
        .describe_security_groups()
        .filters(Filter::builder().name("group-name").values(name).build())
        .send()
        .await
        .ok()?;
    out.security_groups().first().cloned()
}

#[tokio::test]
async fn service_lifecycle_creates_wires_and_deletes_a_classic_elb() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &cloud.instance))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(&PostParams::default(), &lb_service("web", serde_json::json!({
            "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
            "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8"
        })))
        .await?;
    let bad = services
        .create(
            &PostParams::default(),
            &lb_service(
                "bad",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "often"
                }),
            ),
        )
        .await?;
    let uid = svc.metadata.uid.clone().unwrap();
    let lb_name = format!("a{}", uid.replace('-', ""))[..32].to_string();
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
        .node_port
        .unwrap();

    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let host = eventually(
        "the load balancer hostname in the Service status",
        WAIT,
        || async { services.get("web").await.ok().as_ref().and_then(hostname) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    let lb = cloud
        .elb
        .describe_load_balancers()
        .load_balancer_names(&lb_name)
        .send()
        .await?;
    let lb = &lb.load_balancer_descriptions()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    let l = lb.listener_descriptions()[0].listener().unwrap();
    assert_eq!(
        (l.load_balancer_port(), l.instance_port(), l.protocol()),
        (80, node_port, "TCP")
    );
    let registered: Vec<_> = lb
        .instances()
        .iter()
        .filter_map(|i| i.instance_id())
        .collect();
    assert_eq!(registered, vec![cloud.instance.as_str()]);
    let hc = lb.health_check().unwrap();
    assert_eq!(
        (
            hc.target(),
            hc.healthy_threshold(),
            hc.unhealthy_threshold(),
            hc.interval(),
            hc.timeout()
        ),
        (format!("TCP:{node_port}").as_str(), 2, 6, 10, 5)
    );
    let attrs = cloud
        .elb
        .describe_load_balancer_attributes()
        .load_balancer_name(&lb_name)
        .send()
        .await?;
    assert!(
        attrs
            .load_balancer_attributes()
            .unwrap()
            .cross_zone_load_balancing()
            .unwrap()
            .enabled()
    );
    let tags = cloud
        .elb
        .describe_tags()
        .load_balancer_names(&lb_name)
        .send()
        .await?;
    let tags: Vec<(String, String)> = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .map(|t| {
            (
                t.key().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        tags.contains(&(
            format!("kubernetes.io/cluster/{CLUSTER_ID}"),
            "owned".into()
        )),
        "{tags:?}"
    );
    assert!(
        tags.contains(&("kubernetes.io/service-name".into(), "default/web".into())),
        "{tags:?}"
    );

    let owned = group_by_name(&cloud.ec2, &format!("k8s-elb-{lb_name}"))
        .await
        .expect("owned group");
    let owned_id = owned.group_id().unwrap().to_string();
    assert_eq!(lb.security_groups(), std::slice::from_ref(&owned_id));
    let ranges: Vec<_> = owned
        .ip_permissions()
        .iter()
        .flat_map(|p| p.ip_ranges().iter().filter_map(|r| r.cidr_ip()))
        .collect();
    assert!(
        !ranges.is_empty() && ranges.iter().all(|r| *r == "10.0.0.0/8"),
        "{ranges:?}"
    );
    let node_group = group_by_name(&cloud.ec2, "nodes").await.unwrap();
    assert!(node_group.ip_permissions().iter().any(|p| {
        p.user_id_group_pairs()
            .iter()
            .any(|g| g.group_id() == Some(owned_id.as_str()))
    }));
    let svc = services.get("web").await?;
    assert!(
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"service.kubernetes.io/load-balancer-cleanup".to_string())
    );
    assert_eq!(cloud.node_group, node_group.group_id().unwrap());

    // A fresh process adopts what exists: no create, no mutation at all.
    drop(ccm);
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    ccm.wait_synced(1, WAIT).await?;
    assert!(
        proxy
            .calls()
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .forwarded
            > 0
    );
    assert_eq!(
        mutations(&proxy),
        BTreeMap::new(),
        "an unchanged Service caused mutations\nlogs:\n{}",
        ccm.logs()
    );

    // The malformed Service: a Warning naming the annotation, and no load balancer.
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warning = eventually(
        "a SyncLoadBalancerFailed event for the malformed Service",
        WAIT,
        || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("SyncLoadBalancerFailed")
                        && e.involved_object.name.as_deref() == Some("bad")
                })
        },
    )
    .await?;
    let note = warning.message.unwrap_or_default();
    assert!(
        note.contains("healthcheck-interval") && note.contains("often"),
        "{note}"
    );
    let bad_name = format!("a{}", bad.metadata.uid.unwrap().replace('-', ""))[..32].to_string();
    assert!(
        cloud
            .elb
            .describe_load_balancers()
            .load_balancer_names(&bad_name)
            .send()
            .await
            .is_err()
    );
    assert!(hostname(&services.get("bad").await?).is_none());
    // What stopped it stays on the Service and in /metrics; the Service
    // whose sync finished carries no condition.
    let condition = eventually("the malformed Service's condition", WAIT, || async {
        sync_condition(services.get("bad").await.ok()?)
    })
    .await?;
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "RefusedValue")
    );
    assert_eq!(condition.message, note);
    assert!(sync_condition(services.get("web").await?).is_none());
    let needles = [
        "aws_ccm_service_sync_state{state=\"waiting_for_fix\",error_class=\"refused_value\"} 1",
        "aws_ccm_service_sync_state{state=\"synced\",error_class=\"none\"} 1",
    ];
    metrics_with(&ccm.https_addr().await?, &needles, WAIT).await?;
    // Fixed: the next sync finishes and says so.
    let fix = serde_json::json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "30"
    }}});
    services
        .patch("bad", &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    eventually("the fixed Service's condition True", WAIT, || async {
        sync_condition(services.get("bad").await.ok()?)
            .filter(|c| c.status == "True" && c.reason == "Synced")
    })
    .await?;
    let needles = [
        "aws_ccm_service_sync_state{state=\"synced\",error_class=\"none\"} 2",
        "aws_ccm_service_sync_state{state=\"waiting_for_fix\",error_class=\"refused_value\"} 0",
    ];
    metrics_with(&ccm.https_addr().await?, &needles, WAIT).await?;
    services.delete("bad", &DeleteParams::default()).await?;
    refused_then_left_type_load_balancer(&services, &ccm).await?;

    // Delete: LB, owned group and node rule go, then the finalizer.
    services.delete("web", &DeleteParams::default()).await?;
    eventually("the Service to be gone", WAIT, || async {
        matches!(services.get_opt("web").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(
        cloud
            .elb
            .describe_load_balancers()
            .load_balancer_names(&lb_name)
            .send()
            .await
            .is_err()
    );
    assert!(
        group_by_name(&cloud.ec2, &format!("k8s-elb-{lb_name}"))
            .await
            .is_none()
    );
    let node_group = group_by_name(&cloud.ec2, "nodes").await.unwrap();
    assert!(!node_group.ip_permissions().iter().any(|p| {
        p.user_id_group_pairs()
            .iter()
            .any(|g| g.group_id() == Some(owned_id.as_str()))
    }));
    env.finish().await
}

/// A Service refused before it had a load balancer (so no finalizer),
/// then turned into a ClusterIP: its condition goes and the gauge forgets
/// it. The controller has nothing else to do for it, and it was still
/// counted as waiting for a fix, its condition still `False`.
async fn refused_then_left_type_load_balancer(
    services: &Api<Service>,
    ccm: &Ccm,
) -> anyhow::Result<()> {
    let svc = lb_service(
        "left",
        serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "often"}),
    );
    services.create(&PostParams::default(), &svc).await?;
    eventually("the refused Service's condition", WAIT, || async {
        sync_condition(services.get("left").await.ok()?).filter(|c| c.reason == "RefusedValue")
    })
    .await?;
    let waiting =
        "aws_ccm_service_sync_state{state=\"waiting_for_fix\",error_class=\"refused_value\"}";
    metrics_with(&ccm.https_addr().await?, &[&format!("{waiting} 1")], WAIT).await?;
    let cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP"}});
    services
        .patch("left", &PatchParams::default(), &Patch::Merge(&cluster_ip))
        .await?;
    eventually(
        "the condition of the Service no longer a load balancer gone",
        WAIT,
        || async {
            let svc = services.get("left").await.ok()?;
            sync_condition(svc).is_none().then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    metrics_with(&ccm.https_addr().await?, &[&format!("{waiting} 0")], WAIT).await?;
    services.delete("left", &DeleteParams::default()).await?;
    Ok(())
}

/// Upstream's `UnAvailableLoadBalancer` Warning when a LoadBalancer Service
/// has no node to send traffic to; the load balancer is still made.
#[tokio::test]
async fn a_load_balancer_without_nodes_gets_upstreams_unavailable_event() -> anyhow::Result<()> {
    let env = Env::start().await?;
    seed_cluster(&env, 1).await?;
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("lonely", serde_json::json!({})),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let event = eventually(
        "UnAvailableLoadBalancer on the Service",
        Duration::from_secs(60),
        || async {
            crate::routes::events_for(&env, "lonely", "UnAvailableLoadBalancer")
                .await
                .pop()
        },
    )
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.note.as_deref(),
        Some("There are no available nodes for LoadBalancer")
    );
    eventually(
        "the hostname is still set",
        Duration::from_secs(60),
        || async {
            services
                .get("lonely")
                .await
                .ok()
                .as_ref()
                .and_then(hostname)
        },
    )
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    env.finish().await
}

/// Whether node group `nodes` has the rule admitting everything from `group`.
async fn admits(ec2: &aws_sdk_ec2::Client, nodes: &str, group: &str) -> bool {
    let Some(g) = group_by_name(ec2, nodes).await else {
        return false;
    };
    g.ip_permissions().iter().any(|p| {
        p.user_id_group_pairs()
            .iter()
            .any(|pair| pair.group_id() == Some(group))
    })
}

/// Issue 43: a live Service switched to `aws-load-balancer-type: external`
/// is handed to another controller, as in the Go CCM (whose
/// `EnsureLoadBalancerDeleted` returns at once for it). Deleting it, or
/// making it a ClusterIP, leaves its classic ELB, the owned group and the
/// node rule admitting that group in AWS; no write reaches AWS from the
/// switch on; the finalizer is released (the status cleared, as upstream's
/// controller does) and a Normal event names the load balancer left.
#[tokio::test]
async fn a_service_handed_to_another_controller_leaves_its_load_balancer_in_aws()
-> anyhow::Result<()> {
    const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
    const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
    let env = Env::start().await?;
    let cloud = seed(&env).await?;
    let client = env.api.client().await?;
    let pp = PostParams::default();
    Api::<Node>::all(client.clone())
        .create(&pp, &node("n1", &cloud.instance))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut names = std::collections::BTreeMap::new();
    for name in ["deleted", "retyped"] {
        let svc = services
            .create(&pp, &lb_service(name, serde_json::json!({})))
            .await?;
        let uid = svc.metadata.uid.unwrap_or_default();
        names.insert(name, format!("a{}", uid.replace('-', ""))[..32].to_string());
    }
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let mut owned = std::collections::BTreeMap::new();
    for (name, lb) in &names {
        eventually(&format!("a hostname for {name}"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
        let group = group_by_name(&cloud.ec2, &format!("k8s-elb-{lb}"))
            .await
            .and_then(|g| g.group_id().map(str::to_string))
            .expect("the owned group");
        assert!(admits(&cloud.ec2, "nodes", &group).await);
        owned.insert(*name, group);
    }
    let before = mutations(&proxy);

    // The hand-off, then the deletion of one and the type change of the other.
    let external = serde_json::json!({"metadata": {"annotations": {TYPE: "external"}}});
    for name in names.keys() {
        services
            .patch(name, &PatchParams::default(), &Patch::Merge(&external))
            .await?;
    }
    services.delete("deleted", &DeleteParams::default()).await?;
    let cluster_ip = serde_json::json!({"spec": {"type": "ClusterIP", "allocateLoadBalancerNodePorts": null,
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
    services
        .patch(
            "retyped",
            &PatchParams::default(),
            &Patch::Merge(&cluster_ip),
        )
        .await?;
    eventually("the deleted Service to be gone", WAIT, || async {
        matches!(services.get_opt("deleted").await, Ok(None)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let retyped = eventually(
        "the retyped Service to lose the finalizer",
        WAIT,
        || async {
            let svc = services.get("retyped").await.ok()?;
            let finalizers = svc.metadata.finalizers.clone().unwrap_or_default();
            (!finalizers.iter().any(|f| f == FINALIZER)).then_some(svc)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(hostname(&retyped).is_none(), "the status is cleared");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    for (name, lb) in &names {
        let event = eventually(&format!("the hand-over event of {name}"), WAIT, || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("LoadBalancerHandedOver")
                        && e.involved_object.name.as_deref() == Some(*name)
                })
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
        assert_eq!(event.type_.as_deref(), Some("Normal"));
        let note = event.message.unwrap_or_default();
        assert!(
            note.contains(lb.as_str()) && note.contains("another controller"),
            "{note}"
        );
        // AWS as it was: the load balancer, its group and the node rule.
        let described = cloud
            .elb
            .describe_load_balancers()
            .load_balancer_names(lb)
            .send()
            .await?;
        assert_eq!(described.load_balancer_descriptions().len(), 1, "{name}");
        assert!(
            group_by_name(&cloud.ec2, &format!("k8s-elb-{lb}"))
                .await
                .is_some()
        );
        assert!(admits(&cloud.ec2, "nodes", &owned[name]).await, "{name}");
    }
    let after = mutations(&proxy);
    assert_eq!(after, before, "a write reached AWS after the hand-off");
    let removals: Vec<&String> = after
        .keys()
        .filter(|k| k.contains(":Delete") || k.contains(":Revoke") || k.contains(":Deregister"))
        .collect();
    assert!(removals.is_empty(), "{removals:?}");
    assert!(
        proxy
            .calls()
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .forwarded
            > 0,
        "the proxy counted the CCM's calls"
    );

    // `aws-ccm orphans` counts the retyped Service's load balancer as alive:
    // the Service handed it over and lives on.
    let orphans = env.orphans().await?;
    assert!(
        !orphans
            .iter()
            .any(|o| o.contains(names["retyped"].as_str())),
        "{orphans:?}"
    );

    // The controller they were handed to removes them; here the test does,
    // so that the orphan audit sees what the CCM itself left.
    drop(ccm);
    for (name, lb) in &names {
        cloud
            .elb
            .delete_load_balancer()
            .load_balancer_name(lb)
            .send()
            .await?;
        let pair = aws_sdk_ec2::types::UserIdGroupPair::builder()
            .group_id(&owned[name])
            .build();
        cloud
            .ec2
            .revoke_security_group_ingress()
            .group_id(&cloud.node_group)
            .ip_permissions(
                aws_sdk_ec2::types::IpPermission::builder()
                    .ip_protocol("-1")
                    .user_id_group_pairs(pair)
                    .build(),
            )
            .send()
            .await?;
        cloud
            .ec2
            .delete_security_group()
            .group_id(&owned[name])
            .send()
            .await?;
    }
    env.finish().await
}
