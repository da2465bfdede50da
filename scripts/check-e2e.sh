#!/usr/bin/env bash
# The kind e2e (e2e/run.sh) needs Docker; everything of it that does not
# runs here: the kind config is validated (scripts/check-e2e.py), the e2e
# overlay rendered and validated, and e2e/seed.py run against moto on a free
# local port, with what it made checked against what the CCM needs.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
kubectl="${KUBECTL:-.venv/bin/kubectl}"
validate="${KUBERNETES_VALIDATE:-.venv/bin/kubernetes-validate}"
moto="${MOTO_SERVER:-.venv/bin/moto_server}"
for tool in "$py" "$kubectl" "$validate" "$moto"; do
  [ -x "$tool" ] || { echo "check-e2e: $tool is missing; run make tools" >&2; exit 1; }
done
out="$(mktemp -d)"
moto_pid=""
cleanup() {
  if [ -n "$moto_pid" ]; then kill "$moto_pid" 2>/dev/null || true; wait "$moto_pid" 2>/dev/null || true; fi
  rm -rf "$out"
}
trap cleanup EXIT

bash -n e2e/run.sh
"$kubectl" kustomize manifests/overlays/e2e > "$out/overlay.yaml"
"$validate" --strict --quiet "$out/overlay.yaml"
"$py" scripts/check-e2e.py kind-config e2e/kind-config.yaml "$out/overlay.yaml"
echo "check-e2e: e2e/kind-config.yaml and manifests/overlays/e2e validate and agree"

port="$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$moto" -H 127.0.0.1 -p "$port" > "$out/moto.log" 2>&1 &
moto_pid=$!
endpoint="http://127.0.0.1:$port"
# Wait until moto answers (bounded; it is up in about a second).
ready=0
for _ in $(seq 1 100); do
  if "$py" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/moto-api/", timeout=1)' "$endpoint" \
    2>/dev/null; then ready=1; break; fi
  kill -0 "$moto_pid" 2>/dev/null || { cat "$out/moto.log" >&2; echo "check-e2e: moto exited" >&2; exit 1; }
  sleep 0.1
done
[ "$ready" = 1 ] || { cat "$out/moto.log" >&2; echo "check-e2e: moto did not answer on $endpoint" >&2; exit 1; }
# Three kind-like nodes on a kind-like Docker network.
nodes=(aws-ccm-e2e-control-plane=172.18.0.3 aws-ccm-e2e-worker=172.18.0.2 aws-ccm-e2e-worker2=172.18.0.4)
"$py" e2e/seed.py "$endpoint" kind-e2e 172.18.0.0/16 "${nodes[@]}" > "$out/instances" 2> "$out/seed.log" \
  || { cat "$out/seed.log" >&2; exit 1; }
"$py" scripts/check-e2e.py seeded "$endpoint" kind-e2e "$out/instances" "${nodes[@]}"
# A node outside the network must be refused with a message naming it.
if "$py" e2e/seed.py "$endpoint" other 172.18.0.0/16 stray=10.9.9.9 > /dev/null 2> "$out/neg.log"; then
  echo "check-e2e: seed.py accepted a node outside the network" >&2; exit 1
fi
grep -q "node stray has IP 10.9.9.9" "$out/neg.log" || { cat "$out/neg.log" >&2; exit 1; }
echo "check-e2e: seed.py made one instance per node at its IP, subnets, route table and group (moto)"
