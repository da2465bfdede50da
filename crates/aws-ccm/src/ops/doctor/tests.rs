use std::collections::{BTreeMap, BTreeSet, HashMap};

use ccm_testkit::apiserver::rbac::{Attributes, RbacPolicy};

use super::Status;
use super::cloud::ZoneSubnets;
use super::identity::credential_source;
use super::kube::{CCM_NEEDS, attributes};
use crate::aws::subnets::Subnet;

fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    move |k| {
        vars.iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
    }
}

#[test]
fn credentials_are_described_in_the_chains_order() {
    let irsa = [
        ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/token"),
        ("AWS_ROLE_ARN", "arn:aws:iam::1:role/ccm"),
    ];
    assert!(
        credential_source(env(&irsa), None)
            .starts_with("IRSA web identity: role arn:aws:iam::1:role/ccm")
    );
    let keys = [("AWS_ACCESS_KEY_ID", "AKIA"), irsa[0], irsa[1]];
    assert!(credential_source(env(&keys), None).starts_with("environment variables"));
    assert!(credential_source(env(&[("AWS_PROFILE", "ops")]), None).contains("profile ops"));
    assert!(credential_source(env(&[]), None).contains("instance profile"));
    let assumed = credential_source(env(&irsa), Some("arn:aws:iam::2:role/x"));
    assert!(
        assumed.starts_with("role arn:aws:iam::2:role/x (cloud.conf RoleARN), assumed with IRSA")
    );
}

fn subnet(id: &str, public: bool, tags: &[(&str, &str)]) -> Subnet {
    Subnet {
        id: id.into(),
        availability_zone: "us-east-1a".into(),
        tags: tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        public,
        cidr: None,
    }
}

#[test]
fn a_chosen_subnet_names_its_tags_and_an_untagged_one_warns() {
    let tagged = subnet(
        "subnet-a",
        true,
        &[
            ("kubernetes.io/role/elb", "1"),
            ("kubernetes.io/cluster/c1", "shared"),
        ],
    );
    let plain = subnet("subnet-b", true, &[]);
    let all = [tagged.clone(), plain.clone()];
    let z = ZoneSubnets {
        all: &all,
        zone: "us-east-1a",
        internal: false,
        cluster_id: "c1",
    };
    let ok = z.usable(&tagged, false);
    assert_eq!(ok.status, Status::Pass);
    assert!(
        ok.detail
            .contains("kubernetes.io/role/elb=1, kubernetes.io/cluster/c1=shared"),
        "{ok:?}"
    );
    let warned = z.usable(&plain, false);
    assert_eq!(warned.status, Status::Warn);
    assert!(warned.fix.unwrap_or_default().contains(
        "tag subnet-b with kubernetes.io/role/elb=1 and kubernetes.io/cluster/c1=shared"
    ));
}

#[test]
fn no_usable_subnet_lists_candidates_and_the_tags_to_add() {
    let other = subnet(
        "subnet-o",
        true,
        &[("kubernetes.io/cluster/other", "owned")],
    );
    let private = subnet("subnet-p", false, &[]);
    let all = [other, private];
    let z = ZoneSubnets {
        all: &all,
        zone: "us-east-1a",
        internal: false,
        cluster_id: "c1",
    };
    let c = z.unusable("vpc-1", &HashMap::new());
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail
            .contains("subnet-o (tagged for another cluster (kubernetes.io/cluster/other))"),
        "{c:?}"
    );
    assert!(
        c.detail
            .contains("subnet-p (private: no route to an internet gateway)"),
        "{c:?}"
    );
    assert_eq!(
        c.fix.as_deref(),
        Some(
            "aws ec2 create-tags --resources subnet-o --tags Key=kubernetes.io/role/elb,Value=1 Key=kubernetes.io/cluster/c1,Value=shared"
        )
    );
    let internal = ZoneSubnets {
        internal: true,
        ..z
    };
    let c = internal.unusable("vpc-1", &HashMap::new());
    assert!(
        c.fix
            .unwrap_or_default()
            .contains("Key=kubernetes.io/role/internal-elb,Value=1")
    );
}

/// CCM_NEEDS and manifests/base/rbac.yaml agree both ways: every need is
/// granted to the CCM's service account, every manifest rule is a need.
#[test]
fn the_rbac_needs_are_the_manifests_rules() {
    let path = ccm_testkit::repo_path("manifests/base/rbac.yaml");
    let text = std::fs::read_to_string(&path).expect("manifests/base/rbac.yaml");
    let policy = RbacPolicy::parse(&text).expect("the manifest parses");
    let user = "system:serviceaccount:kube-system:cloud-controller-manager";
    let groups = vec![
        "system:serviceaccounts".to_string(),
        "system:authenticated".to_string(),
    ];
    let (opts, _) = crate::options::Options::parse_args(["aws-cloud-controller-manager"])
        .expect("default options");
    for need in CCM_NEEDS {
        let a = attributes(need, &opts);
        let attrs = Attributes {
            verb: a.verb.clone().unwrap_or_default(),
            group: a.group.clone().unwrap_or_default(),
            resource: a.resource.clone().unwrap_or_default(),
            subresource: a.subresource.clone().unwrap_or_default(),
            namespace: a.namespace.clone().unwrap_or_default(),
            name: a.name.clone().unwrap_or_default(),
            path: None,
        };
        assert!(
            !policy.granting_rules(user, &groups, &attrs).is_empty(),
            "{need:?} is not granted"
        );
    }
    let needed: BTreeSet<(String, String, String)> = CCM_NEEDS
        .iter()
        .map(|need| {
            let a = attributes(need, &opts);
            let (resource, group) = (a.resource.unwrap_or_default(), a.group.unwrap_or_default());
            let r = match a.subresource {
                None => resource,
                Some(sub) => format!("{resource}/{sub}"),
            };
            (a.verb.unwrap_or_default(), group, r)
        })
        .collect();
    for role in policy.roles_bound_by_manifest(user, &groups) {
        for rule in &role.rules {
            for verb in &rule.verbs {
                for group in &rule.api_groups {
                    for resource in &rule.resources {
                        let key = (verb.clone(), group.clone(), resource.clone());
                        let listed =
                            needed.contains(&key) || (verb != "get" && resource == "configmaps");
                        assert!(listed, "{} grants {key:?}, which CCM_NEEDS lacks", role.id);
                    }
                }
            }
        }
    }
}
