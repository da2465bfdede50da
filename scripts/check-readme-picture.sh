#!/usr/bin/env bash
# Fails when the README's picture of the code (the first code block under
# "## Architecture") names a file or directory that does not exist. The
# picture's paths are relative to crates/aws-ccm/src/: every word ending in
# `.rs` or `/` is one (a glob, provider/*.rs, must match a file). So the
# picture follows the code: move a controller or a scheduler and this fails
# until the picture says where it went.
#
# Usage: scripts/check-readme-picture.sh   (from anywhere; checks this checkout)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LC_ALL=C.UTF-8
base=crates/aws-ccm/src

picture=$(awk '
  /^## Architecture/ { section = 1; next }
  section && /^## / { exit }
  section && /^```/ { if (inside) exit; inside = 1; next }
  inside { print }
' README.md)
if [[ -z $picture ]]; then
  echo "check-readme-picture: README.md has no code block under \"## Architecture\"" >&2
  exit 1
fi

failures=()
paths=0
while read -r word; do
  word=${word#"${word%%[!\(\[]*}"}
  word=${word%"${word##*[!\),.;:]}"}
  [[ $word =~ ^[a-z_][A-Za-z0-9_./*-]*(\.rs|/)$ ]] || continue
  paths=$((paths + 1))
  if [[ $word == *\** ]]; then
    compgen -G "$base/$word" >/dev/null || failures+=("$word (matches no file under $base/)")
  elif [[ ! -e $base/$word ]]; then
    failures+=("$word ($base/$word does not exist)")
  fi
done < <(tr -s ' \t' '\n' <<<"$picture")

# A picture whose paths the pattern above stopped seeing would pass empty.
if ((paths < 20)); then
  echo "check-readme-picture: only $paths paths found in README.md's picture; is the block still there?" >&2
  exit 1
fi
if ((${#failures[@]})); then
  printf 'README.md picture: %s\n' "${failures[@]}" >&2
  echo "check-readme-picture: ${#failures[@]} path(s) the picture names do not exist;" \
    "draw where the code is now (README.md, \"## Architecture\")" >&2
  exit 1
fi
echo "check-readme-picture: ok ($paths paths in README.md's picture)"
