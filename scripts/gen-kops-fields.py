#!/usr/bin/env python3
"""Writes scripts/kops-v1alpha2-fields.json: the JSON field names of kOps'
kops.k8s.io/v1alpha2 Cluster and every struct it reaches, read from the Go
types in a kOps git repository, so scripts/check-kops.sh can check the
cluster-spec fragments we ship offline (kOps is not installable from the
registries this project reaches).

  gen-kops-fields.py KOPS_GIT_DIR [COMMIT]   (e.g. a bare mirror; COMMIT defaults to HEAD)
"""

import json
import re
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "kops-v1alpha2-fields.json"
PKG = "pkg/apis/kops/v1alpha2"
FIELD = re.compile(r'^\s*(\w+)?\s*([\w.*\[\]]+)\s+`json:"([^"]*)"')


def git(gitdir, *args):
    return subprocess.run(["git", f"--git-dir={gitdir}", *args], check=True,
                          capture_output=True, text=True).stdout


def base_type(t):
    t = re.sub(r"^(\*|\[\])+", "", t)
    m = re.match(r"map\[[^\]]+\](.*)", t)
    if m:
        t = re.sub(r"^(\*|\[\])+", "", m.group(1))
    return t


def parse(gitdir, commit):
    files = [f for f in git(gitdir, "ls-tree", "--name-only", commit, PKG + "/").split()
             if f.endswith(".go") and not f.endswith("_test.go") and "zz_generated" not in f]
    structs = {}
    for f in files:
        cur = None
        for line in git(gitdir, "show", f"{commit}:{f}").splitlines():
            m = re.match(r"^type (\w+) struct \{", line)
            if m:
                cur = structs.setdefault(m.group(1), {"fields": {}, "inline": []})
                continue
            if cur is not None and line.startswith("}"):
                cur = None
                continue
            if cur is None:
                continue
            m = FIELD.match(line)
            if not m:
                continue
            name, gotype, tag = m.groups()
            if name is None:  # embedded struct: `Type \\`json:",inline"\\``
                name, gotype = gotype, gotype
            jname = tag.split(",")[0]
            if jname == "-":
                continue
            if jname == "" and "inline" in tag:
                cur["inline"].append(base_type(gotype))
                continue
            cur["fields"][jname or name] = base_type(gotype)
    return structs


def reachable(structs, root):
    out, todo = {}, [root]
    while todo:
        t = todo.pop()
        if t in out or t not in structs:
            continue
        fields = dict(structs[t]["fields"])
        for inl in structs[t]["inline"]:
            fields.update(structs.get(inl, {}).get("fields", {}))
        out[t] = {k: (v if v in structs else None) for k, v in sorted(fields.items())}
        todo += [v for v in fields.values() if v in structs]
    return out


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    gitdir = sys.argv[1]
    commit = git(gitdir, "rev-parse", sys.argv[2] if len(sys.argv) == 3 else "HEAD").strip()
    types = reachable(parse(gitdir, commit), "Cluster")
    doc = {"source": f"kubernetes/kops {PKG} at {commit}",
           "note": "field -> struct type name, or null for a scalar, list of scalars or map",
           "types": types}
    OUT.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"{OUT}: {len(types)} types from {commit}")
