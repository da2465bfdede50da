#!/usr/bin/env bash
# Fails when the docs name a path of this repository that does not exist,
# or link to a page or heading that does not exist.
#
# Scanned: README.md, CONTRIBUTING.md, docs/*.md and iam/README.md
# (CHANGELOG.md is not: history may name paths that have since moved).
#
# Checked:
# - every word of a `code span` or a fenced code block that looks like a path
#   of this repository: it starts with crates/, src/, tests/, docs/, iam/,
#   manifests/, scripts/, e2e/, benches/, charts/, .ci/ or .config/, or is a
#   root file (Makefile, Dockerfile, README.md, ...). Such paths are relative
#   to the repository root. A `:line` or `#anchor` suffix is dropped; a word
#   with a placeholder (<id>, {a,b}, $VAR, …) is skipped; a glob (*.rs) must
#   match at least one file.
# - every relative markdown link, [text](target) or [label]: target, relative
#   to the file that holds it; a link into a markdown file with #anchor must
#   name one of that file's headings (GitHub's anchors).
#
# Usage: scripts/check-doc-paths.sh   (from anywhere; checks this checkout)
set -euo pipefail
shopt -s nullglob
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export LC_ALL=C.UTF-8

docs=(README.md CONTRIBUTING.md iam/README.md docs/*.md)
path_prefix='^(crates|src|tests|docs|iam|manifests|scripts|e2e|benches|charts|\.ci|\.config)/'
root_files='^(Makefile|Dockerfile|README\.md|CONTRIBUTING\.md|CHANGELOG\.md|Cargo\.toml|Cargo\.lock|LICENSE)$'

# Prints "<line>\t<kind>\t<text>" for one markdown file, kind being
# "code" (one word of a code span or fenced block, without surrounding
# punctuation, #anchor or :line) or "link" (a link target). Lines of a
# paragraph are joined until their backticks pair up, so a code span may
# wrap. (mawk has no {m,n} intervals: the regexes avoid them.)
candidates() {
  awk '
    BEGIN {
      lead = "^[[(\"\047]+"
      trail = "[])\"\047,.;:]+$"
    }
    function words(text, line,   n, w, i) {
      n = split(text, w, /[ \t]+/)
      for (i = 1; i <= n; i++) {
        sub(lead, "", w[i])
        sub(trail, "", w[i])
        sub(/#.*$/, "", w[i])
        sub(/:L?[0-9]+(-L?[0-9]+)?$/, "", w[i])
        if (w[i] != "") printf "%d\tcode\t%s\n", line, w[i]
      }
    }
    function links(text, line,   rest, target) {
      rest = text
      while (match(rest, /\]\([^)]*\)/)) {
        target = substr(rest, RSTART + 2, RLENGTH - 3)
        sub(/^[ \t]+/, "", target)
        sub(/[ \t].*$/, "", target)
        gsub(/^<|>$/, "", target)
        if (target != "") printf "%d\tlink\t%s\n", line, target
        rest = substr(rest, RSTART + RLENGTH)
      }
    }
    function flush(   n, part, i) {
      if (buf == "") return
      n = split(buf, part, "`")
      for (i = 1; i <= n; i++) {
        if (i % 2 == 0) words(part[i], start)
        else links(part[i], start)
      }
      buf = ""
    }
    /^[ \t]*(```|~~~)/ { flush(); fence = !fence; next }
    fence { words($0, NR); next }
    /^[ \t]*$/ { flush(); next }
    /^ ? ? ?\[[^]]+\]:[ \t]+[^ \t]/ {
      flush()
      target = $0
      sub(/^ ? ? ?\[[^]]+\]:[ \t]+/, "", target)
      sub(/[ \t].*$/, "", target)
      gsub(/^<|>$/, "", target)
      printf "%d\tlink\t%s\n", NR, target
      next
    }
    {
      if (buf == "") { buf = $0; start = NR } else buf = buf " " $0
      ticks = buf
      if (gsub(/`/, "", ticks) % 2 == 0) flush()
    }
    END { flush() }
  ' "$1"
}

# GitHub's anchors for the ATX headings of a markdown file, one per line.
anchors() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    !fence && /^ ? ? ?#+[ \t]/ {
      h = $0
      sub(/^ *#+[ \t]+/, "", h)
      sub(/[ \t]+#+[ \t]*$/, "", h)
      sub(/[ \t]+$/, "", h)
      print h
    }
  ' "$1" | sed -e 's/](\([^)]*\))//g' -e 's/.*/\L&/' -e 's/[^[:alnum:] _-]//g' -e 's/ /-/g' |
    awk '{ n = seen[$0]++; print (n ? $0 "-" n : $0) }'
}

declare -A anchor_cache=()
has_anchor() { # file anchor
  if [[ -z ${anchor_cache[$1]+set} ]]; then
    anchor_cache[$1]=$'\n'"$(anchors "$1")"$'\n'
  fi
  [[ ${anchor_cache[$1]} == *$'\n'"$2"$'\n'* ]]
}

failures=()
paths=0
links=0

for doc in "${docs[@]}"; do
  if [[ ! -f $doc ]]; then
    failures+=("$doc: missing (this script scans it)")
    continue
  fi
  dir=$(dirname "$doc")
  while IFS=$'\t' read -r line kind text; do
    where="$doc:$line"
    if [[ $kind == code ]]; then
      word=$text
      [[ $word =~ $path_prefix || $word =~ $root_files ]] || continue
      [[ $word == *[\<\>\{\}\$…]* ]] && continue
      paths=$((paths + 1))
      if [[ $word == *[*?]* ]]; then
        compgen -G "$word" >/dev/null || failures+=("$where: \`$word\` matches no file")
      elif [[ ! -e $word ]]; then
        failures+=("$where: \`$word\` does not exist")
      fi
    else
      [[ $text =~ ^[A-Za-z][A-Za-z0-9+.-]*: ]] && continue   # http:, https:, mailto:
      links=$((links + 1))
      target=${text%%#*}
      anchor=""
      [[ $text == *#* ]] && anchor=${text#*#}
      if [[ -z $target ]]; then
        file=$doc
      elif [[ $target == /* ]]; then
        file=${target#/}
      elif [[ $dir == . ]]; then
        file=$target
      else
        file=$dir/$target
      fi
      if [[ ! -e $file ]]; then
        failures+=("$where: link ($text) points to $(realpath -m --relative-to=. "$file"), which does not exist")
      elif [[ -n $anchor && $file == *.md ]] && ! has_anchor "$file" "$anchor"; then
        failures+=("$where: link ($text): $(realpath -m --relative-to=. "$file") has no heading with anchor #$anchor")
      fi
    fi
  done < <(candidates "$doc")
done

if ((${#failures[@]})); then
  printf '%s\n' "${failures[@]}" >&2
  echo "check-doc-paths: ${#failures[@]} path(s) or link(s) named in the docs do not exist;" \
    "fix the path, or the link, in the file and line shown" >&2
  exit 1
fi
echo "check-doc-paths: ok ($paths paths and $links links in ${#docs[@]} files)"
