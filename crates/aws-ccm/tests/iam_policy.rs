//! iam/policy.json, evaluated as AWS evaluates it.
//!
//! moto does not evaluate IAM, so nothing else in the suite notices a policy
//! whose conditions can never hold. These tests run the offline oracle
//! (`ccm_testkit::iam`: the policy language, plus the Service
//! Authorization Reference table in iam/authorization.json) on:
//! - requests built here that the CCM must be able to make, and ones the
//!   policy must deny (another cluster's resources, a shared group's
//!   deletion, changing cluster tag keys);
//! - `recorded_requests_are_allowed`: every request the CCM sent during the
//!   whole integration suite, as the fault proxies recorded it with the
//!   tags the resources had at that moment (`AWS_CCM_RECORD_ACTIONS`).
//!   `make test` runs it after the suite (nextest's default filter leaves it
//!   out of a plain run). It also checks coverage both ways: nothing called
//!   that the policy does not grant, nothing granted that no test called.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use aws_ccm::aws::{Operation, Service};
use ccm_testkit::aws_proxy::RECORD_ENV;
use ccm_testkit::iam::{self, AuthorizationTable, Context, Policy, RecordedRequest};
use serde_json::Value;

const CLUSTER: &str = "ccm-test";
const CLUSTER_TAG: &str = "kubernetes.io/cluster/ccm-test";
const OTHER_TAG: &str = "kubernetes.io/cluster/other";
const LB_ARN: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/a1b2/0123456789abcdef";
const TG_ARN: &str =
    "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/k8s-tg/0123456789abcdef";
const LISTENER_ARN: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:listener/net/a1b2/0123456789abcdef/fedcba9876543210";

fn repo_file(path: &str) -> PathBuf {
    ccm_testkit::repo_path(path)
}

/// `iam/render.sh policy CLUSTER options…`, the operator's own command.
fn rendered(options: &[String]) -> String {
    let out = std::process::Command::new("bash")
        .arg(repo_file("iam/render.sh"))
        .arg("policy")
        .arg(CLUSTER)
        .args(options)
        .output()
        .expect("running iam/render.sh");
    assert!(
        out.status.success(),
        "iam/render.sh policy {CLUSTER} {options:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("render.sh prints UTF-8")
}

fn policy_with(options: &[&str]) -> Policy {
    let options: Vec<String> = options.iter().map(|o| o.to_string()).collect();
    Policy::parse(&rendered(&options)).expect("rendered policy parses")
}

fn table() -> AuthorizationTable {
    let path = repo_file("iam/authorization.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    AuthorizationTable::parse(&text).expect("authorization table parses")
}

/// A request as the proxy records it: `service`, `action`, parameters and
/// the tags of the resources it names.
fn request(
    service: &str,
    action: &str,
    params: &[(&str, &str)],
    tags: &[(&str, &[(&str, &str)])],
) -> RecordedRequest {
    RecordedRequest {
        service: service.into(),
        action: action.into(),
        region: "us-east-1".into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        tags: tags
            .iter()
            .map(|(id, t)| {
                (
                    id.to_string(),
                    t.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                )
            })
            .collect(),
        policy_options: Vec::new(),
    }
}

/// `None` when allowed, else what was denied.
fn denial(policy: &Policy, request: &RecordedRequest) -> Option<String> {
    denial_in(policy, request, "aws")
}

fn denial_in(policy: &Policy, request: &RecordedRequest, partition: &str) -> Option<String> {
    iam::first_denial(policy, &table(), request, partition)
        .unwrap_or_else(|e| {
            panic!(
                "the oracle cannot map {} {}: {e}",
                request.service, request.action
            )
        })
        .map(|(auth, decision)| {
            format!(
                "{} on {} ({decision:?}; {})",
                auth.action, auth.resource, auth.what
            )
        })
}

fn create_security_group() -> RecordedRequest {
    request(
        "ec2",
        "CreateSecurityGroup",
        &[
            ("GroupName", "k8s-elb-a1b2"),
            (
                "GroupDescription",
                "Security group for Kubernetes ELB a1b2 (default/web)",
            ),
            ("VpcId", "vpc-0123abcd"),
            ("TagSpecification.1.ResourceType", "security-group"),
            ("TagSpecification.1.Tag.1.Key", CLUSTER_TAG),
            ("TagSpecification.1.Tag.1.Value", "owned"),
            ("TagSpecification.1.Tag.2.Key", "kubernetes.io/service-name"),
            ("TagSpecification.1.Tag.2.Value", "default/web"),
        ],
        &[("vpc-0123abcd", &[])],
    )
}

fn create_nlb() -> RecordedRequest {
    request(
        "elasticloadbalancingv2",
        "CreateLoadBalancer",
        &[
            ("Name", "a1b2"),
            ("Type", "network"),
            ("Scheme", "internet-facing"),
            ("Subnets.member.1", "subnet-1"),
            ("Tags.member.1.Key", CLUSTER_TAG),
            ("Tags.member.1.Value", "owned"),
            ("Tags.member.2.Key", "kubernetes.io/service-name"),
            ("Tags.member.2.Value", "default/web"),
        ],
        &[],
    )
}

fn create_clb(cluster_tag: &str) -> RecordedRequest {
    request(
        "elasticloadbalancing",
        "CreateLoadBalancer",
        &[
            ("LoadBalancerName", "a1b2"),
            ("Listeners.member.1.Protocol", "TCP"),
            ("Tags.member.1.Key", cluster_tag),
            ("Tags.member.1.Value", "owned"),
        ],
        &[],
    )
}

#[test]
fn the_old_policy_denied_every_managed_security_group_and_the_new_one_allows_it() {
    // The statement the first policy had: the VPC under a request-tag
    // condition the vpc resource type never carries.
    let old = Policy::parse(
        r#"{"Version":"2012-10-17","Statement":[{"Sid":"CreateOwnedSecurityGroups","Effect":"Allow",
            "Action":"ec2:CreateSecurityGroup",
            "Resource":["arn:aws:ec2:*:*:security-group/*","arn:aws:ec2:*:*:vpc/*"],
            "Condition":{"StringEquals":{"aws:RequestTag/kubernetes.io/cluster/ccm-test":"owned"}}},
            {"Sid":"TagOnCreate","Effect":"Allow","Action":"ec2:CreateTags","Resource":"arn:aws:ec2:*:*:security-group/*",
            "Condition":{"StringEquals":{"ec2:CreateAction":"CreateSecurityGroup"}}}]}"#,
    )
    .expect("old statement parses");
    let denied = denial(&old, &create_security_group()).expect("the old policy must deny");
    assert!(denied.contains("vpc/vpc-0123abcd"), "{denied}");
    assert_eq!(denial(&policy_with(&[]), &create_security_group()), None);
}

#[test]
fn load_balancer_creation_is_allowed_with_tags_and_the_service_linked_role() {
    let policy = policy_with(&[]);
    assert_eq!(denial(&policy, &create_nlb()), None);
    assert_eq!(denial(&policy, &create_clb(CLUSTER_TAG)), None);
    let listener = request(
        "elasticloadbalancingv2",
        "CreateListener",
        &[
            ("LoadBalancerArn", LB_ARN),
            ("Port", "80"),
            ("Protocol", "TCP"),
            ("Tags.member.1.Key", CLUSTER_TAG),
            ("Tags.member.1.Value", "owned"),
        ],
        &[(LB_ARN, &[(CLUSTER_TAG, "owned")])],
    );
    assert_eq!(denial(&policy, &listener), None);
    // Without the service-linked role grant the first load balancer fails.
    let without_slr =
        Policy::parse(&rendered(&[]).replace("iam:CreateServiceLinkedRole", "iam:GetRole"))
            .expect("policy parses");
    let denied = denial(&without_slr, &create_nlb()).expect("needs iam:CreateServiceLinkedRole");
    assert!(
        denied.starts_with("iam:CreateServiceLinkedRole"),
        "{denied}"
    );
    // … and the grant is for ELB's role only.
    let mut other_service = Context::default();
    other_service.set("iam:AWSServiceName", "autoscaling.amazonaws.com");
    let role = "arn:aws:iam::123456789012:role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling";
    assert!(
        !policy
            .evaluate("iam:CreateServiceLinkedRole", role, &other_service)
            .is_allowed()
    );
}

#[test]
fn creations_without_the_owned_tag_are_denied() {
    let policy = policy_with(&[]);
    let mut untagged_sg = create_security_group();
    untagged_sg
        .params
        .retain(|k, _| !k.starts_with("TagSpecification"));
    assert!(denial(&policy, &untagged_sg).is_some());
    assert!(denial(&policy, &create_clb(OTHER_TAG)).is_some());
    let mut untagged_nlb = create_nlb();
    untagged_nlb.params.retain(|k, _| !k.starts_with("Tags."));
    assert!(denial(&policy, &untagged_nlb).is_some());
}

#[test]
fn another_clusters_resources_are_denied() {
    let policy = policy_with(&[]);
    let cases = [
        request(
            "ec2",
            "AuthorizeSecurityGroupIngress",
            &[("GroupId", "sg-0a"), ("IpPermissions.1.IpProtocol", "tcp")],
            &[("sg-0a", &[(OTHER_TAG, "owned")])],
        ),
        request(
            "ec2",
            "CreateRoute",
            &[
                ("RouteTableId", "rtb-0a"),
                ("DestinationCidrBlock", "10.0.0.0/24"),
                ("InstanceId", "i-0a"),
            ],
            &[("rtb-0a", &[(OTHER_TAG, "shared")])],
        ),
        request(
            "elasticloadbalancingv2",
            "DeleteLoadBalancer",
            &[("LoadBalancerArn", LB_ARN)],
            &[(LB_ARN, &[(OTHER_TAG, "owned")])],
        ),
        request(
            "elasticloadbalancingv2",
            "RegisterTargets",
            &[("TargetGroupArn", TG_ARN), ("Targets.member.1.Id", "i-0a")],
            &[(TG_ARN, &[(OTHER_TAG, "owned")])],
        ),
        request(
            "elasticloadbalancing",
            "DeleteLoadBalancer",
            &[("LoadBalancerName", "other")],
            &[("other", &[(OTHER_TAG, "owned")])],
        ),
        request(
            "ec2",
            "ModifyInstanceAttribute",
            &[("InstanceId", "i-0a"), ("SourceDestCheck.Value", "false")],
            &[("i-0a", &[(OTHER_TAG, "owned")])],
        ),
    ];
    for case in &cases {
        assert!(
            denial(&policy, case).is_some(),
            "{} {} must be denied",
            case.service,
            case.action
        );
        // … and the same request on this cluster's resource is allowed.
        let mut ours = case.clone();
        for tags in ours.tags.values_mut() {
            let value = tags
                .remove(OTHER_TAG)
                .expect("case carries the other cluster's tag");
            tags.insert(CLUSTER_TAG.into(), value);
        }
        assert_eq!(
            denial(&policy, &ours),
            None,
            "{} {} on our resource",
            case.service,
            case.action
        );
    }
}

#[test]
fn shared_groups_are_never_deleted_and_untagged_resources_never_changed() {
    let policy = policy_with(&[]);
    let delete_shared = request(
        "ec2",
        "DeleteSecurityGroup",
        &[("GroupId", "sg-0a")],
        &[("sg-0a", &[(CLUSTER_TAG, "shared")])],
    );
    assert!(denial(&policy, &delete_shared).is_some());
    let delete_owned = request(
        "ec2",
        "DeleteSecurityGroup",
        &[("GroupId", "sg-0a")],
        &[("sg-0a", &[(CLUSTER_TAG, "owned")])],
    );
    assert_eq!(denial(&policy, &delete_owned), None);
    let untagged_listener = request(
        "elasticloadbalancingv2",
        "ModifyListener",
        &[("ListenerArn", LISTENER_ARN)],
        &[(LISTENER_ARN, &[])],
    );
    assert!(denial(&policy, &untagged_listener).is_some());
    // Moving an instance between groups is not the CCM's business.
    let move_groups = request(
        "ec2",
        "ModifyInstanceAttribute",
        &[("InstanceId", "i-0a"), ("GroupId.1", "sg-0b")],
        &[
            ("i-0a", &[(CLUSTER_TAG, "owned")]),
            ("sg-0b", &[(CLUSTER_TAG, "owned")]),
        ],
    );
    let denied = denial(&policy, &move_groups).expect("moving groups must be denied");
    assert!(denied.contains("security-group/sg-0b"), "{denied}");
}

#[test]
fn cluster_tag_keys_cannot_be_written_or_removed_on_anything() {
    let policy = policy_with(&["--legacy-cluster-tag"]);
    let instance_tags = [(CLUSTER_TAG, "owned")];
    let sg_tags = [(CLUSTER_TAG, "shared")];
    let cases = [
        // Claiming a shared group (shared -> owned) so it could be deleted.
        request(
            "ec2",
            "CreateTags",
            &[
                ("ResourceId.1", "sg-0a"),
                ("Tag.1.Key", CLUSTER_TAG),
                ("Tag.1.Value", "owned"),
            ],
            &[("sg-0a", &sg_tags)],
        ),
        request(
            "ec2",
            "CreateTags",
            &[
                ("ResourceId.1", "i-0a"),
                ("Tag.1.Key", OTHER_TAG),
                ("Tag.1.Value", "owned"),
            ],
            &[("i-0a", &instance_tags)],
        ),
        request(
            "ec2",
            "CreateTags",
            &[
                ("ResourceId.1", "i-0a"),
                ("Tag.1.Key", "team"),
                ("Tag.1.Value", "a"),
                ("Tag.2.Key", "KubernetesCluster"),
                ("Tag.2.Value", "x"),
            ],
            &[("i-0a", &instance_tags)],
        ),
        request(
            "ec2",
            "DeleteTags",
            &[("ResourceId.1", "i-0a"), ("Tag.1.Key", CLUSTER_TAG)],
            &[("i-0a", &instance_tags)],
        ),
        request(
            "ec2",
            "CreateTags",
            &[
                ("ResourceId.1", "rtb-0a"),
                ("Tag.1.Key", "team"),
                ("Tag.1.Value", "a"),
            ],
            &[("rtb-0a", &sg_tags)],
        ),
        request(
            "elasticloadbalancingv2",
            "AddTags",
            &[
                ("ResourceArns.member.1", LB_ARN),
                ("Tags.member.1.Key", OTHER_TAG),
                ("Tags.member.1.Value", "owned"),
            ],
            &[(LB_ARN, &[(CLUSTER_TAG, "owned")])],
        ),
        request(
            "elasticloadbalancing",
            "AddTags",
            &[
                ("LoadBalancerNames.member.1", "a1b2"),
                ("Tags.member.1.Key", "KubernetesCluster"),
                ("Tags.member.1.Value", "x"),
            ],
            &[("a1b2", &[(CLUSTER_TAG, "owned")])],
        ),
        // Tags that follow the annotation never take a cluster tag away.
        request(
            "elasticloadbalancingv2",
            "RemoveTags",
            &[
                ("ResourceArns.member.1", LB_ARN),
                ("TagKeys.member.1", "team"),
                ("TagKeys.member.2", CLUSTER_TAG),
            ],
            &[(LB_ARN, &[(CLUSTER_TAG, "owned")])],
        ),
        // Nor remove a tag from a load balancer another cluster owns.
        request(
            "elasticloadbalancingv2",
            "RemoveTags",
            &[
                ("ResourceArns.member.1", LB_ARN),
                ("TagKeys.member.1", "team"),
            ],
            &[(LB_ARN, &[(OTHER_TAG, "owned")])],
        ),
    ];
    for case in &cases {
        assert!(
            denial(&policy, case).is_some(),
            "{} {} {:?} must be denied",
            case.service,
            case.action,
            case.params
        );
    }
    // Ordinary tags on the cluster's instances and load balancers are fine.
    let team = request(
        "ec2",
        "CreateTags",
        &[
            ("ResourceId.1", "i-0a"),
            ("Tag.1.Key", "team"),
            ("Tag.1.Value", "a"),
        ],
        &[("i-0a", &instance_tags)],
    );
    assert_eq!(denial(&policy, &team), None);
    let lb_team = request(
        "elasticloadbalancingv2",
        "AddTags",
        &[
            ("ResourceArns.member.1", LB_ARN),
            ("Tags.member.1.Key", "team"),
            ("Tags.member.1.Value", "a"),
        ],
        &[(LB_ARN, &[(CLUSTER_TAG, "owned")])],
    );
    assert_eq!(denial(&policy, &lb_team), None);
    let lb_untag = request(
        "elasticloadbalancingv2",
        "RemoveTags",
        &[
            ("ResourceArns.member.1", LB_ARN),
            ("TagKeys.member.1", "team"),
        ],
        &[(LB_ARN, &[(CLUSTER_TAG, "owned")])],
    );
    assert_eq!(denial(&policy, &lb_untag), None);
}

#[test]
fn render_options_grant_exactly_what_they_name() {
    let untagged_table = request(
        "ec2",
        "CreateRoute",
        &[
            ("RouteTableId", "rtb-0123456789abcdef0"),
            ("DestinationCidrBlock", "10.0.0.0/24"),
        ],
        &[("rtb-0123456789abcdef0", &[])],
    );
    let legacy_table = request(
        "ec2",
        "ReplaceRoute",
        &[
            ("RouteTableId", "rtb-0a"),
            ("DestinationCidrBlock", "10.0.0.0/24"),
        ],
        &[("rtb-0a", &[("KubernetesCluster", CLUSTER)])],
    );
    let untagged_group = request(
        "ec2",
        "AuthorizeSecurityGroupIngress",
        &[("GroupId", "sg-0123456789abcdef0")],
        &[("sg-0123456789abcdef0", &[])],
    );
    let legacy_instance = request(
        "ec2",
        "ModifyInstanceAttribute",
        &[("InstanceId", "i-0a"), ("SourceDestCheck.Value", "false")],
        &[("i-0a", &[("KubernetesCluster", CLUSTER)])],
    );
    let base = policy_with(&[]);
    for case in [
        &untagged_table,
        &legacy_table,
        &untagged_group,
        &legacy_instance,
    ] {
        assert!(
            denial(&base, case).is_some(),
            "{} without an option",
            case.action
        );
    }
    let table_option = policy_with(&["--route-table", "rtb-0123456789abcdef0"]);
    assert_eq!(denial(&table_option, &untagged_table), None);
    assert!(denial(&table_option, &legacy_table).is_some());
    let group_option = policy_with(&["--security-group", "sg-0123456789abcdef0"]);
    assert_eq!(denial(&group_option, &untagged_group), None);
    let legacy = policy_with(&["--legacy-cluster-tag"]);
    assert_eq!(denial(&legacy, &legacy_table), None);
    assert_eq!(denial(&legacy, &legacy_instance), None);
    let other_legacy = request(
        "ec2",
        "ReplaceRoute",
        &[("RouteTableId", "rtb-0a")],
        &[("rtb-0a", &[("KubernetesCluster", "other")])],
    );
    assert!(denial(&legacy, &other_legacy).is_some());
    let assume = request(
        "sts",
        "AssumeRole",
        &[
            ("RoleArn", "arn:aws:iam::123456789012:role/ccm"),
            ("RoleSessionName", "aws-ccm"),
        ],
        &[],
    );
    assert!(denial(&base, &assume).is_some());
    assert_eq!(
        denial(
            &policy_with(&["--assume-role", "arn:aws:iam::123456789012:role/ccm"]),
            &assume
        ),
        None
    );
}

/// `aws-ccm doctor`'s ELB check calls `iam:SimulatePrincipalPolicy` with
/// the operator's credentials: the CCM's policy does not grant it (under
/// any render option), so a doctor run as the CCM's role gets AccessDenied
/// and reports a warning, and the oracle maps the request to the simulated
/// role.
#[test]
fn the_ccm_policy_does_not_grant_doctors_policy_simulation() {
    let simulate = request(
        "iam",
        "SimulatePrincipalPolicy",
        &[
            ("PolicySourceArn", "arn:aws:iam::123456789012:role/aws-ccm"),
            (
                "ActionNames.member.1",
                "elasticloadbalancing:CreateLoadBalancer",
            ),
        ],
        &[],
    );
    let options: [&[&str]; 3] = [
        &[],
        &["--legacy-cluster-tag"],
        &["--assume-role", "arn:aws:iam::123456789012:role/ccm"],
    ];
    for options in options {
        let denied = denial(&policy_with(options), &simulate).expect("denied");
        assert!(
            denied.contains("iam:SimulatePrincipalPolicy")
                && denied.contains("arn:aws:iam::123456789012:role/aws-ccm"),
            "{denied}"
        );
    }
}

#[test]
fn partitions_are_rendered_not_hard_coded() {
    let gov = policy_with(&["--partition", "aws-us-gov"]);
    assert_eq!(
        denial_in(&gov, &create_security_group(), "aws-us-gov"),
        None
    );
    assert_eq!(denial_in(&gov, &create_nlb(), "aws-us-gov"), None);
    assert!(denial_in(&gov, &create_security_group(), "aws").is_some());
    let text = std::fs::read_to_string(repo_file("iam/policy.json")).expect("policy");
    assert!(
        !text.contains("arn:aws:"),
        "iam/policy.json hard-codes the aws partition"
    );
}

// ---- the policy's shape ----

fn list(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// IAM's name for an operation: ELB and ELBv2 share one prefix.
fn iam_action(op: Operation) -> String {
    let prefix = match op.service() {
        Service::Ec2 => "ec2",
        Service::Elb | Service::Elbv2 => "elasticloadbalancing",
        Service::Sts => "sts",
        Service::Iam => "iam",
    };
    format!("{prefix}:{}", op.action())
}

/// Actions AWS checks on the CCM's behalf, though the CCM never sends them.
const IMPLIED: &[&str] = &["iam:CreateServiceLinkedRole"];

#[test]
fn policy_is_least_privilege() {
    let policy: Value = serde_json::from_str(&rendered(&[])).expect("policy is JSON");
    let table: BTreeSet<String> = Operation::ALL.iter().map(|op| iam_action(*op)).collect();
    let mut sids = BTreeSet::new();
    for statement in policy["Statement"].as_array().expect("Statement is a list") {
        let sid = statement["Sid"]
            .as_str()
            .expect("every statement has a Sid");
        assert!(sids.insert(sid.to_string()), "duplicate Sid {sid}");
        assert_eq!(statement["Effect"], "Allow", "{sid}: only Allow statements");
        assert!(statement.get("NotAction").is_none() && statement.get("NotResource").is_none());
        let actions = list(&statement["Action"]);
        for action in &actions {
            assert!(!action.contains('*'), "{sid}: wildcard action {action}");
            assert!(
                table.contains(action) || IMPLIED.contains(&action.as_str()),
                "{sid}: {action} is not an operation the client layer can call (crates/aws-ccm/src/aws/client/operations.rs)"
            );
        }
        let resources = list(&statement["Resource"]);
        let reads = actions
            .iter()
            .filter(|a| {
                a.split(':')
                    .nth(1)
                    .is_some_and(|n| n.starts_with("Describe"))
            })
            .count();
        assert!(
            reads == 0 || reads == actions.len(),
            "{sid}: mixes reads and writes"
        );
        if reads == 0 {
            assert!(
                !resources.iter().any(|r| r == "*"),
                "{sid}: writes name their resource types"
            );
            let vpc_only = resources.iter().all(|r| r.ends_with(":vpc/*"))
                && actions == ["ec2:CreateSecurityGroup"];
            assert!(
                statement.get("Condition").is_some() || vpc_only,
                "{sid}: every write is conditioned (the VPC half of CreateSecurityGroup aside)"
            );
        }
    }
    let trust: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_file("iam/trust-policy.json")).expect("trust policy"),
    )
    .expect("trust policy is JSON");
    let statement = &trust["Statement"][0];
    assert_eq!(statement["Action"], "sts:AssumeRoleWithWebIdentity");
    assert_eq!(
        statement["Condition"]["StringEquals"]["OIDC_ISSUER:sub"],
        "system:serviceaccount:kube-system:cloud-controller-manager"
    );
}

#[test]
fn the_authorization_table_knows_every_operation() {
    let table = table();
    for op in Operation::ALL {
        let service = match op.service() {
            Service::Ec2 => "ec2",
            Service::Elb => "elasticloadbalancing",
            Service::Elbv2 => "elasticloadbalancingv2",
            Service::Sts => "sts",
            Service::Iam => "iam",
        };
        let r = RecordedRequest {
            service: service.into(),
            action: op.action().into(),
            ..Default::default()
        };
        assert_eq!(
            table.iam_action(&r),
            Some(iam_action(*op).as_str()),
            "{op:?} is missing from iam/authorization.json: run iam/gen-authorization.py"
        );
    }
}

// ---- the whole suite's requests ----

fn recorded() -> Vec<RecordedRequest> {
    ccm_testkit::records::read_all(RECORD_ENV)
}

#[test]
fn recorded_requests_are_allowed() {
    let requests = recorded();
    assert!(
        requests.len() > 50,
        "only {} requests recorded: did the integration suite run through the proxies?",
        requests.len()
    );
    let table = table();
    let mut policies: HashMap<Vec<String>, Policy> = HashMap::new();
    let mut denied: BTreeMap<String, usize> = BTreeMap::new();
    let mut called = BTreeSet::new();
    let (mut evaluated, mut dry_runs) = (0usize, 0usize);
    for request in &requests {
        if request.service == "sts" && request.action == "AssumeRoleWithWebIdentity" {
            // Authorized by the role's trust policy (iam/trust-policy.json),
            // not by an identity policy: the caller has no identity yet.
            continue;
        }
        if request.service == "sts" && request.action == "GetCallerIdentity" {
            // `aws-ccm doctor`'s identity check. AWS requires no permission
            // for it and ignores even an explicit Deny (STS API reference),
            // so the policy does not list it.
            continue;
        }
        if request.service == "iam" && request.action == "SimulatePrincipalPolicy" {
            // `aws-ccm doctor`'s check of the ELB writes, made with the
            // credentials of whoever runs doctor (docs/aws-ccm-tool.md says
            // what they need): the CCM never calls it, so its policy does
            // not grant it.
            continue;
        }
        if request.is_dry_run() {
            // A probe: denial is an answer the self-check expects.
            dry_runs += 1;
            continue;
        }
        let policy = policies
            .entry(request.policy_options.clone())
            .or_insert_with(|| {
                Policy::parse(&rendered(&request.policy_options)).expect("rendered policy parses")
            });
        let authorizations = table
            .authorizations(request, iam::TEST_ACCOUNT, "aws")
            .unwrap_or_else(|e| {
                panic!("the oracle cannot map a recorded request ({e}): {request:?}")
            });
        for auth in authorizations {
            evaluated += 1;
            called.insert(auth.action.clone());
            let decision = policy.evaluate(&auth.action, &auth.resource, &auth.context);
            if !decision.is_allowed() {
                let line = format!(
                    "{} on {} ({}; options {:?}; context keys {:?})",
                    auth.action,
                    auth.resource,
                    auth.what,
                    request.policy_options,
                    auth.context.keys().collect::<Vec<_>>()
                );
                *denied.entry(line).or_default() += 1;
            }
        }
    }
    println!(
        "iam: {} recorded requests, {evaluated} authorizations evaluated, {dry_runs} dry runs skipped, {} denied",
        requests.len(),
        denied.values().sum::<usize>()
    );
    assert!(
        denied.is_empty(),
        "AWS would deny these requests the CCM made:\n{}",
        denied
            .iter()
            .map(|(l, n)| format!("  {n}x {l}"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    let base: Value = serde_json::from_str(&rendered(&[])).expect("policy is JSON");
    let granted: BTreeSet<String> = base["Statement"]
        .as_array()
        .expect("statements")
        .iter()
        .flat_map(|s| list(&s["Action"]))
        .collect();
    let not_granted: Vec<_> = called
        .difference(&granted)
        .filter(|a| *a != "sts:AssumeRole")
        .collect();
    let never_called: Vec<_> = granted.difference(&called).collect();
    assert!(
        not_granted.is_empty() && never_called.is_empty(),
        "iam/policy.json and the CCM's requests differ.\n  called but not granted: {not_granted:?}\n  granted but never needed by any test: {never_called:?}"
    );
}

#[test]
fn listener_attributes_are_written_only_on_this_clusters_listeners() {
    let policy = policy_with(&[]);
    let modify = |tags: &[(&str, &str)]| {
        request(
            "elasticloadbalancingv2",
            "ModifyListenerAttributes",
            &[
                ("ListenerArn", LISTENER_ARN),
                ("Attributes.member.1.Key", "tcp.idle_timeout.seconds"),
                ("Attributes.member.1.Value", "400"),
            ],
            &[(LISTENER_ARN, tags)],
        )
    };
    assert_eq!(denial(&policy, &modify(&[(CLUSTER_TAG, "owned")])), None);
    assert!(
        denial(&policy, &modify(&[])).is_some(),
        "an untagged listener"
    );
    assert!(
        denial(&policy, &modify(&[(CLUSTER_TAG, "shared")])).is_some(),
        "a shared listener"
    );
    // kOps' own CCM policy (iam/kops-ccm-policy.json) lacks it; the
    // additions (`--kops-additions`, pasted beside it) grant it.
    let text = std::fs::read_to_string(repo_file("iam/kops-ccm-policy.json"))
        .expect("kOps' policy")
        .replace("CLUSTER_ID", CLUSTER)
        .replace("PARTITION", "aws");
    let mut kops: Value = serde_json::from_str(&text).expect("kOps' policy is JSON");
    let ours = modify(&[(CLUSTER_TAG, "owned"), ("KubernetesCluster", CLUSTER)]);
    let parse = |doc: &Value| Policy::parse(&doc.to_string()).expect("the policy parses");
    assert!(
        denial(&parse(&kops), &ours).is_some(),
        "kOps' policy grants it"
    );
    let additions: Value =
        serde_json::from_str(&rendered(&["--kops-additions".to_string()])).expect("JSON");
    let statements = kops["Statement"].as_array_mut().expect("statements");
    statements.extend(additions.as_array().expect("an array").iter().cloned());
    assert_eq!(denial(&parse(&kops), &ours), None);
}
