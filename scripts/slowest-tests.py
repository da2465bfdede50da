#!/usr/bin/env python3
"""Prints the slowest tests of a nextest JUnit report, and the total: where
the suite's time goes (CI writes the report; see .config/nextest.toml).

  scripts/slowest-tests.py REPORT [N]
"""

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: slowest-tests.py REPORT [N]")
    report = Path(argv[1])
    most = int(argv[2]) if len(argv) > 2 else 15
    if not report.exists():
        print(f"slowest-tests: no report at {report}")
        return
    cases = []
    for case in ET.parse(report).getroot().iter("testcase"):
        cases.append((float(case.get("time", "0")), f"{case.get('classname')} {case.get('name')}"))
    cases.sort(reverse=True)
    total = sum(t for t, _ in cases)
    print(f"slowest-tests: {len(cases)} tests, {total:.0f} s of test time in all; the {min(most, len(cases))} slowest:")
    for t, name in cases[:most]:
        print(f"  {t:7.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv)
