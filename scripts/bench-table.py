#!/usr/bin/env python3
"""Regenerates the figures table of docs/scale.md from the scale bench's JSON.

`make bench` (crates/aws-ccm/benches/scale.rs) writes target/bench/scale.json:
a list of {scenario, figure, value, unit, bound, qps, text, bound_text}. This
script renders it as a Markdown table (cells as the bench printed them, from
`text` and `bound_text`; from the numbers and unit when those are absent) and puts it between the markers

    <!-- bench-table:begin -->
    <!-- bench-table:end -->

of the document (default docs/scale.md). With --check it changes nothing and
exits 1 when the document's table is not what the JSON renders to.

With --bounded only the rows that carry a bound or goal are rendered: the
README's table (`--doc README.md --bounded`).

usage: bench-table.py [--json PATH] [--doc PATH] [--bounded] [--check]
"""

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- bench-table:begin -->"
END = "<!-- bench-table:end -->"
FIELDS = ("scenario", "figure", "value", "unit", "bound")


class BenchTableError(Exception):
    """Input the script cannot use; the message says what and how to fix it."""


def number(x):
    """A figure as printed: integers without a fraction, else as given."""
    if x is None:
        return ""
    if isinstance(x, float) and math.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return str(x)


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows):
    """The Markdown table of `rows` (the JSON's list)."""
    out = [
        "| scenario | figure | value | bound / goal | apiserver QPS |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, row in enumerate(rows):
        missing = [f for f in FIELDS if f not in row]
        if missing:
            raise BenchTableError(
                f"row {i} ({row.get('scenario', '?')}: {row.get('figure', '?')}) lacks "
                f"{', '.join(missing)}; rerun `make bench` to rewrite the JSON"
            )
        unit = row["unit"] or ""
        value = row.get("text")
        if value is None:
            value = "" if row["value"] is None else f"{number(row['value'])} {unit}".strip()
        bound = row.get("bound_text")
        if bound is None:
            bound = "" if row["bound"] is None else f"{number(row['bound'])} {unit}".strip()
        qps = number(row.get("qps"))
        cells = [row["scenario"], row["figure"], value, bound, qps]
        out.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(out) + "\n"


def bounded(rows):
    """The rows with a bound or goal (the figures a change is judged by)."""
    return [r for r in rows if r.get("bound") is not None or r.get("bound_text")]


def splice(doc, table, doc_name="the document"):
    """`doc` with the text between the markers replaced by `table`."""
    begin = doc.find(BEGIN)
    end = doc.find(END)
    if begin < 0 or end < 0 or end < begin:
        raise BenchTableError(
            f"{doc_name} lacks the markers {BEGIN} ... {END} (in that order); "
            "add them around the figures table"
        )
    return doc[: begin + len(BEGIN)] + "\n" + table + doc[end:]


def load_rows(path):
    try:
        rows = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BenchTableError(f"{path} does not exist; run `make bench` first") from None
    except json.JSONDecodeError as e:
        raise BenchTableError(f"{path} is not JSON ({e}); rerun `make bench`") from None
    if not isinstance(rows, list):
        raise BenchTableError(f"{path} holds a {type(rows).__name__}, not a list of rows")
    return rows


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "target/bench/scale.json"))
    parser.add_argument("--doc", default=str(ROOT / "docs/scale.md"))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--bounded", action="store_true")
    args = parser.parse_args(argv)
    try:
        rows = load_rows(args.json)
        table = render(bounded(rows) if args.bounded else rows)
        doc = Path(args.doc).read_text()
        new = splice(doc, table, args.doc)
    except BenchTableError as e:
        print(f"bench-table: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != doc:
            print(
                f"bench-table: the table in {args.doc} differs from {args.json}; "
                "run scripts/bench-table.py to regenerate it",
                file=sys.stderr,
            )
            return 1
        return 0
    if new != doc:
        Path(args.doc).write_text(new)
        print(f"bench-table: {args.doc} updated from {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
