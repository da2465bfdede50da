#!/usr/bin/env bash
# The kOps install paths (docs/install-kops.md), offline: the option 2
# addon (kustomize overlay and Helm example) shares no name with kOps' own
# CCM addon; the cluster-spec fragments use only kOps v1alpha2 fields; the
# additionalPolicies and inlinePolicy JSON parse as kOps parses them, equal
# what iam/render.sh prints, and pass parliament (scripts/check-kops.py).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-.venv/bin/python}"
kubectl="${KUBECTL:-.venv/bin/kubectl}"
helm="${HELM:-.venv/bin/helm}"
parliament="${PARLIAMENT:-.venv/bin/parliament}"
for tool in "$kubectl" "$helm" "$parliament"; do
  [ -x "$tool" ] || { echo "check-kops: $tool is missing; run scripts/install-tools.sh (make tools)" >&2; exit 1; }
done
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$kubectl" kustomize manifests/overlays/kops > "$out/overlay.yaml"
"$helm" template aws-ccm charts/aws-cloud-controller-manager --namespace kube-system \
  -f charts/aws-cloud-controller-manager/examples/kops.yaml > "$out/chart.yaml"
"$py" scripts/check-rendered.py kops-names "$out/overlay.yaml"
"$py" scripts/check-rendered.py kops-names "$out/chart.yaml"
"$py" scripts/check-kops.py "$out/overlay.yaml" "$out/chart.yaml"

# parliament on the statements kOps gets, each wrapped as a policy document;
# findings in iam/parliament-known-gaps.txt are gaps in parliament's data.
known="$(grep -v '^#' iam/parliament-known-gaps.txt | sed '/^$/d')"
for flag in --kops --kops-additions; do
  iam/render.sh policy mycluster.example.com "$flag" \
    | "$py" -c 'import json,sys; print(json.dumps({"Version": "2012-10-17", "Statement": json.load(sys.stdin)}))' \
    > "$out/policy.json"
  # parliament exits non-zero when it has findings; a usage error says so on stderr.
  findings="$("$parliament" --json < "$out/policy.json" 2>"$out/parliament.err" || true)"
  if grep -q 'error' "$out/parliament.err"; then
    cat "$out/parliament.err" >&2; echo "check-kops: parliament did not run" >&2; exit 1
  fi
  while IFS= read -r line; do
    [ -z "$line" ] && continue
    detail="$("$py" -c 'import json,sys; print(json.loads(sys.argv[1])["detail"])' "$line")"
    grep -qxF -- "$detail" <<<"$known" || { echo "check-kops: parliament ($flag): $line" >&2; exit 1; }
  done <<<"$findings"
done
echo "check-kops: option 1 additionalPolicies and option 2 inlinePolicy, names and cluster spec fields check out"
