#!/usr/bin/env python3
"""The monitoring files: Grafana dashboard, PrometheusRule alerts, ServiceMonitor,
and the event-reason troubleshooting page.

  check-observability.py used-metrics   renders the kustomize component
        (manifests/monitoring, on top of manifests/base) and the chart with its
        monitoring templates on, parses every PromQL expression of the rules and
        the dashboard with promql-parser, and prints JSON: one
        {"source", "expr", "metrics"} per expression. The integration test
        crates/aws-ccm/tests/ccm/observability.rs compares "metrics" with what the
        binary serves on /metrics.
  check-observability.py lint            what `make lint` runs (through
        scripts/check-observability.sh): every expression parses; the chart and
        the component render the same dashboard and alerts, from equal files;
        PrometheusRule and ServiceMonitor objects validate against
        prometheus-operator's monitoring.coreos.com/v1 schema (the validators
        npm's @kubernetes-models/prometheus-operator generates from its API
        types, scripts/validate-monitoring.mjs) and, because that schema allows
        unknown fields, a strict check of every field written here; each alert
        has a severity, a summary, a description and a runbook_url naming a
        heading of docs/troubleshooting.md; and every Warning event reason the
        code emits has its heading there (the event-reasons check below).
  check-observability.py event-reasons   only the last check.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
CHART = ROOT / "charts/aws-cloud-controller-manager"
CHART_RULES = CHART / "files/prometheus-rules.yaml"
CHART_DASHBOARD = CHART / "files/aws-ccm-dashboard.json"
COMPONENT = ROOT / "manifests/monitoring"
COMPONENT_RULES = COMPONENT / "prometheusrule.yaml"
COMPONENT_DASHBOARD = COMPONENT / "aws-ccm-dashboard.json"
TROUBLESHOOTING = ROOT / "docs/troubleshooting.md"
EVENTS_SECTION = "## Warning events by reason"
SRC = ROOT / "crates/aws-ccm/src"
DASHBOARD_LABEL = "grafana_dashboard"

# prometheus-operator monitoring.coreos.com/v1 PrometheusRule: the fields the
# CRD has (a typo is an unknown field, which the CRD itself would prune).
PR_SPEC = {"groups"}
PR_GROUP = {"name", "interval", "rules", "limit", "partial_response_strategy", "query_offset", "labels"}
PR_RULE = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")
SEVERITIES = {"warning", "critical"}
RUNBOOK = re.compile(r"^(?:.*/)?docs/troubleshooting\.md#([a-z0-9-]+)$")


def fail(msg):
    print(f"check-observability: {msg}", file=sys.stderr)
    sys.exit(1)


def tool(name):
    path = VENV / "bin" / name
    if not path.exists():
        fail(f"{path} is missing; run scripts/install-tools.sh (make tools)")
    return str(path)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p.stdout


def render():
    """{"manifests/monitoring": objects, "chart": objects}."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {os.path.relpath(ROOT / 'manifests/base', tmp)}\n"
            f"components:\n  - {os.path.relpath(COMPONENT, tmp)}\n")
        kustomized = run([tool("kubectl"), "kustomize", tmp])
    charted = run([tool("helm"), "template", "aws-ccm", str(CHART), "--namespace", "kube-system",
                   "--set", "metrics.serviceMonitor.enabled=true",
                   "--set", "metrics.prometheusRule.enabled=true",
                   "--set", "metrics.dashboard.enabled=true"])
    return {
        "manifests/monitoring": [d for d in yaml.safe_load_all(kustomized) if d],
        "chart": [d for d in yaml.safe_load_all(charted) if d],
    }


def dashboards(objects):
    """(ConfigMap name, key, parsed dashboard) of every Grafana dashboard ConfigMap."""
    out = []
    for o in objects:
        if o.get("kind") == "ConfigMap" and DASHBOARD_LABEL in o["metadata"].get("labels", {}):
            for key, text in o.get("data", {}).items():
                try:
                    out.append((o["metadata"]["name"], key, json.loads(text)))
                except json.JSONDecodeError as e:
                    fail(f"ConfigMap {o['metadata']['name']} key {key} is not JSON: {e}")
    return out


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


def grafana_to_promql(expr):
    """Grafana's variables replaced by values PromQL accepts."""
    expr = re.sub(r"\$\{?__(rate_interval|interval|range)\}?", "5m", expr)
    return re.sub(r"\$\{?\w+(:\w+)?\}?", "x", expr)


def dashboard_exprs(source, objects):
    for cm, key, dash in dashboards(objects):
        where = f"{source} dashboard {cm}/{key}"
        for p in panels(dash.get("panels", [])):
            for t in p.get("targets", []):
                if t.get("expr"):
                    yield f"{where} panel {p.get('title')!r}", grafana_to_promql(t["expr"])
        for v in dash.get("templating", {}).get("list", []):
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            if v.get("type") == "query" and isinstance(q, str):
                m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q.strip())
                if not m:
                    fail(f"{where} variable {v.get('name')}: only label_values(<selector>, <label>) is checked; got {q!r}")
                yield f"{where} variable {v.get('name')!r}", grafana_to_promql(m.group(1))


def rules(objects):
    for o in objects:
        if o.get("kind") == "PrometheusRule":
            for g in o.get("spec", {}).get("groups", []):
                for r in g.get("rules", []):
                    yield o, g, r


def rule_exprs(source, objects):
    for o, g, r in rules(objects):
        name = r.get("alert") or r.get("record")
        yield f"{source} alert {name} (PrometheusRule {o['metadata']['name']}, group {g.get('name')})", r.get("expr", "")


def metric_names(node, out):
    """Every metric name a parsed PromQL expression selects."""
    import promql_parser as p

    if isinstance(node, p.VectorSelector):
        names = [m.value for m in node.matchers.matchers if m.name == "__name__"]
        if node.name:
            names.append(node.name)
        if not names:
            raise ValueError("a selector without a metric name cannot be checked")
        out.update(names)
    elif isinstance(node, p.MatrixSelector):
        metric_names(node.vector_selector, out)
    elif isinstance(node, p.BinaryExpr):
        metric_names(node.lhs, out)
        metric_names(node.rhs, out)
    elif isinstance(node, p.AggregateExpr):
        metric_names(node.expr, out)
        if node.param is not None:
            metric_names(node.param, out)
    elif isinstance(node, p.Call):
        for a in node.args:
            metric_names(a, out)
    elif isinstance(node, (p.ParenExpr, p.UnaryExpr, p.SubqueryExpr)):
        metric_names(node.expr, out)
    return out


def queries(rendered):
    try:
        import promql_parser
    except ImportError:
        fail("the Python package promql-parser is missing; run scripts/install-tools.sh (make tools)")
    out, errors = [], []
    for source, objects in rendered.items():
        for where, expr in [*rule_exprs(source, objects), *dashboard_exprs(source, objects)]:
            try:
                names = metric_names(promql_parser.parse(expr), set())
            except Exception as e:  # the parser raises ValueError or its own errors
                errors.append(f"{where}: {expr!r} is not valid PromQL: {e}")
                continue
            out.append({"source": where, "expr": expr, "metrics": sorted(names)})
    return out, errors


def anchors(markdown):
    """GitHub's anchors of a markdown file's headings."""
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def unknown(where, obj, allowed):
    if not isinstance(obj, dict):
        return [f"{where}: must be a mapping, got {type(obj).__name__}"]
    return [f"{where}: unknown field {k!r} (allowed: {', '.join(sorted(allowed))})"
            for k in obj if k not in allowed]


def check_rules(source, objects, doc_anchors):
    errors = []
    found = 0
    for o in objects:
        if o.get("kind") != "PrometheusRule":
            continue
        found += 1
        name = f"{source} PrometheusRule {o['metadata']['name']}"
        if o.get("apiVersion") != "monitoring.coreos.com/v1":
            errors.append(f"{name}: apiVersion must be monitoring.coreos.com/v1")
        errors += unknown(f"{name} spec", o.get("spec"), PR_SPEC)
        for gi, g in enumerate(o.get("spec", {}).get("groups", [])):
            errors += unknown(f"{name} groups[{gi}]", g, PR_GROUP)
            for ri, r in enumerate(g.get("rules", [])):
                where = f"{name} groups[{gi}].rules[{ri}] ({r.get('alert') or r.get('record')})"
                errors += unknown(where, r, PR_RULE)
                if ("alert" in r) == ("record" in r):
                    errors.append(f"{where}: needs exactly one of alert and record")
                for key in ("for", "keep_firing_for"):
                    if key in r and not DURATION.match(str(r[key])):
                        errors.append(f"{where}: {key} {r[key]!r} is not a Prometheus duration such as 5m")
                if "alert" not in r:
                    continue
                if r.get("labels", {}).get("severity") not in SEVERITIES:
                    errors.append(f"{where}: labels.severity must be one of {sorted(SEVERITIES)}")
                ann = r.get("annotations", {})
                for key in ("summary", "description", "runbook_url"):
                    if not ann.get(key):
                        errors.append(f"{where}: annotations.{key} is missing")
                m = RUNBOOK.match(ann.get("runbook_url", ""))
                if not m:
                    errors.append(f"{where}: runbook_url {ann.get('runbook_url')!r} must end in "
                                  "docs/troubleshooting.md#<anchor>")
                elif m.group(1) != r["alert"].lower():
                    errors.append(f"{where}: runbook_url anchor #{m.group(1)} must be #{r['alert'].lower()}, "
                                  f"the alert's name in lower case")
                elif m.group(1) not in doc_anchors:
                    errors.append(f"{where}: docs/troubleshooting.md has no heading for #{m.group(1)}; "
                                  f"add `### {r['alert']}` with its runbook")
    if not found:
        errors.append(f"{source}: renders no PrometheusRule")
    return errors


def check_schema(rendered):
    """prometheus-operator's generated validators, through node."""
    node_modules = VENV / "node/node_modules"
    if not (node_modules / "@kubernetes-models/prometheus-operator").is_dir():
        return [f"{node_modules}/@kubernetes-models/prometheus-operator is missing; "
                "run scripts/install-tools.sh (make tools)"]
    objects = [{"source": s, "object": o} for s, objs in rendered.items() for o in objs
               if o.get("kind") in ("PrometheusRule", "ServiceMonitor", "PodMonitor")]
    p = subprocess.run(["node", str(ROOT / "scripts/validate-monitoring.mjs"), str(node_modules)],
                       input=json.dumps(objects), capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        return [line for line in (p.stdout + p.stderr).splitlines() if line.strip()] or ["node failed"]
    return []


def check_servicemonitors(rendered):
    errors = []
    for source, objects in rendered.items():
        if not any(o.get("kind") == "ServiceMonitor" for o in objects):
            errors.append(f"{source}: renders no ServiceMonitor")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(objects, f)
            f.flush()
            p = subprocess.run([sys.executable, str(ROOT / "scripts/check-rendered.py"), "servicemonitor", f.name],
                               capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                errors.append(f"{source}: {p.stdout}{p.stderr}".strip())
    return errors


def check_core_objects(rendered):
    """The objects Kubernetes itself has schemas for, strictly (kubernetes-validate)."""
    errors = []
    for source, objects in rendered.items():
        core = [o for o in objects if not o.get("apiVersion", "").startswith("monitoring.coreos.com/")]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump_all(core, f)
            f.flush()
            p = subprocess.run([tool("kubernetes-validate"), "--strict", "--quiet", f.name],
                               capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                errors.append(f"{source} does not validate: {p.stdout}{p.stderr}".strip())
    return errors


def check_same(rendered):
    errors = []
    if CHART_DASHBOARD.read_bytes() != COMPONENT_DASHBOARD.read_bytes():
        errors.append(f"{CHART_DASHBOARD.relative_to(ROOT)} and {COMPONENT_DASHBOARD.relative_to(ROOT)} differ; "
                      "edit one and copy it over the other")
    chart_groups = yaml.safe_load(CHART_RULES.read_text())["groups"]
    component_groups = yaml.safe_load(COMPONENT_RULES.read_text())["spec"]["groups"]
    if chart_groups != component_groups:
        errors.append(f"the groups of {CHART_RULES.relative_to(ROOT)} and the spec.groups of "
                      f"{COMPONENT_RULES.relative_to(ROOT)} differ; keep them equal")
    dash = {s: [d for _, _, d in dashboards(o)] for s, o in rendered.items()}
    for source, ds in dash.items():
        if len(ds) != 1:
            errors.append(f"{source}: renders {len(ds)} dashboard ConfigMaps, want 1")
    if len({json.dumps(d, sort_keys=True) for d in dash.values()}) > 1:
        errors.append("the chart and manifests/monitoring render different dashboards")
    return errors


# ---- Warning event reasons ----

def rust_sources():
    for path in sorted(SRC.rglob("*.rs")):
        if path.name == "tests.rs" or path.name.endswith("_tests.rs") or "tests" in path.relative_to(SRC).parts:
            continue
        text = path.read_text()
        # Unit tests inline: cut at `#[cfg(test)]` followed by a module.
        m = re.search(r"#\[cfg\(test\)\]\s*(pub(\(crate\))?\s+)?mod\s+\w+\s*\{", text)
        yield path, text[: m.start()] if m else text


def call_args(text, start):
    """The top-level arguments of the call whose `(` is at text[start]."""
    depth, args, cur, i = 0, [], [], start
    in_str = False
    while i < len(text):
        c = text[i]
        if in_str:
            cur.append(c)
            if c == "\\":
                cur.append(text[i + 1])
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
            cur.append(c)
        elif c in "([{":
            depth += 1
            if depth > 1:
                cur.append(c)
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            cur.append(c)
        elif c == "," and depth == 1:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    return args


def warning_reasons():
    """{reason: [file:line, ...]} for every Warning event the code emits, and errors."""
    sources = list(rust_sources())
    consts = {}
    for _, text in sources:
        for m in re.finditer(r'const\s+([A-Z][A-Z0-9_]*)\s*:\s*&(?:\'static\s+)?str\s*=\s*"([^"]*)"\s*;', text):
            consts[m.group(1)] = m.group(2)
    reasons, errors = {}, []

    def resolve(expr, path, text, pos, depth=0):
        """The reasons an argument expression can take."""
        expr = expr.strip().lstrip("&")
        if re.fullmatch(r'"[^"]*"', expr):
            return {expr[1:-1]}
        ident = expr.split("::")[-1]
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", ident):
            if ident in consts:
                return {consts[ident]}
            raise ValueError(f"constant {ident} not found")
        if depth > 3:
            raise ValueError(f"{expr!r} too indirect")
        fn_start = text.rfind("fn ", 0, pos)
        body = text[fn_start:pos]
        sig = re.match(r"fn\s+(\w+)[^(]*\(", body)
        if re.fullmatch(r"\w+\.reason", expr):
            # A struct's `reason` field: every value any `reason: X` initializer gives.
            found = set()
            for _, t in sources:
                for m in re.finditer(r"\breason:\s*([A-Z][A-Z0-9_:]*|\"[^\"]*\")\s*,", t):
                    found |= resolve(m.group(1), path, t, m.start(), depth + 1)
            if not found:
                raise ValueError(f"no `reason:` initializer found for {expr!r}")
            return found
        if re.fullmatch(r"[a-z_]\w*", expr):
            # A local: `let expr = …;` or `let (expr, …) = …;` in the enclosing fn.
            lets = [m for m in re.finditer(r"let\s+(\(?[^=;]*\)?)\s*=\s*", body)
                    if re.search(rf"\b{expr}\b", m.group(1))]
            if lets:
                m = lets[-1]
                stmt = body[m.end():]
                end = stmt.find(";\n")
                stmt = stmt[: end if end >= 0 else len(stmt)]
                pattern = [s.strip() for s in m.group(1).strip("()").split(",")]
                index = pattern.index(expr) if len(pattern) > 1 else None
                found = set()
                if index is None:
                    for c in re.findall(r'"[^"]*"|\b[A-Z][A-Z0-9_]{2,}\b', stmt):
                        found |= resolve(c, path, text, pos, depth + 1)
                    called = re.match(r"\s*(\w+)\(", stmt)
                    if not found and called:
                        # `let reason = pick(…);`: every constant the fn of this
                        # file by that name returns.
                        fn = re.search(rf"\bfn\s+{called.group(1)}\b[^{{]*\{{(.*?)\n\}}", text, re.S)
                        for c in re.findall(r'"[^"]*"|\b[A-Z][A-Z0-9_]{2,}\b', fn.group(1) if fn else ""):
                            found |= resolve(c, path, text, pos, depth + 1)
                else:
                    for t in re.finditer(r"\(\s*(\"[^\"]*\"|[A-Z][A-Z0-9_]*)((?:\s*,\s*(?:\"[^\"]*\"|[A-Z][A-Z0-9_]*))*)", stmt):
                        items = [t.group(1)] + re.findall(r'"[^"]*"|[A-Z][A-Z0-9_]*', t.group(2))
                        if index < len(items):
                            found |= resolve(items[index], path, text, pos, depth + 1)
                if not found:
                    raise ValueError(f"`let {m.group(1)}` gives {expr} no string constant")
                return found
            # A parameter of the enclosing fn: what its callers in this file pass.
            if sig and re.search(rf"\b{expr}\s*:", body[: body.find("{")]):
                params = [a.split(":")[0].strip() for a in call_args(body, body.find("("))]
                params = [p for p in params if p and not p.endswith("self")]
                index = params.index(expr)
                found = set()
                for call in re.finditer(rf"\.{sig.group(1)}\(", text):
                    args = call_args(text, call.end() - 1)
                    if index < len(args):
                        found |= resolve(args[index], path, text, call.start(), depth + 1)
                if not found:
                    raise ValueError(f"no caller of {sig.group(1)} passes {expr}")
                return found
        raise ValueError(f"cannot resolve {expr!r}")

    for path, text in sources:
        for m in re.finditer(r"\.warning\(", text):
            args = call_args(text, m.end() - 1)
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            if len(args) < 2:
                errors.append(f"{where}: cannot read the arguments of .warning(")
                continue
            try:
                for r in resolve(args[1], path, text, m.start()):
                    reasons.setdefault(r, []).append(where)
            except ValueError as e:
                errors.append(f"{where}: the Warning reason {args[1]!r}: {e}; give it a `const NAME: &str` "
                              "or teach scripts/check-observability.py how to find it")
    return reasons, errors


def check_event_reasons():
    reasons, errors = warning_reasons()
    if len(reasons) < 5:
        errors.append(f"found only {len(reasons)} Warning reasons in {SRC.relative_to(ROOT)}; the scan is broken")
    text = TROUBLESHOOTING.read_text()
    start = text.find(f"\n{EVENTS_SECTION}\n")
    if start < 0:
        return errors + [f"docs/troubleshooting.md has no `{EVENTS_SECTION}` section"]
    rest = text[start + 1:]
    nxt = re.search(r"^## ", rest[3:], re.M)
    section = rest[: nxt.start() + 3] if nxt else rest
    documented = set(re.findall(r"^### `?(\w+)`?\s*$", section, re.M))
    for reason, where in sorted(reasons.items()):
        if reason not in documented:
            errors.append(f"Warning event reason {reason!r} (emitted at {', '.join(where)}) has no "
                          f"`### {reason}` entry under `{EVENTS_SECTION}` in docs/troubleshooting.md: "
                          "say what causes it and what to do")
    for reason in sorted(documented - set(reasons)):
        errors.append(f"docs/troubleshooting.md documents Warning reason {reason!r}, which the code never emits; "
                      "remove it or fix its spelling")
    return errors


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "used-metrics":
        out, errors = queries(render())
        if errors:
            fail("\n".join(errors))
        json.dump(out, sys.stdout, indent=1)
        print()
    elif cmd == "event-reasons":
        errors = check_event_reasons()
        if errors:
            fail("\n".join(errors))
        print("check-observability: every Warning event reason has its entry in docs/troubleshooting.md")
    elif cmd == "lint":
        rendered = render()
        out, errors = queries(rendered)
        doc_anchors = anchors(TROUBLESHOOTING.read_text())
        for source, objects in rendered.items():
            errors += check_rules(source, objects, doc_anchors)
        errors += check_schema(rendered)
        errors += check_servicemonitors(rendered)
        errors += check_core_objects(rendered)
        errors += check_same(rendered)
        errors += check_event_reasons()
        if errors:
            fail("\n".join(errors))
        print(f"check-observability: {len(out)} PromQL expressions parse; rules, ServiceMonitors and dashboards "
              "of the chart and manifests/monitoring validate and agree; every alert and Warning reason "
              "has its runbook")
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
