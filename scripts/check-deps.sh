#!/usr/bin/env bash
# cargo deny over the dependency tree (deny.toml): licenses, bans (one version
# of each crate but the listed ones, no OpenSSL, one crypto provider) and
# sources (crates.io only). The advisory check needs the RustSec database
# from GitHub: `scripts/check-deps.sh advisories` (`make audit`) runs it
# where that can be fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
deny="$(scripts/install-cargo-deny.sh)"
if [ "${1:-}" = advisories ]; then
  exec "$deny" check advisories
fi
# --offline reads every crate of the lock file from cargo's cache, those of
# other platforms (windows-sys, android_system_properties, ...) included, which
# a build on Linux never downloads: fetch them first (nothing when cached).
cargo fetch --locked --quiet
exec "$deny" --offline check licenses bans sources
