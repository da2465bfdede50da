#!/usr/bin/env python3
"""Writes the "Every upstream name" tables of docs/compatibility.md: one row
per upstream flag, cloud.conf key and annotation (the lists in
crates/aws-ccm/tests/data/upstream-*.json), each with a verdict:

- cloud.conf keys: the "vs. Go CCM" column of docs/cloud-config.md;
- flags: "accepted and ignored" for crates/aws-ccm/src/options/ignored.rs,
  with the reason docs/flags.md gives (IGNORED_WHY); else the verdict of the
  hand-written rows above that name it; else "same";
- annotations: the verdict of the rows above that name it; else that of its
  value classes in the generated "Annotation values" table (every upstream
  annotation must have value classes there: --check fails otherwise).

  scripts/gen-compatibility-names.py          rewrite the section
  scripts/gen-compatibility-names.py --check  fail when it is stale
crates/aws-ccm/tests/upstream_flags.rs checks every name has a row.
"""

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "crates" / "aws-ccm" / "tests" / "data"
PAGE = ROOT / "docs" / "compatibility.md"
BEGIN, END = "<!-- upstream-names:begin -->", "<!-- upstream-names:end -->"


# Why each ignored flag has no meaning here (docs/flags.md says the same).
IGNORED_WHY = [
    (r"^(client-ca-file|requestheader-)", "the health and metrics endpoint authenticates bearer tokens only"),
    (r"^webhook", "the Go AWS CCM registers no webhook, so none is served"),
    (r"^tagging-controller-", "tag calls are always batched and rate-limited at the one door to AWS"),
    (r"^(log-(text|json)-|log-flush-frequency|log-dir|log-file|vmodule|logtostderr|alsologtostderr|"
     r"stderrthreshold|skip-|one-output|add-dir-header)", "klog/component-base output tuning: logs are one unbuffered stream on stderr"),
    (r"curve-preferences$", "rustls offers its own key-exchange groups (X25519, P-256, P-384, post-quantum hybrid)"),
    (r"^concurrent-node-status-updates$", "node status is refreshed by one sweep, not per-node workers"),
    (r"^(cert-dir|tls-sni-cert-key|http2-max-streams-per-connection|permit-port-sharing|permit-address-sharing)$",
     "serving options of the Go HTTP server this binary does not have"),
    (r"^(enable-leader-migration|leader-migration-config)$", "leader migration from the kube-controller-manager is not supported"),
    (r"", "no meaning in this binary (docs/flags.md)"),
]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def rows(text):
    return [cells(l) for l in text.splitlines() if l.startswith("| `")]


def short(text, limit=160):
    text = text.replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1].rsplit(" ", 1)[0] + " …"


def verdict_above(name, table_rows):
    """The verdict of the hand-written rows naming `name` (flag, key or
    annotation, in backquotes): "same" when every such row's Go CCM column
    says so, else "differs: <this CCM's column>"; None when no row names it."""
    hits = [r for r in table_rows if len(r) >= 3 and re.search(f"`{re.escape(name)}[`= ]", r[0])]
    if not hits:
        return None
    odd = [r for r in hits if not r[2].startswith("same")]
    if not odd:
        return "same"
    return "differs: " + short("; ".join(f"{r[0]} → {r[1]}" for r in odd))


def value_classes(page):
    """The generated "Annotation values" rows, by annotation (without the
    service.beta.kubernetes.io/ prefix): annotation, class, example, on,
    Go CCM, here."""
    begin, end = "<!-- annotation-values:begin -->", "<!-- annotation-values:end -->"
    if begin not in page or end not in page:
        sys.exit("docs/compatibility.md: the annotation-values section is missing")
    table = page.split(begin, 1)[1].split(end, 1)[0]
    out = {}
    for r in rows(table):
        out.setdefault(r[0].strip("`"), []).append(r)
    return out


def classes_verdict(classes):
    odd = [r for r in classes if not r[5].startswith("same")]
    if not odd:
        n = len(classes)
        return f"same ({n} value class{'es' if n > 1 else ''} compared)"
    return "differs: " + short("; ".join(f"{r[2]} ({r[1]}) → {r[5]}" for r in odd))


def main(check):
    page = PAGE.read_text()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    # the hand-written comparison tables (every body row)
    above = [cells(l) for l in head.splitlines()
             if l.startswith("| ") and not l.startswith("|---") and not l.startswith("| ---")]
    ignored = set(re.findall(r'\("([a-z0-9-]+)", (?:true|false)\)',
                             (ROOT / "crates/aws-ccm/src/options/ignored.rs").read_text()))
    out = ["", "### Flags", "", "| flag | verdict |", "| --- | --- |"]
    for f in sorted(json.loads((DATA / "upstream-flags.json").read_text()), key=lambda f: f["flag"]):
        name = f["flag"]
        if name in ignored:
            why = next(w for pattern, w in IGNORED_WHY if re.search(pattern, name))
            verdict = f"accepted and ignored: {why}"
        else:
            verdict = verdict_above(f"--{name}", above) or "same"
        out.append(f"| `--{name}` | {verdict} |")
    out += ["", "### cloud.conf keys", "", "| section | key | verdict |", "| --- | --- | --- |"]
    cc = rows((ROOT / "docs" / "cloud-config.md").read_text())
    for k in json.loads((DATA / "upstream-cloud-config.json").read_text()):
        match = [r for r in cc if r[0] == f"`{k['key']}`" and len(r) >= 3]
        verdict = short(match[0][-1]) if match else "same"
        if not re.match(r"(same|differs|accepted and ignored)", verdict):
            verdict = f"same ({verdict})"
        out.append(f"| {k['section']} | `{k['key']}` | {verdict} |")
    out += ["", "### Annotations", "", "| annotation | verdict |", "| --- | --- |"]
    values = value_classes(page)
    for a in sorted({a["annotation"] for a in json.loads((DATA / "upstream-annotations.json").read_text())}):
        classes = values.get(a.removeprefix("service.beta.kubernetes.io/"), [])
        if not classes or any(len(r) < 6 or not r[4] for r in classes):
            sys.exit(f"docs/compatibility.md: {a} has no value class with a Go CCM column "
                     "(crates/aws-ccm/src/aws/annotations/upstream.rs)")
        verdict = verdict_above(a, above) or classes_verdict(classes)
        out.append(f"| `{a}` | {verdict} |")
    new = head + BEGIN + "\n".join(out) + "\n\n" + END + tail
    if check:
        if new != page:
            sys.exit("docs/compatibility.md: the upstream-names section is stale; run scripts/gen-compatibility-names.py")
        return
    PAGE.write_text(new)


if __name__ == "__main__":
    main("--check" in sys.argv[1:])
