#!/usr/bin/env bash
# The Helm chart, offline: `helm lint` and `helm template` with the default
# values and with every file in charts/aws-cloud-controller-manager/examples/;
# each output validated strictly against the Kubernetes schemas
# (kubernetes-validate, as scripts/check-manifests.sh does for kustomize),
# plus what the schemas cannot see (scripts/check-rendered.py): flags the CCM
# accepts, the IRSA role written once, ServiceMonitor fields, and for the kOps
# example no name kOps' own addon uses. Values mistakes must fail rendering
# with a message naming the value: the last block checks that they do.
set -euo pipefail
cd "$(dirname "$0")/.."
helm="${HELM:-.venv/bin/helm}"
validate="${KUBERNETES_VALIDATE:-.venv/bin/kubernetes-validate}"
py="${PYTHON:-.venv/bin/python}"
chart=charts/aws-cloud-controller-manager
[ -x "$helm" ] || { echo "check-chart: $helm is missing; run scripts/install-tools.sh (make tools)" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

count=0
for values in "" "$chart"/examples/*.yaml; do
  name="${values:+$(basename "$values" .yaml)}"
  name="${name:-default}"
  args=()
  [ -n "$values" ] && args=(-f "$values")
  "$helm" lint --strict --quiet "$chart" "${args[@]}" >/dev/null \
    || { "$helm" lint --strict "$chart" "${args[@]}" >&2; echo "check-chart: helm lint failed for $name" >&2; exit 1; }
  "$helm" template aws-ccm "$chart" --namespace kube-system "${args[@]}" > "$out/$name.yaml"
  # ServiceMonitor is a CRD kubernetes-validate has no schema for; check-rendered.py checks it.
  if ! "$validate" --strict --quiet "$out/$name.yaml" > "$out/validate.log" 2>&1; then
    cat "$out/validate.log" >&2; echo "check-chart: $name does not validate" >&2; exit 1
  fi
  grep -v "Couldn't find schema for kind ServiceMonitor" "$out/validate.log" >&2 || true
  for check in flags identity servicemonitor; do
    "$py" scripts/check-rendered.py "$check" "$out/$name.yaml"
  done
  if [ "$name" = kops ]; then
    "$py" scripts/check-rendered.py kops-names "$out/$name.yaml"
  fi
  count=$((count + 1))
  echo "check-chart: $name renders and validates ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done
# The default install grants exactly what manifests/base grants.
"${KUBECTL:-.venv/bin/kubectl}" kustomize manifests/base > "$out/base.yaml"
"$py" scripts/check-rendered.py same-rbac "$out/default.yaml" "$out/base.yaml"
echo "check-chart: default RBAC rules equal manifests/base's"
[ "$count" -ge 5 ] || { echo "check-chart: expected the default values and at least 4 example files" >&2; exit 1; }

# Each must fail, and say which value is wrong.
expect_failure() {
  local want="$1"; shift
  if "$helm" template aws-ccm "$chart" "$@" >"$out/neg.out" 2>&1; then
    echo "check-chart: helm template $* rendered; it must fail with: $want" >&2; exit 1
  fi
  grep -qF -- "$want" "$out/neg.out" \
    || { echo "check-chart: helm template $* failed without saying: $want" >&2; cat "$out/neg.out" >&2; exit 1; }
}
expect_failure "args must contain --cloud-provider=aws" --set 'args={--v=2}'
expect_failure "both name a role" --set irsa.roleArn=arn:aws:iam::111122223333:role/a \
  --set 'serviceAccount.annotations.eks\.amazonaws\.com/role-arn=arn:aws:iam::111122223333:role/a'
expect_failure "irsa.roleArn \"role-a\" is not an IAM role ARN" --set irsa.roleArn=role-a
expect_failure "image.digest \"sha256:abc\"" --set image.digest=sha256:abc
expect_failure "has no URL" --set 'cloudConfig.serviceOverrides[0].name=1' \
  --set 'cloudConfig.serviceOverrides[0].Service=ec2' --set 'cloudConfig.serviceOverrides[0].Region=us-east-1' \
  --set 'cloudConfig.serviceOverrides[0].SigningRegion=us-east-1'
expect_failure "--secure-port=0" --set 'args={--cloud-provider=aws,--secure-port=0}' --set metrics.service.enabled=true
expect_failure "args set --tls-cert-file" --set admissionWebhook.enabled=true \
  --set 'args={--cloud-provider=aws,--tls-cert-file=/x.crt}'
expect_failure "admissionWebhook.timeoutSeconds 31" --set admissionWebhook.enabled=true --set admissionWebhook.timeoutSeconds=31
echo "check-chart: bad values fail with their message (8 cases)"
