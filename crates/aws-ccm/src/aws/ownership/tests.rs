//! The proof as a table of (kind, name, tags) -> verdict. The kOps rows are
//! kOps' own: names and tags from its integration test outputs
//! (kubernetes/kops `tests/integration/update_cluster/complex/kubernetes.tf`,
//! and `bastionadditional_user-data/kubernetes.tf` before its bastion and
//! API load balancers moved to NLBs), with the cluster renamed `c1`.

use std::collections::BTreeMap;

use super::*;

const CLUSTER: &str = "c1";
const LB: &str = "a0123456789abcdef0123456789abcde";

fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What kOps' `CloudTags(name, false)` writes on a cluster resource.
fn kops(name_tag: &str) -> BTreeMap<String, String> {
    tags(&[
        ("KubernetesCluster", CLUSTER),
        ("Name", name_tag),
        ("kubernetes.io/cluster/c1", "owned"),
    ])
}

/// What the CCM writes on a load balancer or target group of default/web.
fn ccm() -> BTreeMap<String, String> {
    tags(&[
        ("kubernetes.io/cluster/c1", "owned"),
        ("kubernetes.io/service-name", "default/web"),
    ])
}

fn group() -> BTreeMap<String, String> {
    tags(&[("kubernetes.io/cluster/c1", "owned")])
}

/// (kind, name, tags, verdict).
type Row<'a> = (Made, &'a str, BTreeMap<String, String>, Result<(), NotMade>);

#[test]
fn what_the_ccm_makes_is_proven_and_nothing_else() {
    use Made::*;
    let shared = tags(&[
        ("kubernetes.io/cluster/c1", "shared"),
        ("kubernetes.io/service-name", "default/web"),
    ]);
    let other_cluster = tags(&[
        ("kubernetes.io/cluster/c2", "owned"),
        ("kubernetes.io/service-name", "default/web"),
    ]);
    let lbc = tags(&[
        ("kubernetes.io/cluster/c1", "owned"),
        ("elbv2.k8s.aws/cluster", CLUSTER),
        ("service.k8s.aws/stack", "default/web"),
        ("service.k8s.aws/resource", "default/web:80"),
    ]);
    let legacy_ccm = {
        let mut t = ccm();
        t.insert("KubernetesCluster".into(), CLUSTER.into());
        t
    };
    let lb_group = format!("k8s-elb-{LB}");
    let rows: Vec<Row> = vec![
        // The CCM's own, on a plain and on a kOps (legacy-tagged) cluster.
        (LoadBalancer, LB, ccm(), Ok(())),
        (LoadBalancer, LB, legacy_ccm, Ok(())),
        (TargetGroup, "k8s-default-web-0123abcdef", ccm(), Ok(())),
        (LoadBalancerGroup, &lb_group, group(), Ok(())),
        (NlbGroup, "k8s-default-web-89abcdef01", group(), Ok(())),
        (NlbGroup, &lb_group, group(), Ok(())),
        // kOps' API NLB (and CLB), the bastion's, their target groups and groups.
        (
            LoadBalancer,
            "api-c1-vd3t5n",
            kops("api.c1"),
            Err(NotMade::Name(LoadBalancer)),
        ),
        (
            LoadBalancer,
            "bastion-c1-4grhsv",
            kops("bastion.c1"),
            Err(NotMade::Name(LoadBalancer)),
        ),
        (
            TargetGroup,
            "tcp-c1-vpjolq",
            kops("tcp-c1-vpjolq"),
            Err(NotMade::Name(TargetGroup)),
        ),
        (
            TargetGroup,
            "kops-controller-c1-ab12cd",
            kops("kops-controller-c1-ab12cd"),
            Err(NotMade::Name(TargetGroup)),
        ),
        (
            LoadBalancerGroup,
            "api-elb.c1",
            kops("api-elb.c1"),
            Err(NotMade::Name(LoadBalancerGroup)),
        ),
        (
            LoadBalancerGroup,
            "bastion-elb.c1",
            kops("bastion-elb.c1"),
            Err(NotMade::Name(LoadBalancerGroup)),
        ),
        (
            NlbGroup,
            "nodes.c1",
            kops("nodes.c1"),
            Err(NotMade::Name(NlbGroup)),
        ),
        // Named like the CCM's but without the tag the CCM writes: Terraform
        // or a hand, not the CCM.
        (
            LoadBalancer,
            LB,
            group(),
            Err(NotMade::NoServiceName(LoadBalancer)),
        ),
        (
            LoadBalancer,
            "tf-lb-20261201000000000000000001",
            group(),
            Err(NotMade::Name(LoadBalancer)),
        ),
        // The Load Balancer Controller's target group: the CCM's pattern,
        // its own tags.
        (
            TargetGroup,
            "k8s-default-web-0123abcdef",
            lbc,
            Err(NotMade::NoServiceName(TargetGroup)),
        ),
        // A target group whose name is another Service's.
        (
            TargetGroup,
            "k8s-kubesys-dns-0123abcdef",
            ccm(),
            Err(NotMade::OtherService {
                tagged: "default/web".into(),
                expected: "the Service its name k8s-kubesys-dns-0123abcdef was made for".into(),
            }),
        ),
        // Not this cluster's to delete whatever the name.
        (
            LoadBalancer,
            LB,
            shared,
            Err(NotMade::NotOwned("shared".into())),
        ),
        (LoadBalancer, LB, other_cluster, Err(NotMade::Untagged)),
        // A pattern near miss: uppercase hex, too short, an extra part.
        (
            LoadBalancer,
            "a0123456789ABCDEF0123456789abcde",
            ccm(),
            Err(NotMade::Name(LoadBalancer)),
        ),
        (
            LoadBalancer,
            "a0123456789abcdef",
            ccm(),
            Err(NotMade::Name(LoadBalancer)),
        ),
        (
            TargetGroup,
            "k8s-default-web-x-0123abcdef",
            ccm(),
            Err(NotMade::Name(TargetGroup)),
        ),
    ];
    for (made, name, t, want) in rows {
        assert_eq!(
            prove(made, name, &t, CLUSTER, None),
            want,
            "{made:?} {name} {t:?}"
        );
    }
}

#[test]
fn a_services_deletion_proves_it_is_that_services() {
    assert_eq!(
        prove(Made::LoadBalancer, LB, &ccm(), CLUSTER, Some("default/web")),
        Ok(())
    );
    assert_eq!(
        prove(Made::LoadBalancer, LB, &ccm(), CLUSTER, Some("default/api")),
        Err(NotMade::OtherService {
            tagged: "default/web".into(),
            expected: "default/api".into()
        })
    );
    // Groups carry no service name: the name (from the Service's UID) is the proof.
    let g = format!("k8s-elb-{LB}");
    assert_eq!(
        prove(
            Made::LoadBalancerGroup,
            &g,
            &group(),
            CLUSTER,
            Some("default/api")
        ),
        Ok(())
    );
}

#[test]
fn each_verdict_says_which_part_of_the_proof_failed() {
    let why = |r: Result<(), NotMade>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let kops_api = why(prove(
        Made::LoadBalancer,
        "api-c1-vd3t5n",
        &kops("api.c1"),
        CLUSTER,
        None,
    ));
    assert_eq!(
        kops_api,
        "its name is not \"a\" + a Service UID, the name the CCM gives a load balancer"
    );
    let untagged_service = why(prove(
        Made::TargetGroup,
        "k8s-a-b-0123456789",
        &group(),
        CLUSTER,
        None,
    ));
    assert!(
        untagged_service.contains("kubernetes.io/service-name"),
        "{untagged_service}"
    );
    let shared = why(prove(
        Made::LoadBalancerGroup,
        &format!("k8s-elb-{LB}"),
        &tags(&[("kubernetes.io/cluster/c1", "shared")]),
        CLUSTER,
        None,
    ));
    assert!(shared.contains("\"shared\""), "{shared}");
}

#[test]
fn the_shared_backend_group_is_proven_by_its_name_and_both_tags() {
    let ours = tags(&[
        ("kubernetes.io/cluster/c1", "owned"),
        ("aws-ccm/shared-backend-group", CLUSTER),
    ]);
    let name = "aws-ccm-backend-c1";
    let prove = |name: &str, t: &BTreeMap<String, String>| {
        super::prove(Made::SharedBackendGroup, name, t, CLUSTER, None)
    };
    assert_eq!(prove(name, &ours), Ok(()));
    // The cluster tag alone, another cluster's name or tag value: not ours.
    let name_err = Err(NotMade::Name(Made::SharedBackendGroup));
    assert_eq!(prove(name, &group()), name_err);
    assert_eq!(prove("aws-ccm-backend-c2", &ours), name_err);
    let other = tags(&[
        ("kubernetes.io/cluster/c1", "owned"),
        ("aws-ccm/shared-backend-group", "c2"),
    ]);
    assert_eq!(prove(name, &other), name_err);
    let shared = tags(&[
        ("kubernetes.io/cluster/c1", "shared"),
        ("aws-ccm/shared-backend-group", CLUSTER),
    ]);
    assert_eq!(
        prove(name, &shared),
        Err(NotMade::NotOwned("shared".into()))
    );
    // Nor is it ever taken for an NLB's managed group.
    assert!(super::prove(Made::NlbGroup, name, &ours, CLUSTER, None).is_err());
}
