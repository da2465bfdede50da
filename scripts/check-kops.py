#!/usr/bin/env python3
"""The kOps artifacts, offline (scripts/check-kops.sh runs this):

- manifests/overlays/kops/cluster-spec-option*.yaml use only fields of kOps'
  kops.k8s.io/v1alpha2 Cluster (scripts/kops-v1alpha2-fields.json, made from
  kOps' Go types by scripts/gen-kops-fields.py);
- their additionalPolicies and inlinePolicy pass kOps' own parsing
  (a JSON array of statements; kOps keeps only Effect, Principal, Action,
  Resource, Condition; Effect Allow or Deny; additionalPolicies keys are
  instance group roles) and are exactly what iam/render.sh prints;
- kOps' own CCM actions (iam/kops-ccm-actions.txt) plus the additions cover
  every action of iam/policy.json; iam/kops-ccm-policy.json (kOps' policy as
  a document, which crates/aws-ccm/tests/ccm/kops.rs enforces) grants
  exactly those actions;
- addon.yaml is a kOps Addons index pointing at the overlay's manifest;
- option 2's ServiceAccount, role ARN and cluster name agree across the
  cluster spec, the kustomize overlay and the Helm chart's kOps example.

  check-kops.py KUSTOMIZE_OUTPUT HELM_KOPS_OUTPUT
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
KOPS = ROOT / "manifests" / "overlays" / "kops"
FIELDS = json.loads((ROOT / "scripts" / "kops-v1alpha2-fields.json").read_text())["types"]
OBJECT_META = {"name", "namespace", "labels", "annotations"}
# kops.AllInstanceGroupRoles, lower-cased (pkg/apis/kops/validation), and
# "master", which v1alpha2 converts to control-plane.
IG_ROLES = {"control-plane", "apiserver", "node", "bastion", "master"}
STATEMENT_KEYS = {"Effect", "Principal", "Action", "Resource", "Condition"}
ADDON_KEYS = {"name", "namespace", "selector", "manifest", "manifestHash", "kubernetesVersion", "id",
              "needsRollingUpdate", "needsPKI", "version", "prune"}
errors = []


def err(msg):
    errors.append(msg)


def walk(value, typename, path):
    fields = FIELDS.get(typename)
    if fields is None:
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            walk(v, typename, f"{path}[{i}]")
        return
    if not isinstance(value, dict):
        err(f"{path}: expected an object ({typename})")
        return
    for k, v in value.items():
        if k not in fields:
            near = [f for f in fields if f.lower() == k.lower() or k.lower() in f.lower()]
            err(f"{path}.{k}: kOps' v1alpha2 {typename} has no field {k!r}"
                + (f" (did you mean {', '.join(near)}?)" if near else ""))
        elif fields[k]:
            walk(v, fields[k], f"{path}.{k}")


def render(*args):
    return json.loads(subprocess.run([str(ROOT / "iam" / "render.sh"), "policy", *args],
                                     check=True, capture_output=True, text=True).stdout)


def statements(text, where):
    try:
        sts = json.loads(text)
    except json.JSONDecodeError as e:
        err(f"{where}: not JSON ({e}); kOps fails `kops update cluster` on it")
        return []
    if not isinstance(sts, list):
        err(f"{where}: a JSON {type(sts).__name__}, but kOps parses a JSON array of statements "
            "(render it with iam/render.sh policy CLUSTER --kops)")
        return []
    for i, st in enumerate(sts):
        extra = set(st) - STATEMENT_KEYS
        if extra:
            err(f"{where}[{i}]: {sorted(extra)} would be dropped by kOps (it keeps {sorted(STATEMENT_KEYS)})")
        if st.get("Effect") not in ("Allow", "Deny"):
            err(f"{where}[{i}]: Effect must be Allow or Deny")
        if not st.get("Action") or "Resource" not in st:
            err(f"{where}[{i}]: Action and Resource are required")
    return sts


def actions(sts):
    out = set()
    for st in sts:
        a = st.get("Action", [])
        out |= {a} if isinstance(a, str) else set(a)
    return out


def spec_of(name):
    path = KOPS / name
    doc = yaml.safe_load(path.read_text())
    if doc.get("apiVersion") != "kops.k8s.io/v1alpha2" or doc.get("kind") != "Cluster":
        err(f"{path.name}: must be apiVersion kops.k8s.io/v1alpha2, kind Cluster")
    for k in doc.get("metadata", {}):
        if k not in OBJECT_META:
            err(f"{path.name}: metadata.{k} is not an ObjectMeta field this file should set")
    walk(doc.get("spec", {}), "ClusterSpec", f"{path.name}: spec")
    return doc


def main(kustomized, helm_kops):
    opt1 = spec_of("cluster-spec-option1.yaml")
    opt2 = spec_of("cluster-spec-option2.yaml")
    cluster = opt1["metadata"]["name"]
    if opt2["metadata"]["name"] != cluster:
        err("the two cluster-spec fragments name different clusters")

    # Option 1: additionalPolicies.
    policies = opt1["spec"].get("additionalPolicies", {})
    if not policies:
        err("cluster-spec-option1.yaml: no additionalPolicies")
    for role, text in policies.items():
        where = f"cluster-spec-option1.yaml: spec.additionalPolicies.{role}"
        if role not in IG_ROLES:
            err(f"{where}: kOps accepts only instance group roles {sorted(IG_ROLES)}")
        if statements(text, where) != render(cluster, "--kops-additions"):
            err(f"{where}: differs from `iam/render.sh policy {cluster} --kops-additions`; paste its output")
    kops_own = {line.strip() for line in (ROOT / "iam" / "kops-ccm-actions.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    modelled = actions(json.loads((ROOT / "iam" / "kops-ccm-policy.json").read_text())["Statement"])
    if modelled != kops_own:
        err(f"iam/kops-ccm-policy.json and iam/kops-ccm-actions.txt differ: {sorted(modelled ^ kops_own)}; "
            "update both from kOps' AddCCMPermissions")
    ours = actions(render(cluster)["Statement"])
    missing = ours - kops_own - actions(render(cluster, "--kops-additions"))
    if missing:
        err(f"kOps' CCM policy plus --kops-additions lacks {sorted(missing)}, which iam/policy.json grants; "
            "add them to kops_additions() in iam/render.py")

    # Option 2: inlinePolicy, names, role ARN.
    perms = opt2["spec"]["iam"]["serviceAccountExternalPermissions"]
    if len(perms) != 1:
        err("cluster-spec-option2.yaml: expected one serviceAccountExternalPermissions entry")
    perm = perms[0]
    where = "cluster-spec-option2.yaml: serviceAccountExternalPermissions[0].aws.inlinePolicy"
    if statements(perm["aws"]["inlinePolicy"], where) != render(cluster, "--kops"):
        err(f"{where}: differs from `iam/render.sh policy {cluster} --kops`; paste its output")
    ctrl = opt2["spec"].get("cloudControllerManager", {}).get("controllers", [])
    if "*" in ctrl or not ctrl or not all(c.startswith("-") for c in ctrl):
        err("cluster-spec-option2.yaml: cloudControllerManager.controllers must negate every loop and "
            "name no '*', or kOps' CCM keeps running them next to ours")
    role_arn_suffix = f":role/{perm['name']}.{perm['namespace']}.sa.{cluster}"
    for label, path in (("manifests/overlays/kops", kustomized), ("chart example kops.yaml", helm_kops)):
        objs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        sas = [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"]
        if sas != [perm["name"]]:
            err(f"{label}: ServiceAccount {sas} is not {perm['name']!r}, the one kOps makes the role for")
        text = Path(path).read_text()
        if role_arn_suffix not in text:
            err(f"{label}: the role ARN does not end {role_arn_suffix!r}, the name kOps gives it")
        if f"--cluster-name={cluster}" not in text:
            err(f"{label}: --cluster-name={cluster} is missing")

    # The addon index.
    index = yaml.safe_load((KOPS / "addon.yaml").read_text())
    if index.get("kind") != "Addons" or not index.get("spec", {}).get("addons"):
        err("addon.yaml: must be kind Addons with spec.addons")
    for i, a in enumerate(index.get("spec", {}).get("addons", [])):
        extra = set(a) - ADDON_KEYS
        if extra:
            err(f"addon.yaml: spec.addons[{i}] has fields kOps' channels API lacks: {sorted(extra)}")
        if not a.get("selector") or not a.get("manifest"):
            err(f"addon.yaml: spec.addons[{i}] needs selector and manifest")
    wanted = [a["manifest"] for a in opt2["spec"].get("addons", [])]
    if not any(m.endswith("/addon.yaml") for m in wanted):
        err("cluster-spec-option2.yaml: spec.addons does not list addon.yaml")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
    for e in errors:
        print(f"check-kops: {e}", file=sys.stderr)
    sys.exit(1 if errors else 0)
