#!/usr/bin/env bash
# Proves that `make sandbox` right after `make test` compiles no dependency:
# builds what the suite builds (`cargo nextest run --no-run`), then the
# binaries as `make build` does (`cargo build --bins`), and fails when the
# second compiled any crate that is not the workspace's own.
#
# Cargo unifies a dependency's features over one build, a dev-dependency's
# only when tests are in it: a feature only the tests ask for gives the
# binaries' build another copy of that crate and of everything above it
# (tokio's test-util alone cost the whole AWS SDK, about 13 minutes). On a
# failure the script prints, besides the crates compiled, the packages whose
# features differ between the two builds (`cargo tree` with and without the
# dev-dependencies), which is where the cause has always been.
#
# `make test` runs it after the suite, when both builds are warm: a few
# seconds. Run alone on a cold target dir, the first step is the whole test
# build.
#
# Usage: scripts/check-one-build.sh   (from anywhere; checks this checkout)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cargo nextest run --locked --no-run

# Every unit the binaries' build compiled rather than found fresh; the
# workspace's own crates (package ids `path+file://`) may be relinked.
compiled=$(cargo build --locked --bins --message-format=json |
  python3 -c '
import json, sys
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and not m["fresh"] \
            and not m["package_id"].startswith("path+file://"):
        print(m["package_id"], m["target"]["name"])
' | sort -u)

if [[ -z $compiled ]]; then
  echo "check-one-build: ok (cargo build --bins after the test build compiled no dependency)"
  exit 0
fi

echo "check-one-build: cargo build --bins after the test build compiled these dependencies again:" >&2
printf '  %s\n' "$compiled" >&2

features() { # edges: every package of the workspace's build, with its features
  cargo tree --locked --workspace --edges "$1" --format '{p}|{f}' --prefix none |
    sed 's/ (\*)$//' | sort -u
}
awk -F'|' '
  NR == FNR { bins[$1] = $2; next }
  ($1 in bins) && bins[$1] != $2 {
    printf "  %s: binaries [%s], tests [%s]\n", $1, bins[$1], $2
  }
' <(features normal,build) <(features normal,build,dev) >&2
echo "check-one-build: the packages above get other features in the tests' build (cargo tree merges" \
  "build-script and target units, so one may be listed that builds alike in both, as once_cell does);" \
  "ask for such a feature in the workspace's dependency (Cargo.toml), not in a [dev-dependencies] line" >&2
exit 1
