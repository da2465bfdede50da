#!/usr/bin/env python3
"""Renders iam/policy.json for one cluster, with the options an operator's
setup needs. Called by iam/render.sh; see iam/README.md for each option.

  render.py CLUSTER_ID [--partition P] [--route-table rtb-...]...
            [--security-group sg-...]... [--legacy-cluster-tag]
            [--assume-role ROLE_ARN]... [--kops | --kops-additions]

--kops prints the policy's Statement array alone, for kOps'
iam.serviceAccountExternalPermissions[].aws.inlinePolicy (kOps parses a JSON
array of statements there, not a policy document). --kops-additions prints
the statements kOps' own CCM policy lacks, for spec.additionalPolicies
when kOps' addon runs this image (docs/install-kops.md, option 1).
"""

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTITIONS = ("aws", "aws-cn", "aws-us-gov", "aws-iso", "aws-iso-b", "aws-iso-e", "aws-iso-f", "aws-eusc")
ROUTE_ACTIONS = ["ec2:CreateRoute", "ec2:DeleteRoute", "ec2:ReplaceRoute"]
RULE_ACTIONS = ["ec2:AuthorizeSecurityGroupIngress", "ec2:RevokeSecurityGroupIngress"]
PROTECTED_TAG_KEYS = ["kubernetes.io/cluster/*", "KubernetesCluster"]
# kOps reads a statement into Effect, Principal, Action, Resource and
# Condition (pkg/model/iam/iam_builder.go, type Statement) and drops any
# other key without a word: Sid goes, NotAction/NotResource would change
# the meaning, so they must not reach it.
KOPS_STATEMENT_KEYS = ("Effect", "Principal", "Action", "Resource", "Condition")
LB_ACTIONS_KOPS_LACKS = ["elasticloadbalancing:SetIpAddressType", "elasticloadbalancing:SetSecurityGroups",
                         "elasticloadbalancing:SetSubnets"]


def arg_parser():
    p = argparse.ArgumentParser(prog="iam/render.sh policy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cluster_id")
    p.add_argument("--partition", default="aws", choices=PARTITIONS,
                   help="ARN partition: aws-cn for China, aws-us-gov for GovCloud")
    p.add_argument("--route-table", action="append", default=[], metavar="rtb-ID",
                   help="a route table the CCM may write although it lacks the cluster tag "
                        "(cloud.conf RouteTableID)")
    p.add_argument("--security-group", action="append", default=[], metavar="sg-ID",
                   help="a node security group the CCM may open for load balancers although "
                        "it lacks the cluster tag (kubeadm's usual untagged group)")
    p.add_argument("--legacy-cluster-tag", action="store_true",
                   help="also accept route tables, security groups and instances tagged only "
                        "KubernetesCluster=CLUSTER_ID")
    p.add_argument("--assume-role", action="append", default=[], metavar="ROLE_ARN",
                   help="cloud.conf RoleARN: allow sts:AssumeRole on it")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--kops", action="store_true",
                     help="print the Statement array alone, for kOps' inlinePolicy")
    out.add_argument("--kops-additions", action="store_true",
                     help="print the statements kOps' own CCM policy lacks, for kOps' additionalPolicies")
    return p


def check(value, pattern, what):
    if not re.fullmatch(pattern, value):
        sys.exit(f"iam/render.sh: {what} {value!r} is not valid (expected {pattern})")


def ec2_arn(partition, kind, ident="*"):
    return f"arn:{partition}:ec2:*:*:{kind}/{ident}"


def extra_statements(args):
    p = args.partition
    out = []
    if args.route_table:
        out.append({"Sid": "ConfiguredRouteTables", "Effect": "Allow", "Action": ROUTE_ACTIONS,
                    "Resource": [ec2_arn(p, "route-table", t) for t in args.route_table]})
    if args.security_group:
        out.append({"Sid": "ConfiguredNodeSecurityGroups", "Effect": "Allow", "Action": RULE_ACTIONS,
                    "Resource": [ec2_arn(p, "security-group", g) for g in args.security_group]})
    if args.legacy_cluster_tag:
        legacy = {"StringEquals": {"aws:ResourceTag/KubernetesCluster": args.cluster_id}}
        out += [
            {"Sid": "LegacyTaggedRoutes", "Effect": "Allow", "Action": ROUTE_ACTIONS,
             "Resource": ec2_arn(p, "route-table"), "Condition": legacy},
            {"Sid": "LegacyTaggedSecurityGroupRules", "Effect": "Allow", "Action": RULE_ACTIONS,
             "Resource": ec2_arn(p, "security-group"), "Condition": legacy},
            {"Sid": "LegacyTaggedInstanceSourceDestCheck", "Effect": "Allow",
             "Action": "ec2:ModifyInstanceAttribute", "Resource": ec2_arn(p, "instance"),
             "Condition": legacy},
            {"Sid": "LegacyTaggedInstanceTags", "Effect": "Allow",
             "Action": ["ec2:CreateTags", "ec2:DeleteTags"], "Resource": ec2_arn(p, "instance"),
             "Condition": {**legacy, "Null": {"aws:TagKeys": "false"},
                           "ForAllValues:StringNotLike": {"aws:TagKeys": PROTECTED_TAG_KEYS}}},
        ]
    if args.assume_role:
        out.append({"Sid": "AssumeConfiguredRole", "Effect": "Allow", "Action": "sts:AssumeRole",
                    "Resource": args.assume_role})
    return out


def kops_additions(args):
    """What this CCM calls that kOps' CCM policy does not grant. kOps builds
    that policy in AddCCMPermissions (pkg/model/iam/iam_builder.go; read at
    kOps commit 268927e, 2026-08-22; iam/kops-ccm-actions.txt lists it, and
    scripts/check-kops.sh checks that it plus these covers iam/policy.json).
    Load balancers are matched by the cluster tag this CCM writes on every
    one it creates; route tables by kOps' own KubernetesCluster tag, as kOps
    grants CreateRoute and DeleteRoute."""
    p, cid = args.partition, args.cluster_id
    elb = f"arn:{p}:elasticloadbalancing:*:*"
    return [
        {"Effect": "Allow", "Action": ["elasticloadbalancing:DescribeTags"], "Resource": "*"},
        # ELB authorizes the tags of a Create* as elasticloadbalancing:AddTags
        # on the new resource, which carries no tag yet: kOps' AddTags grant
        # (on aws:ResourceTag/KubernetesCluster) cannot match it. Tagged
        # creates need this, conditioned as kOps conditions the creates.
        {"Effect": "Allow", "Action": ["elasticloadbalancing:AddTags"],
         "Resource": [f"{elb}:listener/*", f"{elb}:loadbalancer/*", f"{elb}:targetgroup/*"],
         "Condition": {"StringEquals": {
             "elasticloadbalancing:CreateAction": ["CreateListener", "CreateLoadBalancer", "CreateTargetGroup"],
             "aws:RequestTag/KubernetesCluster": cid}}},
        {"Effect": "Allow", "Action": LB_ACTIONS_KOPS_LACKS,
         "Resource": f"arn:{p}:elasticloadbalancing:*:*:loadbalancer/*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cid}": "owned"}}},
        # Listener attributes (cloud.conf NLBListenerSettings = true), on the
        # listeners this CCM tags in CreateListener.
        {"Effect": "Allow", "Action": ["elasticloadbalancing:ModifyListenerAttributes"],
         "Resource": f"{elb}:listener/*",
         "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cid}": "owned"}}},
        # Tags that follow additional-resource-tags: a key this CCM applied
        # is removed when the annotation drops it; never a cluster tag.
        {"Effect": "Allow", "Action": ["elasticloadbalancing:RemoveTags"],
         "Resource": [f"{elb}:listener/*", f"{elb}:loadbalancer/*", f"{elb}:targetgroup/*"],
         "Condition": {"StringEquals": {f"aws:ResourceTag/kubernetes.io/cluster/{cid}": "owned"},
                       "ForAllValues:StringNotLike": {"aws:TagKeys": PROTECTED_TAG_KEYS}}},
        {"Effect": "Allow", "Action": ["ec2:ReplaceRoute"], "Resource": ec2_arn(p, "route-table"),
         "Condition": {"StringEquals": {"aws:ResourceTag/KubernetesCluster": cid}}},
    ]


def for_kops(statements):
    out = []
    for st in statements:
        extra = set(st) - set(KOPS_STATEMENT_KEYS) - {"Sid"}
        if extra:
            sys.exit(f"iam/render.sh: statement {st.get('Sid', st)} uses {sorted(extra)}, which kOps drops "
                     "when it parses inlinePolicy; rewrite it with Action/Resource")
        out.append({k: st[k] for k in KOPS_STATEMENT_KEYS if k in st})
    return out


def render(argv):
    args = arg_parser().parse_args(argv)
    check(args.cluster_id, r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", "cluster ID")
    for t in args.route_table:
        check(t, r"rtb-[0-9a-f]{8,17}", "route table")
    for g in args.security_group:
        check(g, r"sg-[0-9a-f]{8,17}", "security group")
    for r in args.assume_role:
        check(r, r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+", "role ARN")
    text = (HERE / "policy.json").read_text()
    text = text.replace("PARTITION", args.partition).replace("CLUSTER_ID", args.cluster_id)
    policy = json.loads(text)
    policy["Statement"] += extra_statements(args)
    if args.kops_additions:
        return json.dumps(kops_additions(args), indent=2) + "\n"
    if args.kops:
        return json.dumps(for_kops(policy["Statement"]), indent=2) + "\n"
    return json.dumps(policy, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1:]))
