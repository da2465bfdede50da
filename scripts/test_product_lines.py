#!/usr/bin/env python3
"""Tests of scripts/product-lines.py: what counts as product, and as what."""

import importlib.util
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("product_lines", HERE / "product-lines.py")
product_lines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(product_lines)

S = "crates/aws-ccm/src"


class ProductLines(unittest.TestCase):
    def test_code_comments_and_blanks_apart(self):
        files = {f"{S}/a.rs": "//! doc\n\nfn a() {\n    // why\n    1;\n}\n"}
        self.assertEqual(product_lines.count(files), (3, 2, 1))

    def test_an_inline_test_module_is_left_out(self):
        files = {f"{S}/a.rs": "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    fn t() {\n    }\n}\n"}
        self.assertEqual(product_lines.count(files), (1, 0, 1))

    def test_only_the_module_right_after_cfg_test_is_a_test_module(self):
        files = {
            f"{S}/m/mod.rs": "#[cfg(test)]\npub mod fake;\npub mod real;\n",
            f"{S}/m/fake.rs": "fn f() {}\n",
            f"{S}/m/real.rs": "fn r() {}\n",
        }
        self.assertEqual(product_lines.count(files), (2, 0, 0))

    def test_test_files_by_name_and_by_path_attribute(self):
        files = {
            f"{S}/a.rs": 'fn a() {}\n#[cfg(test)]\n#[path = "a_oracle.rs"]\nmod oracle;\n',
            f"{S}/a_oracle.rs": "const X: u8 = 1;\n",
            f"{S}/b_tests.rs": "fn t() {}\n",
            f"{S}/c/tests/d.rs": "fn t() {}\n",
        }
        self.assertEqual(product_lines.count(files), (1, 0, 0))


if __name__ == "__main__":
    unittest.main()
