#!/usr/bin/env python3
"""Size limits of the product crates (issue 21): no source file over about
800 lines and no function over about 80 lines, tests aside. The product is
the CCM and the kubelet's ecr-credential-provider.

Tests aside means: files named tests.rs or *_tests.rs, files under a tests/
directory, and everything from a `#[cfg(test)]` item to its closing brace.
Prints the offenders and exits 1 when there are any; `--report` prints the
longest functions and files and always exits 0.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCTS = [
    ROOT / "crates" / "aws-ccm" / "src",
    ROOT / "crates" / "ecr-credential-provider" / "src",
]
MAX_FILE = 800
MAX_FN = 80
FN = re.compile(r"^\s*(pub(\([a-z:]+\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+([A-Za-z0-9_]+)")


def is_test_file(path: Path) -> bool:
    return path.name == "tests.rs" or path.name.endswith("_tests.rs") or "tests" in path.parts


def strip_strings(line: str) -> str:
    """The line without string/char literals and // comments, for brace counting."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])'", "''", line)
    return line.split("//", 1)[0]


def production_lines(lines):
    """(number, text) of the lines outside #[cfg(test)] items."""
    out = []
    skip_depth = None
    pending_cfg_test = False
    depth = 0
    for number, text in enumerate(lines, 1):
        code = strip_strings(text)
        if skip_depth is None and code.strip().startswith("#[cfg(test)]"):
            pending_cfg_test = True
            continue
        opens, closes = code.count("{"), code.count("}")
        if pending_cfg_test:
            pending_cfg_test = False
            if opens > closes:
                skip_depth = depth
                depth += opens - closes
                continue
            if code.rstrip().endswith(";"):
                continue  # `mod tests;` and friends
        if skip_depth is not None:
            depth += opens - closes
            if depth <= skip_depth:
                skip_depth = None
            continue
        depth += opens - closes
        out.append((number, text))
    return out


def functions(lines):
    """(name, first line, length) of each fn with a body."""
    found = []
    for i, (number, text) in enumerate(lines):
        m = FN.match(text)
        if not m:
            continue
        depth = 0
        started = False
        for number_end, body in lines[i:]:
            code = strip_strings(body)
            if not started and code.rstrip().endswith(";") and "{" not in code:
                break  # a declaration without a body
            depth += code.count("{") - code.count("}")
            if code.count("{"):
                started = True
            if started and depth <= 0:
                found.append((m.group(6), number, number_end - number + 1))
                break
    return found


def main() -> int:
    report = "--report" in sys.argv
    offenders = []
    fns = []
    files = []
    for path in sorted(p for product in PRODUCTS for p in product.rglob("*.rs")):
        if is_test_file(path):
            continue
        rel = path.relative_to(ROOT)
        lines = production_lines(path.read_text().splitlines())
        files.append((len(lines), rel))
        if len(lines) > MAX_FILE:
            offenders.append(f"{rel}: {len(lines)} lines outside tests (limit {MAX_FILE})")
        for name, line, length in functions(lines):
            fns.append((length, f"{rel}:{line} {name}"))
            if length > MAX_FN:
                offenders.append(f"{rel}:{line}: fn {name} is {length} lines (limit {MAX_FN})")
    if report:
        for length, where in sorted(fns, reverse=True)[:25]:
            print(f"{length:5} {where}")
        for length, rel in sorted(files, reverse=True)[:10]:
            print(f"{length:5} {rel}")
        return 0
    for line in offenders:
        print(f"check-sizes: {line}", file=sys.stderr)
    if offenders:
        print("check-sizes: split the function into steps, or the file by concern (CONTRIBUTING.md)", file=sys.stderr)
        return 1
    print(f"check-sizes: ok ({len(files)} files, {len(fns)} functions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
