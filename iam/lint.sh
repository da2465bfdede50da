#!/usr/bin/env bash
# Lints iam/policy.json with parliament; fails on every finding except the
# known gaps in parliament's own data listed in iam/parliament-known-gaps.txt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
parliament="${PARLIAMENT:-parliament}"
findings="$("$parliament" --json < "$here/policy.json" || true)"
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
