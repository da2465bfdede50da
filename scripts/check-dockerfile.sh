#!/usr/bin/env bash
# Static checks of the Dockerfile (no Docker engine here): it builds with the
# same `make release` developers and CI run, runs the binary from
# /usr/local/bin as UID 65532 on distroless, and `make release` is what the
# Makefile says it is.
set -euo pipefail
cd "$(dirname "$0")/.."
fail() { echo "check-dockerfile: $*" >&2; exit 1; }
df=Dockerfile
# Every base image is pinned by digest: a tag alone moves when it is rebuilt.
digest='@sha256:[0-9a-f]\{64\}'
while read -r from; do
  grep -q "^FROM [^ ]*$digest\( AS [a-z]*\)\?$" <<<"$from" \
    || fail "'$from' is not pinned by digest; write FROM <image>:<tag>@sha256:<digest> (docker buildx imagetools inspect <image>:<tag> prints it)"
done < <(grep '^FROM ' "$df")
grep -q "^FROM rust:[0-9.]*-bookworm$digest AS build$" "$df" || fail "build stage must be a pinned rust:<version>-bookworm@sha256:<digest>"
grep -q 'make release' "$df" || fail "build stage must run 'make release'"
grep -q 'make release release-ecr' "$df" || fail "build stage must also run 'make release-ecr' (the kubelet's ecr-credential-provider)"
grep -q '^COPY --from=build /ecr-credential-provider /ecr-credential-provider$' "$df" \
  || fail "the image must hold /ecr-credential-provider"
grep -q -- 'cargo build --release --locked -p ecr-credential-provider --bin ecr-credential-provider' <<<"$(make -n release-ecr)" \
  || fail "'make release-ecr' must be cargo build --release --locked -p ecr-credential-provider --bin ecr-credential-provider"
grep -q "^FROM gcr.io/distroless/cc-debian12:nonroot$digest$" "$df" || fail "run stage must be distroless cc-debian12:nonroot@sha256:<digest>"
grep -q '^USER 65532:65532$' "$df" || fail "must run as 65532:65532"
grep -q '^ENTRYPOINT \["/usr/local/bin/aws-cloud-controller-manager"\]$' "$df" || fail "entrypoint must be /usr/local/bin/aws-cloud-controller-manager"
toolchain="$(sed -n 's/^FROM rust:\([0-9.]*\)-bookworm.*/\1/p' "$df")"
msrv="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)"
[ "$(printf '%s\n%s\n' "$msrv" "$toolchain" | sort -V | sed -n 1p)" = "$msrv" ] \
  || fail "rust:$toolchain is older than rust-version $msrv"
# Read make's whole output before matching: `make -n | grep -q` under
# pipefail fails whenever grep exits before a sub-make prints its
# "Leaving directory" line (SIGPIPE), which made this check flaky.
release_recipe="$(make -n release)"
grep -q -- 'cargo build --release --locked --bin aws-cloud-controller-manager' <<<"$release_recipe" \
  || fail "'make release' must be cargo build --release --locked --bin aws-cloud-controller-manager"
# COPY lines list several sources separated by spaces: split on words.
# shellcheck disable=SC2013
for path in $(sed -n 's/^COPY \([^-].*\) \.\/.*$/\1/p' "$df"); do
  [ -e "$path" ] || fail "COPY source $path does not exist"
done
echo "check-dockerfile: ok (rust:$toolchain >= $msrv, distroless nonroot, bases pinned by digest, make release)"
