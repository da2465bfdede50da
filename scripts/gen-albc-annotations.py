#!/usr/bin/env python3
"""Lists the AWS Load Balancer Controller's Service annotations under
service.beta.kubernetes.io/aws-load-balancer-*, read from its source
(pkg/annotations/constants.go, the `SvcLBSuffix...` constants, which its
docs/guide/service/annotations.md lists too), into
crates/aws-ccm/tests/data/albc-annotations.json. The annotation table's unit
tests (crates/aws-ccm/src/aws/annotations/tests.rs) then check that each one
is a row: read as the Go CCM reads it, or known by name and not read.

A constant named `...AnnotationPrefix` starts keys `<prefix>.<protocol>-<port>`:
it is listed as `<prefix>.*`, as the table's row matches it.

The source is a bare git mirror (`fetch
github:kubernetes-sigs/aws-load-balancer-controller` puts it under
/work/.mirror); no Go toolchain is needed.

Usage: gen-albc-annotations.py [--mirrors DIR] [--check]
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "aws-ccm" / "tests" / "data" / "albc-annotations.json"
MIRROR = "kubernetes-sigs+aws-load-balancer-controller"
PATH = "pkg/annotations/constants.go"
CONSTANT = re.compile(r'^\s*(SvcLBSuffix\w+)\s*=\s*"(aws-load-balancer-[a-z0-9-]+)"')


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True,
                          capture_output=True, text=True).stdout


def annotations(mirrors: Path) -> list[dict]:
    git_dir = mirrors / MIRROR / "repo"
    commit = git(git_dir, "rev-parse", "--short=9", "HEAD").strip()
    found = []
    for number, line in enumerate(git(git_dir, "show", f"HEAD:{PATH}").splitlines(), 1):
        m = CONSTANT.match(line)
        if not m:
            continue
        key = "service.beta.kubernetes.io/" + m.group(2)
        if m.group(1).endswith("AnnotationPrefix"):
            key += ".*"
        found.append({"annotation": key, "source": f"aws-load-balancer-controller@{commit} {PATH}:{number}"})
    return sorted(found, key=lambda a: a["annotation"])


def main() -> int:
    args = sys.argv[1:]
    mirrors = Path(args[args.index("--mirrors") + 1]) if "--mirrors" in args else Path("/work/.mirror")
    found = annotations(mirrors)
    text = json.dumps(found, indent=1) + "\n"
    if "--check" in args:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"gen-albc-annotations: stale {OUT.relative_to(ROOT)}; run scripts/gen-albc-annotations.py",
                  file=sys.stderr)
            return 1
        print("gen-albc-annotations: up to date")
        return 0
    OUT.write_text(text)
    print(f"gen-albc-annotations: {len(found)} entries -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
