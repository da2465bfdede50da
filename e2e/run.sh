#!/usr/bin/env bash
# End to end on a machine with Docker: a kind cluster whose kubelets run
# with --cloud-provider=external, an AWS emulator on kind's Docker network,
# the CCM image loaded into kind and installed from manifests/overlays/e2e,
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
node_image="${E2E_NODE_IMAGE:-kindest/node:v1.31.4}"
image="aws-cloud-controller-manager:e2e"
workers=2
port=5000

for tool in docker kind kubectl cargo python3; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool is required" >&2; exit 1; }
done
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
for _ in $(seq 1 60); do
  curl -fsS -o /dev/null "$endpoint" 2>/dev/null && break
  sleep 1
done

scripts/install-moto.sh   # boto3 for the seeding script
.venv/bin/python e2e/seed.py "$endpoint" "$cluster_id" $((workers + 1)) > "$work/instances"

# The kubelets get --provider-id: kind names its nodes after its containers,
# which cannot be EC2 private DNS names, so the CCM finds each instance by ID.
mapfile -t instances < "$work/instances"
kubelet_patch() {
  local kind="$1" zone="${2%% *}" id="${2##* }"
  cat <<PATCH
  - |
    kind: $kind
    nodeRegistration:
      kubeletExtraArgs:
        cloud-provider: external
        provider-id: aws:///$zone/$id
PATCH
}
{
  echo "kind: Cluster"
  echo "apiVersion: kind.x-k8s.io/v1alpha4"
  echo "networking:"
  echo "  podSubnet: 10.244.0.0/16"
  echo "nodes:"
  echo "- role: control-plane"
  echo "  kubeadmConfigPatches:"
  kubelet_patch InitConfiguration "${instances[0]}"
  for i in $(seq 1 "$workers"); do
    echo "- role: worker"
    echo "  kubeadmConfigPatches:"
    kubelet_patch JoinConfiguration "${instances[$i]}"
  done
} > "$work/kind.yaml"

kind create cluster --name "$cluster" --image "$node_image" --config "$work/kind.yaml" \
  --kubeconfig "$work/kubeconfig"

docker build -t "$image" .
kind load docker-image "$image" --name "$cluster"
kubectl --kubeconfig "$work/kubeconfig" apply -k manifests/overlays/e2e
kubectl --kubeconfig "$work/kubeconfig" -n kube-system rollout status \
  daemonset/aws-cloud-controller-manager --timeout=180s

E2E_KUBECONFIG="$work/kubeconfig" \
E2E_AWS_ENDPOINT="$endpoint" \
E2E_CLUSTER_ID="$cluster_id" \
E2E_FEATURES="$features" \
  cargo test --locked -p aws-ccm --test e2e -- --test-threads=1
