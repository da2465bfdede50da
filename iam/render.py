#!/usr/bin/env python3
"""Renders iam/policy.json for one cluster, with the options an operator's
setup needs. Called by iam/render.sh; see iam/README.md for each option.

  render.py CLUSTER_ID [--partition P] [--route-table rtb-...]...
            [--security-group sg-...]... [--legacy-cluster-tag]
            [--assume-role ROLE_ARN]...
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
    return json.dumps(policy, indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1:]))
