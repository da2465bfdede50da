#!/usr/bin/env bash
# Prints iam/policy.json or iam/trust-policy.json with the placeholders
# filled in.
#   iam/render.sh policy CLUSTER_ID
#   iam/render.sh trust ACCOUNT_ID OIDC_ISSUER   (issuer without https://)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
case "${1:-}" in
  policy)
    [ $# -eq 2 ] || { echo "usage: $0 policy CLUSTER_ID" >&2; exit 2; }
    sed "s|CLUSTER_ID|$2|g" "$here/policy.json"
    ;;
  trust)
    [ $# -eq 3 ] || { echo "usage: $0 trust ACCOUNT_ID OIDC_ISSUER" >&2; exit 2; }
    issuer="${3#https://}"
    sed -e "s|ACCOUNT_ID|$2|g" -e "s|OIDC_ISSUER|$issuer|g" "$here/trust-policy.json"
    ;;
  *)
    echo "usage: $0 policy CLUSTER_ID | trust ACCOUNT_ID OIDC_ISSUER" >&2
    exit 2
    ;;
esac
