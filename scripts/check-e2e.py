#!/usr/bin/env python3
"""The parts of the kind e2e that need no Docker (scripts/check-e2e.sh):

  check-e2e.py kind-config FILE OVERLAY_OUTPUT
      FILE uses only fields of kind's kind.x-k8s.io/v1alpha4 Cluster (kind's
      pkg/apis/config/v1alpha4/types.go, read at kubernetes-sigs/kind
      fed2688, 2026-08-21); every kubelet gets --cloud-provider=external and
      loses kind's --provider-id; podSubnet is the CCM's --cluster-cidr in
      the rendered e2e overlay.
  check-e2e.py seeded ENDPOINT CLUSTER_ID SEED_OUTPUT NODE=IP...
      what e2e/seed.py made in the emulator is what the CCM needs: one running,
      cluster-tagged instance per node at the node's IP, named in SEED_OUTPUT;
      two tagged public subnets in two zones; a tagged route table with a
      default route, associated with both; a tagged security group.
"""

import sys

import boto3
import yaml

CLUSTER = {"kind", "apiVersion", "name", "nodes", "networking", "featureGates", "runtimeConfig",
           "kubeadmConfigPatches", "kubeadmConfigPatchesJSON6902", "containerdConfigPatches",
           "containerdConfigPatchesJSON6902"}
NODE = {"role", "image", "labels", "extraMounts", "extraPortMappings", "kubeadmConfigPatches",
        "kubeadmConfigPatchesJSON6902"}
NETWORKING = {"ipFamily", "apiServerPort", "apiServerAddress", "podSubnet", "serviceSubnet",
              "disableDefaultCNI", "kubeProxyMode", "dnsSearch"}
errors = []


def unknown(where, obj, allowed):
    for k in set(obj) - allowed:
        errors.append(f"{where}: kind v1alpha4 has no field {k!r}")


def kind_config(path, overlay):
    cfg = yaml.safe_load(open(path))
    if cfg.get("kind") != "Cluster" or cfg.get("apiVersion") != "kind.x-k8s.io/v1alpha4":
        errors.append(f"{path}: must be kind Cluster, apiVersion kind.x-k8s.io/v1alpha4 (kind's current config API)")
    unknown(path, cfg, CLUSTER)
    unknown(f"{path} networking", cfg.get("networking", {}), NETWORKING)
    nodes = cfg.get("nodes", [])
    for i, n in enumerate(nodes):
        unknown(f"{path} nodes[{i}]", n, NODE)
        if n.get("role") not in ("control-plane", "worker"):
            errors.append(f"{path} nodes[{i}]: role must be control-plane or worker")
    if [n.get("role") for n in nodes].count("control-plane") != 1 or len(nodes) < 2:
        errors.append(f"{path}: expected one control-plane node and at least one worker")
    kinds = {}
    for i, text in enumerate(cfg.get("kubeadmConfigPatches", [])):
        patch = yaml.safe_load(text)
        args = patch.get("nodeRegistration", {}).get("kubeletExtraArgs", {})
        kinds[patch.get("kind")] = args
        if "apiVersion" in patch:
            errors.append(f"{path} kubeadmConfigPatches[{i}]: leave apiVersion out, so the patch matches "
                          "whichever kubeadm API kind generates")
    for kind in ("InitConfiguration", "JoinConfiguration"):
        args = kinds.get(kind)
        if args is None:
            errors.append(f"{path}: no kubeadmConfigPatches entry for {kind}")
            continue
        if args.get("cloud-provider") != "external":
            errors.append(f"{path} {kind}: kubelet needs cloud-provider: external")
        if "provider-id" not in args or args["provider-id"] is not None:
            errors.append(f"{path} {kind}: provider-id must be null, to drop kind's kind:// ID "
                          "(spec.providerID can be set only once)")
    subnet = cfg.get("networking", {}).get("podSubnet")
    ds = [d for d in yaml.safe_load_all(open(overlay)) if d and d["kind"] == "DaemonSet"]
    args = ds[0]["spec"]["template"]["spec"]["containers"][0]["args"] if ds else []
    if f"--cluster-cidr={subnet}" not in args:
        errors.append(f"{path}: podSubnet {subnet} is not the e2e overlay's --cluster-cidr ({args})")


def tagged(resource, cluster_id):
    return {"Key": f"kubernetes.io/cluster/{cluster_id}", "Value": "owned"} in resource.get("Tags", [])


def seeded(endpoint, cluster_id, seed_output, pairs):
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="testing", aws_secret_access_key="testing")
    want = dict(p.split("=", 1) for p in pairs)
    printed = [line.split() for line in open(seed_output) if line.strip()]
    if [p[0] for p in printed] != list(want):
        errors.append(f"seed.py printed nodes {[p[0] for p in printed]}, expected {list(want)} in order")
    instances = {i["InstanceId"]: i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    for node, zone, iid in printed:
        inst = instances.get(iid)
        if inst is None:
            errors.append(f"node {node}: instance {iid} does not exist")
            continue
        if inst.get("PrivateIpAddress") != want.get(node):
            errors.append(f"node {node}: instance {iid} has IP {inst.get('PrivateIpAddress')}, not {want.get(node)}")
        if inst["State"]["Name"] != "running" or inst["Placement"]["AvailabilityZone"] != zone:
            errors.append(f"node {node}: instance {iid} is {inst['State']['Name']} in "
                          f"{inst['Placement']['AvailabilityZone']}, expected running in {zone}")
        if not tagged(inst, cluster_id):
            errors.append(f"node {node}: instance {iid} lacks the cluster tag")
    subnets = [s for s in ec2.describe_subnets()["Subnets"] if tagged(s, cluster_id)
               and {"Key": "kubernetes.io/role/elb", "Value": "1"} in s.get("Tags", [])]
    if len({s["AvailabilityZone"] for s in subnets}) < 2:
        errors.append(f"expected cluster-tagged public subnets in two zones, found {len(subnets)}")
    tables = [t for t in ec2.describe_route_tables()["RouteTables"] if tagged(t, cluster_id)]
    if len(tables) != 1:
        errors.append(f"expected one cluster-tagged route table, found {len(tables)}")
    else:
        t = tables[0]
        if not any(r.get("DestinationCidrBlock") == "0.0.0.0/0" and r.get("GatewayId", "").startswith("igw-")
                   for r in t["Routes"]):
            errors.append("the route table has no default route through an internet gateway")
        assoc = {a.get("SubnetId") for a in t.get("Associations", [])}
        if not {s["SubnetId"] for s in subnets} <= assoc:
            errors.append("the route table is not associated with both subnets")
    if not [g for g in ec2.describe_security_groups()["SecurityGroups"] if tagged(g, cluster_id)]:
        errors.append("no cluster-tagged security group")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "kind-config":
        kind_config(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 6 and sys.argv[1] == "seeded":
        seeded(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    else:
        sys.exit(__doc__)
    for e in errors:
        print(f"check-e2e: {e}", file=sys.stderr)
    sys.exit(1 if errors else 0)
