#!/usr/bin/env python3
"""Counts the lines of the product: the aws-ccm crate's source that ships.

Test code is left out: files named `tests.rs` or `*_tests.rs`, files under a
`tests/` directory, modules declared under `#[cfg(test)]` (`mod x;`, with or
without `#[path]`) and the items that follow a `#[cfg(test)]` line. Of the
rest, each line is code, comment (`//`, doc comments included) or blank.

usage: product-lines.py [REV ...]   (default: the working tree)

Each REV (a git revision) is read from git, so two points of history can be
compared without a checkout: `scripts/product-lines.py 93c5933 HEAD`.
"""

import posixpath
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = "crates/aws-ccm/src"
MOD = re.compile(r"\s*(?:pub(?:\([a-z]+\))? )?mod ([a-z_0-9]+);")
PATH = re.compile(r'\s*#\[path = "([^"]+)"\]')


def sources(rev):
    """{path: text} of the crate's `.rs` files at `rev` (None: the tree)."""
    if rev is None:
        return {
            str(p.relative_to(ROOT)): p.read_text()
            for p in sorted((ROOT / SRC).rglob("*.rs"))
        }
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, SRC],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()
    return {
        n: subprocess.run(
            ["git", "show", f"{rev}:{n}"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        for n in names
        if n.endswith(".rs")
    }


def test_modules(files):
    """Paths (files, and directories ending in `/`) of `#[cfg(test)]` modules."""
    found = set()
    for name, text in files.items():
        lines = text.split("\n")
        here = posixpath.dirname(name)
        base = here if posixpath.basename(name) in ("mod.rs", "lib.rs", "main.rs") else name[:-3]
        for i, line in enumerate(lines):
            if line.strip() != "#[cfg(test)]":
                continue
            path = None
            for follow in lines[i + 1 : i + 3]:
                if m := PATH.match(follow):
                    path = posixpath.normpath(posixpath.join(here, m.group(1)))
                elif m := MOD.match(follow):
                    found.add(path or f"{base}/{m.group(1)}.rs")
                    found.add(f"{base}/{m.group(1)}/")
                    break
    return found


def is_test_file(name, modules):
    if "/tests/" in name or name.endswith("tests.rs"):
        return True
    return any(name == m or (m.endswith("/") and name.startswith(m)) for m in modules)


def count(files):
    """(code, comment, blank) over the product's lines of `files`."""
    modules = test_modules(files)
    code = comment = blank = 0
    for name, text in files.items():
        if is_test_file(name, modules):
            continue
        lines = text.split("\n")
        i = 0
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped == "#[cfg(test)]":
                i = end_of_item(lines, i + 1) + 1
                continue
            if not stripped:
                blank += 1
            elif stripped.startswith("//"):
                comment += 1
            else:
                code += 1
            i += 1
    # A file's last newline opens no line.
    blank -= sum(1 for n, t in files.items() if t.endswith("\n") and not is_test_file(n, modules))
    return code, comment, blank


def end_of_item(lines, start):
    """The last line of the item starting at `start`: its braces closed, or
    its `;` when it has none."""
    depth, opened = 0, False
    for j in range(start, len(lines)):
        depth += lines[j].count("{") - lines[j].count("}")
        opened = opened or "{" in lines[j]
        if opened and depth <= 0:
            return j
        if not opened and lines[j].rstrip().endswith(";"):
            return j
    return len(lines) - 1


def main(argv):
    for rev in argv or [None]:
        code, comment, blank = count(sources(rev))
        print(f"{rev or 'tree'}: {code} code, {comment} comment, {blank} blank lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
