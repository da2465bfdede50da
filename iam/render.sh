#!/usr/bin/env bash
# Prints iam/policy.json or iam/trust-policy.json with the placeholders
# filled in.
#   iam/render.sh policy CLUSTER_ID [--partition P] [--route-table rtb-...]
#                 [--security-group sg-...] [--legacy-cluster-tag]
#                 [--assume-role ROLE_ARN]      (iam/README.md explains each)
#                 [--kops]            the Statement array alone, for kOps' inlinePolicy
#                 [--kops-additions]  what kOps' own CCM policy lacks, for its additionalPolicies
#   iam/render.sh trust ACCOUNT_ID OIDC_ISSUER [--partition P]
#                 (issuer without https://)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
case "${1:-}" in
  policy)
    shift
    [ $# -ge 1 ] || { echo "usage: $0 policy CLUSTER_ID [options]" >&2; exit 2; }
    exec python3 "$here/render.py" "$@"
    ;;
  trust)
    [ $# -eq 3 ] || [ $# -eq 5 ] || { echo "usage: $0 trust ACCOUNT_ID OIDC_ISSUER [--partition P]" >&2; exit 2; }
    partition=aws
    if [ $# -eq 5 ]; then
      [ "$4" = "--partition" ] || { echo "usage: $0 trust ACCOUNT_ID OIDC_ISSUER [--partition P]" >&2; exit 2; }
      partition="$5"
    fi
    issuer="${3#https://}"
    sed -e "s|ACCOUNT_ID|$2|g" -e "s|OIDC_ISSUER|$issuer|g" -e "s|PARTITION|$partition|g" \
      "$here/trust-policy.json"
    ;;
  *)
    echo "usage: $0 policy CLUSTER_ID [options] | trust ACCOUNT_ID OIDC_ISSUER [--partition P]" >&2
    exit 2
    ;;
esac
