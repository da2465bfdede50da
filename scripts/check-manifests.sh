#!/usr/bin/env bash
# Builds the kustomize base and every overlay under manifests/ and validates
# the output offline against the Kubernetes schemas (kubernetes-validate
# ships them), strictly: an unknown field is an error; then checks what the
# schemas cannot (scripts/check-rendered.py): every CCM flag is one
# docs/flags.md lists, and the IRSA role ARN is written at most once.
set -euo pipefail
cd "$(dirname "$0")/.."
validate="${KUBERNETES_VALIDATE:-.venv/bin/kubernetes-validate}"
# scripts/install-tools.sh pins kubectl 1.35 in .venv/bin.
kubectl="${KUBECTL:-.venv/bin/kubectl}"
if ! [ -x "$kubectl" ]; then
  echo "check-manifests: $kubectl is missing; run scripts/install-tools.sh (make tools)" >&2
  exit 1
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
count=0
for dir in manifests/base manifests/overlays/*/; do
  dir="${dir%/}"
  name="$(echo "$dir" | tr '/' '-')"
  "$kubectl" kustomize "$dir" > "$out/$name.yaml"
  "$validate" --strict --quiet "$out/$name.yaml"
  "${PYTHON:-.venv/bin/python}" scripts/check-rendered.py flags "$out/$name.yaml"
  "${PYTHON:-.venv/bin/python}" scripts/check-rendered.py identity "$out/$name.yaml"
  count=$((count + 1))
  echo "check-manifests: $dir builds and validates ($(grep -c '^kind:' "$out/$name.yaml") objects)"
done
[ "$count" -gt 1 ] || { echo "check-manifests: no overlays found" >&2; exit 1; }
# The optional admission check Component, on the base.
mkdir -p "$out/admission"
cp -r manifests/base manifests/admission "$out/admission/"
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [base]\ncomponents: [admission]\n' \
  > "$out/admission/kustomization.yaml"
"$kubectl" kustomize "$out/admission" > "$out/admission.yaml"
"$validate" --strict --quiet "$out/admission.yaml"
"${PYTHON:-.venv/bin/python}" scripts/check-rendered.py flags "$out/admission.yaml"
grep -q -- '--service-admission-webhook=true' "$out/admission.yaml" \
  || { echo "check-manifests: manifests/admission did not add its flag" >&2; exit 1; }
echo "check-manifests: manifests/base with manifests/admission builds and validates ($(grep -c '^kind:' "$out/admission.yaml") objects)"
# The kubelet plugin's installer DaemonSet, applied on its own (no kustomize).
"$validate" --strict --quiet manifests/ecr-credential-provider/install-daemonset.yaml
echo "check-manifests: manifests/ecr-credential-provider/install-daemonset.yaml validates"
