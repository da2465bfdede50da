#!/usr/bin/env python3
"""The kubeadm configs in manifests/overlays/kubeadm, offline (no kubeadm
binary is installable from the registries this project reaches):

- every document validates against kubeadm's v1beta4 types
  (scripts/kubeadm-v1beta4.schema.json; unknown fields are errors);
- every node's kubelet gets --cloud-provider=external, and the cluster's
  kube-controller-manager too (ClusterConfiguration, which joining
  control-plane nodes take from the cluster);
- the control-plane join has a controlPlane section, the worker join none;
  both join the cluster's controlPlaneEndpoint.

  check-kubeadm.py
"""

import copy
import json
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "manifests" / "overlays" / "kubeadm"
SCHEMA = json.loads((ROOT / "scripts" / "kubeadm-v1beta4.schema.json").read_text())
FILES = {"init": "kubeadm-init.yaml", "cp": "kubeadm-join-control-plane.yaml", "worker": "kubeadm-join-worker.yaml"}


def schema_errors(doc):
    v = jsonschema.Draft7Validator(SCHEMA)
    if v.is_valid(doc):
        return []
    # Report against the branch of the same kind, which names the field.
    for branch in SCHEMA["oneOf"]:
        if branch["properties"]["kind"]["const"] == doc.get("kind"):
            sub = dict(branch, definitions=SCHEMA["definitions"])
            return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                    for e in jsonschema.Draft7Validator(sub).iter_errors(doc)]
    return [f"kind {doc.get('kind')!r} is not InitConfiguration, ClusterConfiguration or JoinConfiguration"]


def arg(args, name):
    return next((a.get("value") for a in args or [] if a.get("name") == name), None)


def main():
    errors = []
    docs = {}
    for key, name in FILES.items():
        for doc in yaml.safe_load_all((DIR / name).read_text()):
            if not doc:
                continue
            errors += [f"{name} {doc.get('kind')}: {e}" for e in schema_errors(doc)]
            docs[(key, doc.get("kind"))] = doc
    init = docs.get(("init", "InitConfiguration"))
    cluster = docs.get(("init", "ClusterConfiguration"))
    cp = docs.get(("cp", "JoinConfiguration"))
    worker = docs.get(("worker", "JoinConfiguration"))
    if not all((init, cluster, cp, worker)):
        return errors + ["expected InitConfiguration + ClusterConfiguration in kubeadm-init.yaml and a "
                         "JoinConfiguration in each join file"]
    for label, doc in (("kubeadm-init.yaml", init), (FILES["cp"], cp), (FILES["worker"], worker)):
        if arg(doc.get("nodeRegistration", {}).get("kubeletExtraArgs"), "cloud-provider") != "external":
            errors.append(f"{label}: nodeRegistration.kubeletExtraArgs needs cloud-provider=external "
                          "(else the kubelet never waits for the CCM and the Node never gets its provider ID)")
    if arg(cluster.get("controllerManager", {}).get("extraArgs"), "cloud-provider") != "external":
        errors.append("kubeadm-init.yaml: ClusterConfiguration.controllerManager.extraArgs needs cloud-provider=external")
    if "controlPlane" not in cp:
        errors.append(f"{FILES['cp']}: no controlPlane section, so the node would join as a worker")
    if "controlPlane" in worker:
        errors.append(f"{FILES['worker']}: a controlPlane section makes it a control-plane node")
    endpoint = cluster.get("controlPlaneEndpoint")
    for label, doc in ((FILES["cp"], cp), (FILES["worker"], worker)):
        got = doc["discovery"].get("bootstrapToken", {}).get("apiServerEndpoint")
        if got != endpoint:
            errors.append(f"{label}: joins {got}, not the cluster's controlPlaneEndpoint {endpoint}")
    # The schema must reject what kubeadm's strict decoding rejects.
    bad = copy.deepcopy(cp)
    bad["nodeRegistration"]["kubeletExtraArgs"] = {"cloud-provider": "external"}  # the v1beta3 map form
    if not schema_errors(bad):
        errors.append("the v1beta4 schema accepted v1beta3's map-form kubeletExtraArgs")
    return errors


if __name__ == "__main__":
    errs = main()
    for e in errs:
        print(f"check-kubeadm: {e}", file=sys.stderr)
    if errs:
        sys.exit(1)
    print("check-kubeadm: kubeadm-init.yaml, kubeadm-join-control-plane.yaml and kubeadm-join-worker.yaml "
          "validate against kubeadm v1beta4 and set --cloud-provider=external where needed")
