#!/usr/bin/env bash
# Builds cargo-deny (pinned) once into the tools cache outside the checkout,
# beside the warm target dir, and prints its path. About two minutes on two
# cores; later runs reuse it.
set -euo pipefail
version=0.20.2
root="${AWS_CCM_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/aws-ccm/tools}"
bin="$root/bin/cargo-deny"
if [ "$("$bin" --version 2>/dev/null || true)" != "cargo-deny $version" ]; then
  cargo install --quiet --locked cargo-deny --version "$version" --root "$root" >&2
fi
echo "$bin"
