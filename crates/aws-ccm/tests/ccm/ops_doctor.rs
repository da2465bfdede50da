//! Issue 20: `aws-ccm doctor` against moto and the API test server, with
//! the CCM's kubeconfig (its service account, RBAC enforced): a correct
//! setup with the CCM running passes every check and exits 0; a broken one
//! (subnets tagged for another cluster only, no cluster-tagged route table,
//! a Node without an instance, an uninitialized Node, a kubelet not
//! external, a write IAM denies, no leader) names each problem with its fix
//! and exits non-zero; a kubeconfig user without the CCM's roles gets the
//! RBAC it lacks listed; `-o json` gives the same checks as data. The ELB
//! writes are checked by IAM's policy simulator (the fault proxy answers it
//! from the IAM oracle with the policy a test installs for the CCM's role):
//! the project's policy passes, one whose create condition names the wrong
//! tag fails naming the action and the fix, and a caller denied the
//! simulation gets a warning.

use std::time::Duration;

use aws_sdk_ec2::types::{ResourceType, Tag};
use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use serde_json::{Value, json};

use crate::ops_orphans::{run_tool, run_tool_as};
use crate::routes::{create, nodes_api};
use crate::support::*;

const CLUSTER_TAG: &str = "kubernetes.io/cluster/ccm-test";

/// The CCM's role in these tests: doctor is told it with --role-arn.
const ROLE: &str = "arn:aws:iam::123456789012:role/aws-ccm";

/// Installs `policy` as the CCM role's (what IAM's simulator evaluates) and
/// gives the doctor flags naming the role.
fn role_with(env: &Env, policy: &str) -> anyhow::Result<[String; 1]> {
    env.proxy.set_iam_principal_policy(ROLE, Some(policy))?;
    Ok([format!("--role-arn={ROLE}")])
}

/// A cluster-admin kubeconfig (the API test server's token-less one), as
/// an operator running doctor has.
fn admin_kubeconfig(env: &Env) -> anyhow::Result<std::path::PathBuf> {
    let path = env.cloud_conf.with_file_name("admin-kubeconfig");
    std::fs::write(&path, env.api.kubeconfig_yaml())?;
    Ok(path)
}

/// A Node whose providerID names `instance`, without taints.
fn node(name: &str, instance: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"providerID": format!("aws:///us-east-1a/{instance}")},
    }))
    .expect("a valid Node")
}

/// seed_cluster's VPC (a public subnet tagged for this cluster and for
/// internet-facing load balancers, a cluster-tagged node group, two
/// instances) with a cluster-tagged route table and a Node per instance.
async fn correct_setup(env: &Env) -> anyhow::Result<Seeded> {
    let seeded = seed_cluster(env, 2).await?;
    seeded
        .ec2
        .create_route_table()
        .vpc_id(&seeded.vpc)
        .tag_specifications(tags(ResourceType::RouteTable, &[(CLUSTER_TAG, "owned")]))
        .send()
        .await?;
    let nodes = nodes_api(env).await?;
    for (i, id) in seeded.instances.iter().enumerate() {
        create(&nodes, node(&format!("n{i}"), id)).await?;
    }
    Ok(seeded)
}

fn checks(json: &str) -> anyhow::Result<Vec<Value>> {
    let report: Value = serde_json::from_str(json)?;
    Ok(report["checks"].as_array().cloned().unwrap_or_default())
}

#[tokio::test]
async fn doctor_passes_every_check_on_a_correct_setup() -> anyhow::Result<()> {
    let env = Env::start().await?;
    correct_setup(&env).await?;
    let ccm = env.start_ccm(&["--cluster-cidr=10.244.0.0/16"]).await?;
    let leases: Api<Lease> = Api::namespaced(env.api.client().await?, "kube-system");
    eventually("the CCM's Lease", Duration::from_secs(30), || async {
        leases
            .get_opt("cloud-controller-manager")
            .await
            .ok()
            .flatten()
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;

    // The role comes from the CCM ServiceAccount's IRSA annotation, as on
    // a cluster installed from manifests/ (the other tests pass --role-arn).
    env.proxy
        .set_iam_principal_policy(ROLE, Some(&crate::iam::rendered_policy(&[])?))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(env.api.client().await?, "kube-system");
    let account: ServiceAccount = serde_json::from_value(json!({
        "metadata": {
            "name": "cloud-controller-manager",
            "annotations": {"eks.amazonaws.com/role-arn": ROLE},
        },
    }))?;
    accounts.create(&Default::default(), &account).await?;
    // Reading a ServiceAccount is an operator's right, not the CCM's: run
    // as cluster-admin (the CCM's own kubeconfig gets 403 and falls back).
    let admin = admin_kubeconfig(&env)?;
    let (ok, stdout, stderr) = run_tool_as(&env, &admin, "doctor", &[], "").await?;
    assert!(ok, "doctor failed on a correct setup:\n{stdout}\n{stderr}");
    assert!(!stdout.contains("[FAIL]"), "{stdout}");
    assert!(!stdout.contains("[WARN]"), "{stdout}");
    for line in [
        "[PASS] credentials: arn:aws:",
        "(account 123456789012), found through environment variables",
        "found through environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)",
        "[PASS] region: us-east-1 from cloud.conf Region",
        "[PASS] cluster ID: ccm-test from cloud.conf [Global] KubernetesClusterID",
        "[PASS] every Node's instance, with the cluster tag: 2 of 2 Nodes",
        "[PASS] us-east-1a internet-facing: subnet-",
        "(kubernetes.io/role/elb=1, kubernetes.io/cluster/ccm-test=shared)",
        "[PASS] us-east-1a internal: subnet-",
        "[PASS] one cluster-tagged group per instance: each of 2 instances",
        "[PASS] the CCM's writes: allowed by DryRun: ec2:CreateRoute on rtb-",
        "[PASS] the CCM's ELB writes: ",
        &format!(
            "allowed by IAM for {ROLE} (from the eks.amazonaws.com/role-arn annotation of ServiceAccount kube-system/cloud-controller-manager)"
        ),
        "[PASS] uninitialized Nodes: none of 2 Nodes waits for the CCM",
        "[PASS] the CCM's RBAC (this kubeconfig's user): all 21 requests the CCM makes are allowed",
        "[PASS] leader Lease kube-system/cloud-controller-manager: held by ",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    let (ok, json, _) = run_tool_as(&env, &admin, "doctor", &["-o", "json"], "").await?;
    assert!(ok);
    let listed = checks(&json)?;
    assert!(listed.len() >= 12, "{json}");
    for c in &listed {
        assert!(
            c["status"] == "pass" || c["status"] == "skip",
            "not passed: {c}"
        );
    }
    env.finish().await
}

/// The failed checks of `section`, by name.
fn failed_in(listed: &[Value], section: &str) -> Vec<String> {
    let mut names: Vec<String> = listed
        .iter()
        .filter(|c| c["section"] == section && c["status"] == "fail")
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// A role whose create statement names another cluster's tag: IAM denies
/// the CCM's creates (it tags with its own cluster), and doctor says which
/// actions, why, and the fix; the writes to existing resources still pass.
#[tokio::test]
async fn doctor_fails_elb_creates_a_wrong_tag_condition_denies() -> anyhow::Result<()> {
    let env = Env::start().await?;
    correct_setup(&env).await?;
    let mut policy: Value = serde_json::from_str(&crate::iam::rendered_policy(&[])?)?;
    let statements = policy["Statement"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("no Statement list"))?;
    let create = statements
        .iter_mut()
        .find(|s| s["Sid"] == "CreateOwnedLoadBalancers")
        .ok_or_else(|| anyhow::anyhow!("no CreateOwnedLoadBalancers statement"))?;
    create["Condition"] = json!({"StringEquals": {
        "aws:RequestTag/kubernetes.io/cluster/other-cluster": "owned"
    }});
    let role = role_with(&env, &policy.to_string())?;

    let (ok, stdout, stderr) = run_tool(&env, "doctor", &[role[0].as_str()], "").await?;
    assert!(
        !ok,
        "doctor passed a role that cannot create:\n{stdout}\n{stderr}"
    );
    for line in [
        &format!(
            "[FAIL] elasticloadbalancing:CreateLoadBalancer (network load balancer): IAM simulation of {ROLE} answers implicitDeny (creating a network load balancer tagged {CLUSTER_TAG}=owned; arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/"
        ),
        "the policy's conditions test aws:RequestTag/kubernetes.io/cluster/other-cluster, which the request has no value for",
        &format!(
            "fix: attach the policy iam/render.sh policy ccm-test renders to {ROLE} (statement CreateOwnedLoadBalancers), or allow elasticloadbalancing:CreateLoadBalancer on arn:aws:elasticloadbalancing:*:*:loadbalancer/* with the condition StringEquals aws:RequestTag/{CLUSTER_TAG} = owned"
        ),
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    let (ok, json, _) = run_tool(&env, "doctor", &["-o", "json", role[0].as_str()], "").await?;
    assert!(!ok);
    assert_eq!(
        failed_in(&checks(&json)?, "iam"),
        [
            "elasticloadbalancing:CreateLoadBalancer (classic load balancer)",
            "elasticloadbalancing:CreateLoadBalancer (network load balancer)",
            "elasticloadbalancing:CreateTargetGroup (target group)",
        ],
        "{json}"
    );
    env.finish().await
}

/// Whoever runs doctor may not call iam:SimulatePrincipalPolicy: the ELB
/// writes are a warning naming the permission, and the rest of the
/// checklist runs.
#[tokio::test]
async fn doctor_warns_when_the_caller_may_not_simulate() -> anyhow::Result<()> {
    let env = Env::start().await?;
    correct_setup(&env).await?;
    let role = role_with(&env, &crate::iam::rendered_policy(&[])?)?;
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 403,
            code: "AccessDenied".into(),
            message: "User: arn:aws:iam::123456789012:user/operator is not authorized to perform: iam:SimulatePrincipalPolicy".into(),
        })
        .for_service("iam")
        .for_action("SimulatePrincipalPolicy"),
    ]);
    let (_, json, stderr) = run_tool(&env, "doctor", &["-o", "json", role[0].as_str()], "").await?;
    let listed = checks(&json).map_err(|e| anyhow::anyhow!("{e}: {json}\n{stderr}"))?;
    let elb: Vec<&Value> = listed
        .iter()
        .filter(|c| c["section"] == "iam" && c["name"] == "the CCM's ELB writes")
        .collect();
    assert_eq!(elb.len(), 1, "{json}");
    assert_eq!(elb[0]["status"], "warn", "{json}");
    let detail = elb[0]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("may not call iam:SimulatePrincipalPolicy"),
        "{detail}"
    );
    let fix = elb[0]["fix"].as_str().unwrap_or_default();
    assert!(
        fix.contains(&format!("iam:SimulatePrincipalPolicy on {ROLE}"))
            && fix.contains("not the CCM's role"),
        "{fix}"
    );
    assert!(failed_in(&listed, "iam").is_empty(), "{json}");
    assert!(
        listed.iter().any(|c| c["section"] == "kubernetes"),
        "the checklist went on: {json}"
    );
    env.finish().await
}

/// Replaces the subnet's tags with another cluster's: no subnet is this
/// cluster's or of no cluster.
async fn untag_subnet(seeded: &Seeded) -> anyhow::Result<()> {
    seeded
        .ec2
        .delete_tags()
        .resources(&seeded.subnet)
        .tags(Tag::builder().key(CLUSTER_TAG).build())
        .tags(Tag::builder().key("kubernetes.io/role/elb").build())
        .send()
        .await?;
    seeded
        .ec2
        .create_tags()
        .resources(&seeded.subnet)
        .tags(
            Tag::builder()
                .key("kubernetes.io/cluster/other")
                .value("owned")
                .build(),
        )
        .send()
        .await?;
    Ok(())
}

/// Nodes: one naming no instance, one waiting for the CCM for an hour, one
/// whose kubelet is not external.
async fn broken_nodes(env: &Env) -> anyhow::Result<()> {
    let nodes = nodes_api(env).await?;
    create(&nodes, node("ghost", "i-00000000000000dead")).await?;
    let waiting: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "waiting"},
        "spec": {"taints": [{
            "key": "node.cloudprovider.kubernetes.io/uninitialized",
            "value": "true",
            "effect": "NoSchedule",
            "timeAdded": "2020-01-01T00:00:00Z",
        }]},
    }))?;
    create(&nodes, waiting).await?;
    let internal: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "in-tree"},
    }))?;
    create(&nodes, internal).await?;
    Ok(())
}

#[tokio::test]
async fn doctor_names_each_problem_of_a_broken_setup_with_its_fix() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let nodes = nodes_api(&env).await?;
    create(&nodes, node("n0", &seeded.instances[0])).await?;
    untag_subnet(&seeded).await?;
    // The nodes' subnet routes through a table without the cluster tag.
    let rtb = seeded
        .ec2
        .create_route_table()
        .vpc_id(&seeded.vpc)
        .send()
        .await?
        .route_table
        .and_then(|t| t.route_table_id)
        .unwrap_or_default();
    seeded
        .ec2
        .associate_route_table()
        .route_table_id(&rtb)
        .subnet_id(&seeded.subnet)
        .send()
        .await?;
    // Still a public subnet: the table routes to the VPC's internet gateway.
    let igw = seeded
        .ec2
        .describe_internet_gateways()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("attachment.vpc-id")
                .values(&seeded.vpc)
                .build(),
        )
        .send()
        .await?
        .internet_gateways()
        .first()
        .and_then(|g| g.internet_gateway_id())
        .unwrap_or_default()
        .to_string();
    seeded
        .ec2
        .create_route()
        .route_table_id(&rtb)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await?;
    // Tables the fix must not name: other VPCs' (moto's default VPC, as in
    // a fresh account) and the cluster VPC's main table, which the nodes'
    // subnet no longer uses.
    let elsewhere: Vec<String> = seeded
        .ec2
        .describe_route_tables()
        .send()
        .await?
        .route_tables()
        .iter()
        .filter(|t| t.route_table_id() != Some(rtb.as_str()))
        .filter_map(|t| t.route_table_id().map(str::to_string))
        .collect();
    assert!(!elsewhere.is_empty());
    broken_nodes(&env).await?;
    // IAM denies the node group's ingress writes (the DryRun says so).
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 403,
            code: "UnauthorizedOperation".into(),
            message: "You are not authorized to perform this operation.".into(),
        })
        .for_service("ec2")
        .for_action("AuthorizeSecurityGroupIngress")
        .dry_run_only()
        .with_param("GroupId", &seeded.node_group),
    ]);

    // As an operator runs it: the CCM's own kubeconfig may not read the
    // ServiceAccount doctor looks for the IRSA role on.
    let admin = admin_kubeconfig(&env)?;
    let (ok, stdout, stderr) = run_tool_as(&env, &admin, "doctor", &[], "").await?;
    assert!(!ok, "doctor passed a broken setup:\n{stdout}\n{stderr}");
    println!("{stdout}");
    let subnet = &seeded.subnet;
    let ng = &seeded.node_group;
    for line in [
        // Subnets: candidates and the exact tags.
        &format!(
            "[FAIL] us-east-1a internet-facing: no usable subnet; candidates: {subnet} (tagged for another cluster (kubernetes.io/cluster/other))"
        ),
        &format!(
            "fix: aws ec2 create-tags --resources {subnet} --tags Key=kubernetes.io/role/elb,Value=1 Key={CLUSTER_TAG},Value=shared"
        ),
        &format!(
            "fix: aws ec2 create-tags --resources {subnet} --tags Key=kubernetes.io/role/internal-elb,Value=1 Key={CLUSTER_TAG},Value=shared"
        ),
        // The route table.
        &format!("[FAIL] cluster route table: no route table carries {CLUSTER_TAG}"),
        &format!("Key={CLUSTER_TAG},Value=owned (or set RouteTableID in cloud.conf)"),
        // The Node without an instance.
        "[FAIL] every Node's instance, with the cluster tag: Node ghost: no instance i-00000000000000dead in us-east-1",
        "fix: the Node's providerID names no instance of this account and region: delete the Node (kubectl delete node ghost)",
        // IAM.
        &format!(
            "[FAIL] ec2:AuthorizeSecurityGroupIngress on {ng}: IAM denies ec2:AuthorizeSecurityGroupIngress"
        ),
        // Kubernetes.
        "[FAIL] uninitialized Nodes: Node waiting has carried node.cloudprovider.kubernetes.io/uninitialized for ",
        "[FAIL] kubelets with --cloud-provider=external: no providerID and no node.cloudprovider.kubernetes.io/uninitialized taint, so the CCM will never initialize them: in-tree",
        "[FAIL] leader Lease kube-system/cloud-controller-manager: no Lease",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    assert!(
        stdout.contains(&format!(
            "create-tags --resources {rtb} --tags Key={CLUSTER_TAG},Value=owned"
        )),
        "the fix names the table the nodes' subnet uses: {stdout}"
    );
    for other in &elsewhere {
        assert!(
            !stdout.contains(other.as_str()),
            "{other} named in:\n{stdout}"
        );
    }

    let (ok, json, _) = run_tool_as(&env, &admin, "doctor", &["-o", "json"], "").await?;
    assert!(!ok);
    let listed = checks(&json)?;
    let failed: Vec<(&str, &str)> = listed
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| {
            (
                c["section"].as_str().unwrap_or(""),
                c["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    for wanted in [
        ("subnets", "us-east-1a internet-facing"),
        ("subnets", "us-east-1a internal"),
        ("route-tables", "cluster route table"),
        ("instances", "every Node's instance, with the cluster tag"),
        ("kubernetes", "uninitialized Nodes"),
        ("kubernetes", "kubelets with --cloud-provider=external"),
    ] {
        assert!(
            failed.contains(&wanted),
            "{wanted:?} not failed: {failed:?}"
        );
    }
    for c in listed.iter().filter(|c| c["status"] == "fail") {
        assert!(
            c["fix"].as_str().is_some_and(|f| !f.is_empty()),
            "no fix: {c}"
        );
    }
    env.finish().await
}

/// With a kubeconfig whose user has no role, the RBAC check lists the
/// CCM's requests it is denied, and the Node list and Lease reads fail as
/// checks (with the permission to grant), not as an abort.
#[tokio::test]
async fn doctor_reports_rbac_the_kubeconfigs_user_lacks() -> anyhow::Result<()> {
    let env = Env::start().await?;
    correct_setup(&env).await?;
    env.api.add_token(
        "ccm-test-nobody",
        ccm_testkit::apiserver::TokenUser::new("nobody"),
    );
    let kubeconfig = env.dir.path().join("nobody.kubeconfig");
    std::fs::write(
        &kubeconfig,
        env.api.kubeconfig_yaml_with_token("ccm-test-nobody"),
    )?;
    let out = tokio::process::Command::new(crate::ops_orphans::TOOL)
        .arg("doctor")
        .arg(format!("--cloud-config={}", env.cloud_conf.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .envs(env.aws_env())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    for line in [
        "[FAIL] Nodes: listing Nodes: ",
        "fix: the kubeconfig's user needs list on nodes",
        "[FAIL] the CCM's RBAC (this kubeconfig's user): denied: get nodes; list nodes; watch nodes;",
        "update leases.coordination.k8s.io kube-system/cloud-controller-manager",
        "fix: kubectl apply -f manifests/base/rbac.yaml",
        "[FAIL] leader Lease kube-system/cloud-controller-manager: reading the Lease failed: ",
    ] {
        assert!(stdout.contains(line), "no {line:?} in:\n{stdout}");
    }
    env.finish().await
}
