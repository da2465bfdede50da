#!/usr/bin/env python3
"""Prints the reliability campaigns' figures (`make chaos`) as one table.

Reads the JSON lines the campaigns in crates/aws-ccm/tests/ccm/chaos.rs
append to $CHAOS_FIGURES/figures.jsonl, prints campaign, figure, value,
bound and whether the bound was met, and exits non-zero when any was not.
"""
import json
import sys
from pathlib import Path


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: chaos-table.py FIGURES_DIR", file=sys.stderr)
        return 2
    path = Path(sys.argv[1]) / "figures.jsonl"
    if not path.exists():
        print(f"chaos-table: {path} does not exist: did the campaigns run?", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        print(f"chaos-table: {path} is empty", file=sys.stderr)
        return 1
    seeds = sorted({r["seed"] for r in rows})
    header = ("campaign", "figure", "value", "bound", "met")
    table = [header]
    for r in rows:
        value = r["value"]
        shown = f"{value:.1f} {r['unit']}".strip() if r["unit"] else f"{value:g}"
        table.append((r["campaign"], r["figure"], shown, r["bound"], "yes" if r["ok"] else "NO"))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    for i, row in enumerate(table):
        print(" | ".join(str(c).ljust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))
    print(f"\nseed(s): {', '.join(map(str, seeds))} (replay with CHAOS_SEED=<seed> make chaos)")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
