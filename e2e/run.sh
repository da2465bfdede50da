#!/usr/bin/env bash
# End to end on a machine with Docker: a kind cluster whose kubelets run
# with --cloud-provider=external (e2e/kind-config.yaml), an AWS emulator on
# kind's Docker network seeded with one instance per node at the node's
# container IP (e2e/seed.py), the CCM image loaded into kind and installed
# from manifests/overlays/e2e,
# then the Rust e2e suite (crates/aws-ccm/tests/e2e.rs) against both. Everything is torn
# down on exit (keep it with E2E_KEEP=1).
#
#   E2E_EMULATOR=moto        (default) motoserver/moto: EC2, ELB, ELBv2 -> every test
#   E2E_EMULATOR=localstack  LocalStack community: EC2 only (its free edition
#                            has no ELB/ELBv2) -> node and route tests
set -euo pipefail
cd "$(dirname "$0")/.."

cluster="${E2E_CLUSTER:-aws-ccm-e2e}"
cluster_id="kind-e2e"            # manifests/overlays/e2e/cloud.conf
emulator="${E2E_EMULATOR:-moto}"
# kind v0.32.0's default node image (its pkg/apis/config/defaults/image.go).
node_image="${E2E_NODE_IMAGE:-kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5}"
kubectl="${KUBECTL:-kubectl}"
image="aws-cloud-controller-manager:e2e"
port=5000

# Every command this script runs beyond bash, coreutils, grep and sed.
for tool in docker kind "$kubectl" cargo python3 curl sort; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool is required (kubectl: make tools puts one in .venv/bin)" >&2; exit 1; }
done
# kind merges kubeletExtraArgs by name (null deletes) for kubeadm v1beta4
# from v0.32.0 on; e2e/kind-config.yaml relies on it.
kind_version="$(kind version | sed -n 's/^kind v\([0-9][0-9.]*\).*/\1/p')"
if [ -z "$kind_version" ] || [ "$(printf '%s\n0.32.0\n' "$kind_version" | sort -V | head -n1)" != 0.32.0 ]; then
  echo "e2e: kind ${kind_version:-(unknown version)} is too old; e2e/kind-config.yaml needs kind >= v0.32.0" >&2
  exit 1
fi
case "$emulator" in
  moto)
    emulator_image="motoserver/moto:5.2.5"
    emulator_env=()
    features="nodes,routes,clb,nlb"
    ;;
  localstack)
    emulator_image="localstack/localstack:3.8"
    emulator_env=(-e "GATEWAY_LISTEN=0.0.0.0:$port" -e "SERVICES=ec2,sts")
    features="nodes,routes"
    ;;
  *)
    echo "e2e: E2E_EMULATOR must be moto or localstack, not $emulator" >&2
    exit 2
    ;;
esac

work="$(mktemp -d)"
cleanup() {
  status=$?
  if [ "${E2E_KEEP:-0}" = 1 ]; then
    echo "e2e: kept cluster $cluster, emulator aws-emulator and $work"
    return
  fi
  kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  docker rm -f aws-emulator >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT

echo "e2e: $emulator_image as the AWS endpoint (features: $features)"
docker network inspect kind >/dev/null 2>&1 || docker network create kind >/dev/null
docker rm -f aws-emulator >/dev/null 2>&1 || true
docker run -d --name aws-emulator --network kind -p "127.0.0.1:$port:$port" \
  "${emulator_env[@]}" "$emulator_image" >/dev/null
endpoint="http://127.0.0.1:$port"
ready=0
for _ in $(seq 1 60); do
  if curl -fsS -o /dev/null "$endpoint" 2>/dev/null; then ready=1; break; fi
  sleep 1
done
[ "$ready" = 1 ] || { echo "e2e: the emulator did not answer on $endpoint within 60 tries" >&2; exit 1; }

# The cluster first: the instances must carry the nodes' container IPs,
# which exist only once kind has made the containers (e2e/kind-config.yaml).
kind create cluster --name "$cluster" --image "$node_image" --config e2e/kind-config.yaml \
  --kubeconfig "$work/kubeconfig"
k() { "$kubectl" --kubeconfig "$work/kubeconfig" "$@"; }

network="$(docker network inspect kind -f '{{range .IPAM.Config}}{{.Subnet}}{{"\n"}}{{end}}' | grep -v ':' | head -n1)"
pairs=()
while read -r node; do
  ip="$(docker inspect -f '{{with index .NetworkSettings.Networks "kind"}}{{.IPAddress}}{{end}}' "$node")"
  [ -n "$ip" ] || { echo "e2e: node container $node has no address on the kind network" >&2; exit 1; }
  pairs+=("$node=$ip")
done < <(kind get nodes --name "$cluster" | sort)
scripts/install-moto.sh   # boto3 for the seeding script
.venv/bin/python e2e/seed.py "$endpoint" "$cluster_id" "$network" "${pairs[@]}" > "$work/instances"
# spec.providerID may be set once, from empty: kind-config.yaml kept kind's
# kind:// ID off the kubelets.
while read -r node zone id; do
  k patch node "$node" --type merge -p "{\"spec\":{\"providerID\":\"aws:///$zone/$id\"}}"
done < "$work/instances"

docker build -t "$image" .
kind load docker-image "$image" --name "$cluster"
k apply -k manifests/overlays/e2e
k -n kube-system rollout status daemonset/aws-cloud-controller-manager --timeout=180s

E2E_KUBECONFIG="$work/kubeconfig" \
E2E_AWS_ENDPOINT="$endpoint" \
E2E_CLUSTER_ID="$cluster_id" \
E2E_FEATURES="$features" \
  cargo test --locked -p aws-ccm --test e2e -- --test-threads=1
