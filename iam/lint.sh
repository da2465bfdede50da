#!/usr/bin/env bash
# Lints iam/policy.json, rendered with every iam/render.sh option, with
# parliament; fails on every finding except the known gaps in parliament's
# own data listed in iam/parliament-known-gaps.txt. The policy is evaluated
# condition by condition by crates/aws-ccm/tests/iam_policy.rs; this is a second opinion.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
parliament="${PARLIAMENT:-parliament}"
rendered="$("$here/render.sh" policy example-cluster --legacy-cluster-tag \
  --route-table rtb-0123456789abcdef0 --security-group sg-0123456789abcdef0 \
  --assume-role arn:aws:iam::123456789012:role/example)"
findings="$("$parliament" --json <<<"$rendered" || true)"
known="$(grep -v '^#' "$here/parliament-known-gaps.txt" | sed '/^$/d')"
left=0
while IFS= read -r line; do
  [ -z "$line" ] && continue
  detail="$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["detail"])' "$line")"
  if ! grep -qxF -- "$detail" <<<"$known"; then
    echo "parliament: $line" >&2
    left=$((left + 1))
  fi
done <<<"$findings"
if [ "$left" -ne 0 ]; then
  echo "iam/policy.json: $left parliament finding(s)" >&2
  exit 1
fi
echo "iam/policy.json: parliament clean (known gaps in its data ignored: $(grep -c . <<<"$known"))"
# The kubelet's ECR credential provider's node-role policy: no render
# options, no known gaps; evaluated by crates/ecr-credential-provider/tests/iam_policy.rs.
plugin_findings="$("$parliament" --json <"$here/ecr-credential-provider-policy.json" || true)"
if [ -n "$plugin_findings" ]; then
  echo "parliament: $plugin_findings" >&2
  echo "iam/ecr-credential-provider-policy.json: parliament finding(s)" >&2
  exit 1
fi
echo "iam/ecr-credential-provider-policy.json: parliament clean"
