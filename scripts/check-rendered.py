#!/usr/bin/env python3
"""Checks on rendered manifests (helm template / kubectl kustomize output)
that the Kubernetes schemas cannot make. Used by scripts/check-chart.sh,
scripts/check-manifests.sh and scripts/check-kops.sh.

  check-rendered.py identity FILE      the IRSA role ARN is written at most once
  check-rendered.py flags FILE         every CCM flag is one docs/flags.md names
  check-rendered.py servicemonitor FILE  ServiceMonitors use only fields of
                                       prometheus-operator's monitoring.coreos.com/v1
  check-rendered.py kops-names FILE    no object, ServiceAccount or Lease
                                       shares a name with kOps' own CCM addon
  check-rendered.py same-rbac FILE OTHER  FILE grants what OTHER grants: the
                                       same ClusterRole and Role rules
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
# kOps' aws-cloud-controller.addons.k8s.io addon (upup/models/cloudup/
# resources/addons/aws-cloud-controller.addons.k8s.io/k8s-1.18.yaml.template).
KOPS_OBJECTS = {
    ("DaemonSet", "aws-cloud-controller-manager"),
    ("ServiceAccount", "aws-cloud-controller-manager"),
    ("ClusterRole", "system:cloud-controller-manager"),
    ("ClusterRoleBinding", "system:cloud-controller-manager"),
    ("RoleBinding", "cloud-controller-manager:apiserver-authentication-reader"),
}
KOPS_LEASE = "cloud-controller-manager"
# prometheus-operator monitoring.coreos.com/v1 ServiceMonitor: the fields this
# repo may write (a subset of the CRD's; a typo is an unknown field).
SM_SPEC = {"endpoints", "selector", "namespaceSelector", "jobLabel", "targetLabels",
           "podTargetLabels", "sampleLimit", "scrapeProtocols", "attachMetadata"}
SM_ENDPOINT = {"port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
               "tlsConfig", "bearerTokenFile", "bearerTokenSecret", "authorization",
               "honorLabels", "honorTimestamps", "basicAuth", "oauth2", "metricRelabelings",
               "relabelings", "proxyUrl", "followRedirects", "enableHttp2", "filterRunning"}
SM_TLS = {"ca", "cert", "keySecret", "caFile", "certFile", "keyFile", "serverName",
          "insecureSkipVerify"}


def docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def strings(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)
    elif isinstance(node, str):
        yield node


def ccm_containers(objs):
    for o in objs:
        if o.get("kind") == "DaemonSet":
            for c in o["spec"]["template"]["spec"]["containers"]:
                if "--cloud-provider=aws" in c.get("args", []):
                    yield o, c


def check_identity(path):
    arns = [m for o in docs(path) for s in strings(o) for m in ROLE_ARN.findall(s)]
    if len(arns) > 1:
        return [f"the IAM role ARN is written {len(arns)} times ({', '.join(sorted(set(arns)))}); "
                "write it once: the ServiceAccount annotation for a pod identity webhook, "
                "or AWS_ROLE_ARN with a projected token, not both"]
    return []


def documented_flags():
    text = (ROOT / "docs" / "flags.md").read_text()
    names = set(re.findall(r"`(--[a-z0-9-]+)", text))
    # "`--node-cidr-mask-size`, `-ipv4`, `-ipv6`"
    for base, suffix in re.findall(r"`(--[a-z0-9-]+)`(?:, `(-[a-z0-9]+)`)+", text):
        names.add(base + suffix)
    for line in text.splitlines():
        m = re.match(r"\| `(--[a-z0-9-]+)`((?:, `-[a-z0-9]+`)+)", line)
        if m:
            for suffix in re.findall(r"`(-[a-z0-9]+)`", m.group(2)):
                names.add(m.group(1) + suffix)
    return names


def check_flags(path):
    known = documented_flags()
    errors = []
    found = False
    for o, c in ccm_containers(docs(path)):
        found = True
        for arg in c.get("args", []):
            flag = arg.split("=", 1)[0]
            if not flag.startswith("--") or flag not in known:
                errors.append(f"DaemonSet {o['metadata']['name']}: argument {arg!r} is not a flag "
                              "docs/flags.md lists; the CCM would refuse to start")
    if not found:
        errors.append("no DaemonSet container with --cloud-provider=aws")
    return errors


def unknown(where, have, allowed):
    extra = sorted(set(have) - allowed)
    return [f"{where}: unknown field(s) {', '.join(extra)}"] if extra else []


def check_servicemonitor(path):
    errors = []
    for o in docs(path):
        if o.get("kind") != "ServiceMonitor":
            continue
        name = o["metadata"]["name"]
        if o.get("apiVersion") != "monitoring.coreos.com/v1":
            errors.append(f"ServiceMonitor {name}: apiVersion must be monitoring.coreos.com/v1")
        spec = o.get("spec", {})
        errors += unknown(f"ServiceMonitor {name} spec", spec, SM_SPEC)
        if not spec.get("endpoints") or "selector" not in spec:
            errors.append(f"ServiceMonitor {name}: spec.endpoints and spec.selector are required")
        for i, ep in enumerate(spec.get("endpoints", [])):
            errors += unknown(f"ServiceMonitor {name} endpoints[{i}]", ep, SM_ENDPOINT)
            errors += unknown(f"ServiceMonitor {name} endpoints[{i}].tlsConfig", ep.get("tlsConfig", {}), SM_TLS)
            if ep.get("scheme") not in ("http", "https", None):
                errors.append(f"ServiceMonitor {name} endpoints[{i}]: scheme {ep.get('scheme')!r}")
    return errors


def check_kops_names(path):
    objs = docs(path)
    errors = [f"{o['kind']} {o['metadata']['name']} has the name of kOps' own CCM addon object; "
              "kOps re-applies its addon and the two overwrite each other"
              for o in objs if (o.get("kind"), o["metadata"].get("name")) in KOPS_OBJECTS]
    for o, c in ccm_containers(objs):
        lease = next((a.split("=", 1)[1] for a in c["args"] if a.startswith("--leader-elect-resource-name=")),
                     "cloud-controller-manager")
        if lease == KOPS_LEASE:
            errors.append(f"DaemonSet {o['metadata']['name']} uses the Lease {lease}, which kOps' CCM holds; "
                          "set --leader-elect-resource-name to another name")
    return errors


def rules(path):
    out = {}
    for o in docs(path):
        if o.get("kind") in ("ClusterRole", "Role"):
            out.setdefault(o["kind"], []).extend(
                sorted(json.dumps(r, sort_keys=True) for r in o.get("rules", [])))
    return {k: sorted(v) for k, v in out.items()}


def check_same_rbac(path, other):
    a, b = rules(path), rules(other)
    if a != b:
        return [f"the RBAC rules differ from {other}: {a} vs {b}; the chart and manifests/base must grant the same"]
    return []


CHECKS = {"identity": check_identity, "flags": check_flags,
          "servicemonitor": check_servicemonitor, "kops-names": check_kops_names,
          "same-rbac": check_same_rbac}

if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] not in CHECKS:
        sys.exit(__doc__)
    errs = CHECKS[sys.argv[1]](*sys.argv[2:])
    for e in errs:
        print(f"check-rendered {sys.argv[1]} {sys.argv[2]}: {e}", file=sys.stderr)
    sys.exit(1 if errs else 0)
