//! What AWS authorizes for one recorded API request: one (IAM action,
//! resource ARN, request context) per resource the request involves, from
//! the Service Authorization Reference table in `iam/authorization.json`.
//!
//! The rules, as AWS documents them:
//! - every resource type of the action that the request names (and every
//!   required one) is authorized separately; an action with no resource
//!   type is authorized against `*`;
//! - the request context of a resource holds only the condition keys the
//!   reference lists for that resource type's row and the action's own
//!   row; any other key is absent;
//! - `aws:ResourceTag/…` (and the service's `…:ResourceTag/…`) are the
//!   tags the resource had when the request arrived; a resource the
//!   request creates has none;
//! - tags sent with a create request also need the tagging action on the
//!   new resource, with `ec2:CreateAction`/`elasticloadbalancing:CreateAction`
//!   naming the create action (tag-on-create);
//! - the first load balancer of an account makes ELB create its
//!   service-linked role, which needs `iam:CreateServiceLinkedRole`; the
//!   oracle assumes it is always the first.
//!
//! A request this module cannot map (a required resource type with no
//! parameter naming it) is an error, never a pass.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::policy::Context;

/// One API request as the fault proxy recorded it (`AWS_CCM_RECORD_ACTIONS`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The proxy's service name: `ec2`, `elasticloadbalancing` (Classic),
    /// `elasticloadbalancingv2`, `sts`.
    pub service: String,
    pub action: String,
    /// The region of the SigV4 credential scope.
    #[serde(default)]
    pub region: String,
    /// Every form parameter but `Action` and `Version`.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Tags of the existing resources the request names (by ID, name or
    /// ARN), read just before the request was forwarded.
    #[serde(default)]
    pub tags: BTreeMap<String, BTreeMap<String, String>>,
    /// `iam/render.sh` options the test's setup needs (e.g. `--legacy-cluster-tag`).
    #[serde(default)]
    pub policy_options: Vec<String>,
}

impl RecordedRequest {
    pub fn is_dry_run(&self) -> bool {
        self.params
            .get("DryRun")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// Values of `Prefix.1`, `Prefix.2`, … (or `Prefix.member.N`), in order.
    fn list(&self, prefix: &str) -> Vec<String> {
        let mut found: Vec<(u32, String)> = self
            .params
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(prefix)?.strip_prefix('.')?;
                let rest = rest.strip_prefix("member.").unwrap_or(rest);
                Some((rest.parse::<u32>().ok()?, v.clone()))
            })
            .collect();
        found.sort();
        found.into_iter().map(|(_, v)| v).collect()
    }

    /// `Prefix.N.Key`/`Prefix.N.Value` pairs (`Prefix.member.N.…` too).
    fn tag_list(&self, prefix: &str) -> Vec<(String, Option<String>)> {
        let mut by_index: BTreeMap<u32, (Option<String>, Option<String>)> = BTreeMap::new();
        for (k, v) in &self.params {
            let Some(rest) = k.strip_prefix(prefix).and_then(|r| r.strip_prefix('.')) else {
                continue;
            };
            let rest = rest.strip_prefix("member.").unwrap_or(rest);
            let Some((index, field)) = rest.split_once('.') else {
                continue;
            };
            let Ok(index) = index.parse::<u32>() else {
                continue;
            };
            let entry = by_index.entry(index).or_default();
            match field {
                "Key" => entry.0 = Some(v.clone()),
                "Value" => entry.1 = Some(v.clone()),
                _ => {}
            }
        }
        by_index
            .into_values()
            .filter_map(|(k, v)| Some((k?, v)))
            .collect()
    }

    /// Tags of a `TagSpecification.N` for `resource_type`.
    fn tag_specification(&self, resource_type: &str) -> Vec<(String, Option<String>)> {
        let mut out = Vec::new();
        for n in 1..=50 {
            let prefix = format!("TagSpecification.{n}");
            match self.params.get(&format!("{prefix}.ResourceType")) {
                Some(t) if t == resource_type => {
                    out.extend(self.tag_list(&format!("{prefix}.Tag")))
                }
                Some(_) => {}
                None => break,
            }
        }
        out
    }
}

/// One authorization AWS makes for a request.
#[derive(Clone, Debug)]
pub struct Authorization {
    /// `prefix:Action` as IAM names it.
    pub action: String,
    /// The resource ARN, or `*`.
    pub resource: String,
    pub context: Context,
    /// What this authorization is for, for failure messages.
    pub what: String,
}

#[derive(Debug, Deserialize)]
struct Row {
    required: bool,
    condition_keys: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct ActionDef {
    iam_action: String,
    resource_types: BTreeMap<String, Row>,
}

/// `iam/authorization.json`.
#[derive(Debug, Deserialize)]
pub struct AuthorizationTable {
    actions: BTreeMap<String, ActionDef>,
    resources: BTreeMap<String, String>,
}

/// A resource a request names or creates.
#[derive(Clone, Debug)]
struct Involved {
    /// The reference's resource type (`security-group`, `loadbalancer/net/`, …).
    kind: String,
    /// The ID, name or full ARN the request uses for it.
    id: String,
    created: bool,
}

/// Tags a request sets (key, value) or removes (key only).
#[derive(Clone, Debug, Default)]
struct Tagging {
    tags: Vec<(String, Option<String>)>,
}

impl Tagging {
    fn keys(&self) -> Vec<String> {
        self.tags.iter().map(|(k, _)| k.clone()).collect()
    }
}

pub const ELB_SERVICE_LINKED_ROLE: &str = "role/aws-service-role/elasticloadbalancing.amazonaws.com/AWSServiceRoleForElasticLoadBalancing";

impl AuthorizationTable {
    pub fn parse(text: &str) -> Result<AuthorizationTable, String> {
        serde_json::from_str(text).map_err(|e| format!("iam/authorization.json: {e}"))
    }

    /// The IAM action names of every operation in the table.
    pub fn iam_action(&self, request: &RecordedRequest) -> Option<&str> {
        let api = api_of(&request.service)?;
        self.actions
            .get(&format!("{api}:{}", request.action))
            .map(|a| a.iam_action.as_str())
    }

    /// Everything AWS authorizes for `request`, in `account` and `partition`.
    pub fn authorizations(
        &self,
        request: &RecordedRequest,
        account: &str,
        partition: &str,
    ) -> Result<Vec<Authorization>, String> {
        let api = api_of(&request.service).ok_or(format!("unknown service {}", request.service))?;
        let key = format!("{api}:{}", request.action);
        let def = self.actions.get(&key).ok_or(format!(
            "{key} is not in iam/authorization.json: run iam/gen-authorization.py"
        ))?;
        let (involved, tagging) = involved(api, request)?;
        let region = if request.region.is_empty() {
            "us-east-1"
        } else {
            &request.region
        };
        let arn = |r: &Involved| self.arn(iam_prefix(api), r, partition, region, account);
        let mut out = Vec::new();
        for (kind, row) in &def.resource_types {
            if kind.is_empty() {
                continue;
            }
            let named: Vec<&Involved> = involved.iter().filter(|r| &r.kind == kind).collect();
            // The reference marks each of ELBv2's alternatives (listener/app,
            // listener/net, …) required: one of the family is.
            let family = |k: &str| k.split('/').next().unwrap_or(k).to_string();
            let family_named = involved.iter().any(|r| family(&r.kind) == family(kind));
            if row.required && named.is_empty() && !family_named {
                return Err(format!(
                    "{key}: AWS authorizes it against a {kind}, and no parameter names one"
                ));
            }
            for r in named {
                let context = self.context(def, kind, r, request, &tagging, None);
                out.push(Authorization {
                    action: def.iam_action.clone(),
                    resource: arn(r)?,
                    context,
                    what: format!("{key} on {kind} {}", r.id),
                });
            }
        }
        // A resource the request creates but the action is not authorized
        // against (a new listener) is authorized only for its tags, below.
        if let Some(stray) = involved
            .iter()
            .find(|r| !r.created && !def.resource_types.contains_key(&r.kind))
        {
            return Err(format!(
                "{key}: the reference has no {} row; the mapping is wrong",
                stray.kind
            ));
        }
        if out.is_empty() {
            let context = self.context(
                def,
                "",
                &Involved {
                    kind: String::new(),
                    id: "*".into(),
                    created: false,
                },
                request,
                &tagging,
                None,
            );
            out.push(Authorization {
                action: def.iam_action.clone(),
                resource: "*".into(),
                context,
                what: format!("{key} on *"),
            });
        }
        out.extend(self.tag_on_create(
            api, request, &involved, &tagging, account, partition, region,
        )?);
        if api != "ec2" && request.action == "CreateLoadBalancer" {
            let mut context = Context::default();
            context.set("iam:AWSServiceName", "elasticloadbalancing.amazonaws.com");
            out.push(Authorization {
                action: "iam:CreateServiceLinkedRole".into(),
                resource: format!("arn:{partition}:iam::{account}:{ELB_SERVICE_LINKED_ROLE}"),
                context,
                what: format!("{key}: ELB's service-linked role"),
            });
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn tag_on_create(
        &self,
        api: &str,
        request: &RecordedRequest,
        involved: &[Involved],
        tagging: &Tagging,
        account: &str,
        partition: &str,
        region: &str,
    ) -> Result<Vec<Authorization>, String> {
        if tagging.tags.is_empty()
            || !request.action.starts_with("Create")
            || request.action == "CreateTags"
        {
            return Ok(Vec::new());
        }
        let (tag_key, create_key) = match api {
            "ec2" => ("ec2:CreateTags", "ec2:CreateAction"),
            _ => (
                if api == "elb" {
                    "elb:AddTags"
                } else {
                    "elbv2:AddTags"
                },
                "elasticloadbalancing:CreateAction",
            ),
        };
        let def = self
            .actions
            .get(tag_key)
            .ok_or(format!("{tag_key} missing from the table"))?;
        let mut out = Vec::new();
        for r in involved.iter().filter(|r| r.created) {
            if !def.resource_types.contains_key(&r.kind) {
                return Err(format!("{tag_key} has no {} row for tag-on-create", r.kind));
            }
            let context = self.context(
                def,
                &r.kind,
                r,
                request,
                tagging,
                Some((create_key, &request.action)),
            );
            out.push(Authorization {
                action: def.iam_action.clone(),
                resource: self.arn(iam_prefix(api), r, partition, region, account)?,
                context,
                what: format!("{} tag-on-create of {} {}", request.action, r.kind, r.id),
            });
        }
        Ok(out)
    }

    fn context(
        &self,
        def: &ActionDef,
        kind: &str,
        resource: &Involved,
        request: &RecordedRequest,
        tagging: &Tagging,
        create_action: Option<(&str, &str)>,
    ) -> Context {
        let keys: BTreeSet<&str> = [kind, ""]
            .iter()
            .filter_map(|k| def.resource_types.get(*k))
            .flat_map(|row| row.condition_keys.iter().map(String::as_str))
            .collect();
        let mut context = Context::default();
        for key in keys {
            if let Some(prefix) = key.strip_suffix("ResourceTag/${TagKey}") {
                if resource.created {
                    continue;
                }
                for (k, v) in request.tags.get(&resource.id).into_iter().flatten() {
                    context.set(&format!("{prefix}ResourceTag/{k}"), v.clone());
                }
            } else if key == "aws:RequestTag/${TagKey}" {
                for (k, v) in &tagging.tags {
                    if let Some(v) = v {
                        context.set(&format!("aws:RequestTag/{k}"), v.clone());
                    }
                }
            } else if key == "aws:TagKeys" {
                if !tagging.tags.is_empty() {
                    context.set_many("aws:TagKeys", tagging.keys());
                }
            } else if key == "ec2:Region" {
                context.set(
                    key,
                    if request.region.is_empty() {
                        "us-east-1"
                    } else {
                        &request.region
                    },
                );
            } else if let Some((create_key, action)) = create_action
                && key == create_key
            {
                context.set(key, action);
            }
        }
        context
    }

    fn arn(
        &self,
        prefix: &str,
        r: &Involved,
        partition: &str,
        region: &str,
        account: &str,
    ) -> Result<String, String> {
        if r.id.starts_with("arn:") {
            return Ok(r.id.clone());
        }
        let format = self
            .resources
            .get(&format!("{prefix}:{}", r.kind))
            .ok_or(format!("no ARN format for {prefix}:{}", r.kind))?;
        let mut arn = format
            .replace("${Partition}", partition)
            .replace("${Region}", region)
            .replace("${Account}", account);
        // The remaining placeholders take the ID's '/'-separated parts.
        let mut parts = r.id.split('/');
        while let Some(start) = arn.find("${") {
            let end = arn[start..]
                .find('}')
                .map(|e| start + e + 1)
                .unwrap_or(arn.len());
            let part = parts.next().unwrap_or("new");
            arn.replace_range(start..end, part);
        }
        Ok(arn)
    }
}

fn api_of(service: &str) -> Option<&'static str> {
    Some(match service {
        "ec2" => "ec2",
        "elb" | "elasticloadbalancing" => "elb",
        "elbv2" | "elasticloadbalancingv2" => "elbv2",
        "sts" => "sts",
        "iam" => "iam",
        _ => return None,
    })
}

fn iam_prefix(api: &str) -> &'static str {
    match api {
        "ec2" => "ec2",
        "sts" | "iam" => "iam",
        _ => "elasticloadbalancing",
    }
}

/// The reference's EC2 resource type of an ID, by its prefix.
fn ec2_kind(id: &str) -> Option<&'static str> {
    let prefix = id.split_once('-')?.0;
    Some(match prefix {
        "i" => "instance",
        "sg" => "security-group",
        "rtb" => "route-table",
        "vpc" => "vpc",
        "subnet" => "subnet",
        "eni" => "network-interface",
        "igw" => "internet-gateway",
        _ => return None,
    })
}

/// The reference's ELBv2 resource type of an ARN.
fn elbv2_kind(arn: &str) -> Option<&'static str> {
    let resource = arn.split(':').nth(5)?;
    Some(if resource.starts_with("loadbalancer/net/") {
        "loadbalancer/net/"
    } else if resource.starts_with("loadbalancer/app/") {
        "loadbalancer/app/"
    } else if resource.starts_with("listener/net/") {
        "listener/net"
    } else if resource.starts_with("listener/app/") {
        "listener/app"
    } else if resource.starts_with("targetgroup/") {
        "targetgroup"
    } else {
        return None;
    })
}

fn existing(kind: &str, id: &str) -> Involved {
    Involved {
        kind: kind.into(),
        id: id.into(),
        created: false,
    }
}

fn created(kind: &str, id: &str) -> Involved {
    Involved {
        kind: kind.into(),
        id: id.into(),
        created: true,
    }
}

fn param<'a>(r: &'a RecordedRequest, name: &str) -> Result<&'a str, String> {
    r.params
        .get(name)
        .map(String::as_str)
        .ok_or(format!("{}: no {name} parameter", r.action))
}

/// The resources a request involves and the tags it sets or removes.
fn involved(api: &str, r: &RecordedRequest) -> Result<(Vec<Involved>, Tagging), String> {
    let action = r.action.as_str();
    if ["Describe", "Get", "List"]
        .iter()
        .any(|p| action.starts_with(p))
    {
        return Ok((Vec::new(), Tagging::default()));
    }
    match api {
        "ec2" => ec2_involved(r),
        "elb" => elb_involved(r),
        "elbv2" => elbv2_involved(r),
        "sts" => Ok((
            vec![existing("role", param(r, "RoleArn")?)],
            Tagging::default(),
        )),
        // `aws-ccm doctor`'s policy simulation, authorized against the
        // simulated principal (a user, group or role).
        "iam" if action == "SimulatePrincipalPolicy" => {
            let arn = param(r, "PolicySourceArn")?;
            let kind = arn
                .split(':')
                .nth(5)
                .and_then(|rest| rest.split('/').next())
                .filter(|k| ["user", "group", "role"].contains(k))
                .ok_or(format!(
                    "PolicySourceArn {arn} names no user, group or role"
                ))?;
            Ok((vec![existing(kind, arn)], Tagging::default()))
        }
        _ => Err(format!("unknown api {api}")),
    }
}

fn ec2_involved(r: &RecordedRequest) -> Result<(Vec<Involved>, Tagging), String> {
    let mut tagging = Tagging::default();
    let resources = match r.action.as_str() {
        "CreateSecurityGroup" => {
            tagging.tags = r.tag_specification("security-group");
            vec![
                created("security-group", "sg-new"),
                existing("vpc", param(r, "VpcId")?),
            ]
        }
        "DeleteSecurityGroup"
        | "AuthorizeSecurityGroupIngress"
        | "RevokeSecurityGroupIngress"
        | "AuthorizeSecurityGroupEgress"
        | "RevokeSecurityGroupEgress" => vec![existing("security-group", param(r, "GroupId")?)],
        "CreateRoute" | "ReplaceRoute" | "DeleteRoute" => {
            vec![existing("route-table", param(r, "RouteTableId")?)]
        }
        "ModifyInstanceAttribute" => {
            let mut out = vec![existing("instance", param(r, "InstanceId")?)];
            out.extend(
                r.list("GroupId")
                    .iter()
                    .map(|g| existing("security-group", g)),
            );
            out
        }
        "CreateTags" | "DeleteTags" => {
            tagging.tags = r.tag_list("Tag");
            r.list("ResourceId")
                .iter()
                .map(|id| {
                    ec2_kind(id)
                        .map(|kind| existing(kind, id))
                        .ok_or(format!("{}: unknown resource ID {id}", r.action))
                })
                .collect::<Result<_, _>>()?
        }
        other => {
            return Err(format!(
                "ec2:{other}: the oracle does not know which resources it names; teach crates/ccm-testkit/src/iam/requests.rs"
            ));
        }
    };
    Ok((resources, tagging))
}

fn elb_involved(r: &RecordedRequest) -> Result<(Vec<Involved>, Tagging), String> {
    let mut tagging = Tagging::default();
    let mut names = r.list("LoadBalancerNames");
    if let Some(name) = r.params.get("LoadBalancerName") {
        names.push(name.clone());
    }
    if names.is_empty() {
        return Err(format!("elb:{}: no load balancer name", r.action));
    }
    match r.action.as_str() {
        "CreateLoadBalancer" => {
            tagging.tags = r.tag_list("Tags");
            return Ok((
                names.iter().map(|n| created("loadbalancer", n)).collect(),
                tagging,
            ));
        }
        "AddTags" | "RemoveTags" => tagging.tags = r.tag_list("Tags"),
        _ => {}
    }
    Ok((
        names.iter().map(|n| existing("loadbalancer", n)).collect(),
        tagging,
    ))
}

fn elbv2_involved(r: &RecordedRequest) -> Result<(Vec<Involved>, Tagging), String> {
    let mut tagging = Tagging::default();
    let by_arn = |arn: &str| {
        elbv2_kind(arn)
            .map(|kind| existing(kind, arn))
            .ok_or(format!("elbv2:{}: unknown ARN {arn}", r.action))
    };
    let resources = match r.action.as_str() {
        "CreateLoadBalancer" => {
            tagging.tags = r.tag_list("Tags");
            let kind = match r.params.get("Type").map(String::as_str) {
                Some("network") => "loadbalancer/net/",
                Some("gateway") => "loadbalancer/gwy/",
                _ => "loadbalancer/app/",
            };
            vec![created(kind, &format!("{}/new", param(r, "Name")?))]
        }
        "CreateTargetGroup" => {
            tagging.tags = r.tag_list("Tags");
            vec![created(
                "targetgroup",
                &format!("{}/new", param(r, "Name")?),
            )]
        }
        "CreateListener" => {
            tagging.tags = r.tag_list("Tags");
            let lb = by_arn(param(r, "LoadBalancerArn")?)?;
            let listener_kind = if lb.kind == "loadbalancer/net/" {
                "listener/net"
            } else {
                "listener/app"
            };
            let lb_path = lb.id.split(":loadbalancer/").nth(1).unwrap_or("x/name/id");
            let lb_path = lb_path
                .split_once('/')
                .map(|(_, rest)| rest)
                .unwrap_or(lb_path)
                .to_string();
            let listener = created(listener_kind, &format!("{lb_path}/new"));
            vec![lb, listener]
        }
        "ModifyListener" | "ModifyListenerAttributes" | "DeleteListener" => {
            vec![by_arn(param(r, "ListenerArn")?)?]
        }
        "RegisterTargets"
        | "DeregisterTargets"
        | "ModifyTargetGroup"
        | "ModifyTargetGroupAttributes"
        | "DeleteTargetGroup" => vec![by_arn(param(r, "TargetGroupArn")?)?],
        "DeleteLoadBalancer"
        | "ModifyLoadBalancerAttributes"
        | "SetSubnets"
        | "SetSecurityGroups"
        | "SetIpAddressType" => vec![by_arn(param(r, "LoadBalancerArn")?)?],
        "AddTags" | "RemoveTags" => {
            tagging.tags = r.tag_list("Tags");
            if r.action == "RemoveTags" {
                tagging.tags = r.list("TagKeys").into_iter().map(|k| (k, None)).collect();
            }
            r.list("ResourceArns")
                .iter()
                .map(|a| by_arn(a))
                .collect::<Result<_, _>>()?
        }
        other => {
            return Err(format!(
                "elbv2:{other}: the oracle does not know which resources it names; teach crates/ccm-testkit/src/iam/requests.rs"
            ));
        }
    };
    Ok((resources, tagging))
}
