#!/usr/bin/env python3
"""Tests of scripts/bench-table.py against the fixture in scripts/testdata/bench-table/."""

import importlib.util
import shutil
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE / "testdata" / "bench-table"
spec = importlib.util.spec_from_file_location("bench_table", HERE / "bench-table.py")
bench_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_table)


class BenchTable(unittest.TestCase):
    def setUp(self):
        self.dir = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, self.dir)
        self.doc = self.dir / "doc.md"
        shutil.copy(FIXTURE / "doc.md", self.doc)
        self.json = str(FIXTURE / "scale.json")

    def run_script(self, *extra):
        return bench_table.main(["--json", self.json, "--doc", str(self.doc), *extra])

    def test_regenerates_the_table_between_the_markers(self):
        self.assertEqual(self.run_script(), 0)
        self.assertEqual(self.doc.read_text(), (FIXTURE / "expected.md").read_text())

    def test_check_fails_on_a_stale_table_and_passes_after_regeneration(self):
        self.assertEqual(self.run_script("--check"), 1)
        self.assertEqual(self.doc.read_text(), (FIXTURE / "doc.md").read_text(), "--check writes nothing")
        self.run_script()
        self.assertEqual(self.run_script("--check"), 0)

    def test_a_document_without_markers_or_a_missing_json_is_an_error(self):
        self.doc.write_text("# no markers\n")
        self.assertEqual(self.run_script(), 2)
        self.assertEqual(
            bench_table.main(["--json", str(self.dir / "none.json"), "--doc", str(self.doc)]), 2
        )

    def test_bounded_keeps_only_rows_with_a_bound_or_goal(self):
        rows = [
            {"scenario": "s", "figure": "a", "value": 1, "unit": "s", "bound": 2},
            {"scenario": "s", "figure": "b", "value": 1, "unit": "s", "bound": None},
            {"scenario": "s", "figure": "c", "value": 1, "unit": "s", "bound": None, "bound_text": "15 s"},
        ]
        self.assertEqual([r["figure"] for r in bench_table.bounded(rows)], ["a", "c"])
        table = bench_table.render(bench_table.bounded(rows))
        self.assertNotIn("| b |", table)
        self.assertIn("| 15 s |", table)

    def test_a_row_missing_a_field_names_it(self):
        with self.assertRaisesRegex(bench_table.BenchTableError, "lacks unit"):
            bench_table.render([{"scenario": "s", "figure": "f", "value": 1, "bound": None}])


if __name__ == "__main__":
    unittest.main()
