#!/usr/bin/env bash
# `make sandbox`: a simulated cluster on this machine, no Docker needed.
# Starts moto and the Kubernetes API test server seeded with a VPC, a tagged
# route table, three instances, three tainted kubeadm-style Nodes and one
# LoadBalancer Service, then runs the CCM against them in the foreground.
# The CCM reaches moto through the project's fault proxy (no faults, no
# budget), which answers what moto lacks as AWS does: DescribeInstanceTopology
# and DryRun on the route calls. Without it the log greets the user with
# moto's gaps, not the CCM's work. Ctrl-C stops everything. Extra arguments
# are passed to the CCM.
set -euo pipefail
started=$EPOCHREALTIME
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$HOME/.cache/aws-ccm/target}/debug"
for bin in kube-test-server aws-fault-proxy aws-cloud-controller-manager; do
  if [ ! -x "$target/$bin" ]; then
    echo "sandbox: $target/$bin not built; run make sandbox (it builds first)" >&2
    exit 1
  fi
done
dir=.sandbox
cluster_id=sandbox
# The CCM's HTTPS port (upstream's default); SANDBOX_SECURE_PORT moves it
# when another sandbox on this machine holds it.
secure_port=${SANDBOX_SECURE_PORT:-10258}
rm -rf "$dir"
mkdir -p "$dir"

pids=()
# Stop in reverse start order: the CCM first, so it can still release its
# Lease on the API test server, which goes next, then moto. moto and the API
# server run in their own sessions (setsid) so a Ctrl-C, which signals the
# whole foreground process group, reaches only the CCM and this script.
cleanup() {
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT INT TERM

free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_for() { # wait_for DESCRIPTION COMMAND...: polls for up to 30 s
  local what=$1; shift
  for _ in $(seq 1 300); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "sandbox: timed out waiting for $what" >&2
  exit 1
}

moto_port=$(free_port)
setsid .venv/bin/moto_server -H 127.0.0.1 -p "$moto_port" >"$dir/moto.log" 2>&1 &
pids+=($!)
endpoint="http://127.0.0.1:$moto_port"
wait_for "moto on $endpoint" .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$endpoint/moto-api/')"
echo "sandbox: moto on $endpoint (log: $dir/moto.log)"

.venv/bin/python scripts/sandbox_seed.py "$endpoint" "$cluster_id" "$dir/seed.yaml"

setsid "$target/aws-fault-proxy" --upstream "$endpoint" >"$dir/proxy.out" 2>"$dir/proxy.log" &
pids+=($!)
wait_for "the fault proxy" grep -q "listening on" "$dir/proxy.out"
proxy=$(sed -n 's/^aws-fault-proxy listening on //p' "$dir/proxy.out")
echo "sandbox: the CCM reaches moto through the fault proxy on $proxy (calls per action: curl $proxy/proxy-api/counts)"

setsid "$target/kube-test-server" --port 0 --kubeconfig "$dir/kubeconfig" --seed "$dir/seed.yaml" >"$dir/apiserver.log" 2>&1 &
pids+=($!)
wait_for "the API test server" test -s "$dir/kubeconfig"
echo "sandbox: API test server ready; kubectl --kubeconfig $dir/kubeconfig get nodes,services"

cat >"$dir/cloud.conf" <<CONF
[Global]
Region = us-east-1
KubernetesClusterID = $cluster_id
CONF

# The API test server has no tokens for curl to show, so /metrics is opened
# the upstream way: an always-allowed path (a repeated flag adds to the list,
# as in upstream, so drop /metrics here to try the 401).
echo "sandbox: metrics: curl -k https://127.0.0.1:$secure_port/metrics"
# How long from this script's start until the CCM's caches are synced
# (/readyz), printed once: what a newcomer waits before the log shows work.
report_ready() {
  for _ in $(seq 1 1200); do
    if .venv/bin/python -c "import ssl, urllib.request; urllib.request.urlopen('https://127.0.0.1:$secure_port/readyz', context=ssl._create_unverified_context(), timeout=1)" 2>/dev/null; then
      echo "sandbox: the CCM is ready (/readyz ok) $(.venv/bin/python -c "print(f'{$EPOCHREALTIME - $started:.1f}')") s after sandbox.sh started"
      return 0
    fi
    sleep 0.1
  done
  echo "sandbox: the CCM was not ready (/readyz) within 2 minutes" >&2
}
report_ready &
pids+=($!)

echo "sandbox: starting aws-cloud-controller-manager (Ctrl-C to stop)"
AWS_ENDPOINT_URL="$proxy" AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_EC2_METADATA_DISABLED=true \
  "$target/aws-cloud-controller-manager" \
  --cloud-provider=aws \
  --cloud-config="$dir/cloud.conf" \
  --kubeconfig="$dir/kubeconfig" \
  --bind-address=127.0.0.1 \
  --secure-port="$secure_port" \
  --cluster-cidr=10.244.0.0/16 \
  --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
  --v=2 "$@" &
pids+=($!)
wait "${pids[-1]}"
