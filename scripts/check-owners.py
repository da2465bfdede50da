#!/usr/bin/env python3
"""An owner of state shows none of its fields.

A struct that holds a lock or an interior-mutable cell (Mutex, RwLock,
RefCell, Cell, an atomic, OnceLock/OnceCell), its own or shared through an
Arc, owns state with an invariant: it keeps every field private, and other
modules reach the state through its operations. A struct that only borrows
one (`&'a RefCell<..>`) is a context, and a bundle of metric handles is
not an owner either. Values (plans, parsed
specs, readings of AWS) are data and may show the fields their readers use
(CONTRIBUTING.md, "An inside and an outside").

Exits 1 naming each owner with a visible field.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "crates" / c / "src" for c in ("aws-ccm", "ecr-credential-provider")]
# The lock or cell itself, or shared through Arc/Rc, maybe optional: not a
# type parameter of something else (a metric's `Gauge<f64, AtomicU64>`).
STATE = re.compile(
    r"^\s*((Arc|Rc|Option)<)*([a-z_]+::)*(Mutex|RwLock|RefCell|Cell|Atomic[A-Z]\w*|OnceLock|OnceCell)\b"
)
STRUCT = re.compile(r"^(\s*)(pub(\([a-z:]+\))?\s+)?struct\s+(\w+)\b.*\{\s*$")
FIELD = re.compile(r"^(\s*)(pub(\([a-z:]+\))?\s+)?(\w+)\s*:(.*)$")


def owners(path):
    """(line, struct, visible fields) for each owner of state in `path`."""
    lines = path.read_text().split("\n")
    found = []
    current = None
    for number, line in enumerate(lines, 1):
        if current is None:
            m = STRUCT.match(line)
            if m:
                current = (number, m.group(4), len(m.group(1)), [])
            continue
        start, name, indent, fields = current
        stripped = line.strip()
        if stripped.startswith("}") and len(line) - len(line.lstrip()) == indent:
            owning = [f for f, _, ty in fields if STATE.match(ty)]
            visible = [f for f, vis, _ in fields if vis]
            if owning and visible:
                found.append((start, name, owning, visible))
            current = None
            continue
        m = FIELD.match(line)
        if m and not stripped.startswith("//") and len(m.group(1)) == indent + 4:
            fields.append((m.group(4), (m.group(2) or "").strip(), m.group(5)))
    return found


def main():
    bad = 0
    for source in SOURCES:
        for path in sorted(source.rglob("*.rs")):
            for line, name, owning, visible in owners(path):
                bad += 1
                rel = path.relative_to(ROOT)
                print(
                    f"{rel}:{line}: {name} owns state ({', '.join(owning)}) "
                    f"but shows {', '.join(visible)}: make the fields private and "
                    "offer operations"
                )
    if bad:
        sys.exit(1)
    print("check-owners: every owner of state keeps its fields private")


if __name__ == "__main__":
    main()
