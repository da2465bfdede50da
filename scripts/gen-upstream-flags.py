#!/usr/bin/env python3
"""Lists what an operator can hand the Go aws-cloud-controller-manager, read
from the Go sources it is built from, into crates/aws-ccm/tests/data/:
- upstream-flags.json: every command-line flag it registers;
- upstream-cloud-config.json: every cloud.conf section and key (the fields
  of its gcfg struct, pkg/providers/v1/config/config.go);
- upstream-annotations.json: every service.beta.kubernetes.io/* annotation
  its code names.
crates/aws-ccm/tests/upstream_flags.rs then checks that this binary accepts
each one and that the reference pages (docs/flags.md, docs/cloud-config.md,
docs/annotations.md) name it.

The sources are the modules at the versions cloud-provider-aws's go.mod pins
(k8s.io/cloud-provider, controller-manager, component-base, apiserver at
v0.36.0) and cloud-provider-aws itself. They are read from bare git mirrors
(`fetch github:kubernetes/<repo>` puts them under /work/.mirror); no Go
toolchain is needed. Only the functions the Go CCM's command calls to
register flags are read (FUNCTIONS below, following
cloud-provider app.NewCloudControllerManagerCommand), so flags of other
components in the same files are not listed.

Usage: gen-upstream-flags.py [--mirrors DIR] [--check]
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "crates" / "aws-ccm" / "tests" / "data"
OUT = DATA / "upstream-flags.json"
CLOUD_CONFIG = ("cloud-provider-aws", "HEAD", "pkg/providers/v1/config/config.go")
MODULE_VERSION = "v0.36.0"

# (repository, revision, file, receiver type or "" for a function, function)
FUNCTIONS = [
    ("cloud-provider", MODULE_VERSION, "options/options.go", "CloudControllerManagerOptions", "Flags"),
    ("cloud-provider", MODULE_VERSION, "options/kubecloudshared.go", "KubeCloudSharedOptions", "AddFlags"),
    ("cloud-provider", MODULE_VERSION, "options/cloudprovider.go", "CloudProviderOptions", "AddFlags"),
    ("cloud-provider", MODULE_VERSION, "options/nodecontroller.go", "NodeControllerOptions", "AddFlags"),
    ("cloud-provider", MODULE_VERSION, "options/servicecontroller.go", "ServiceControllerOptions", "AddFlags"),
    ("cloud-provider", MODULE_VERSION, "options/webhook.go", "WebhookOptions", "AddFlags"),
    ("cloud-provider", MODULE_VERSION, "options/webhook.go", "WebhookServingOptions", "AddFlags"),
    ("controller-manager", MODULE_VERSION, "options/generic.go", "GenericControllerManagerConfigurationOptions", "AddFlags"),
    ("controller-manager", MODULE_VERSION, "options/debugging.go", "DebuggingOptions", "AddFlags"),
    ("controller-manager", MODULE_VERSION, "pkg/leadermigration/options/options.go", "LeaderMigrationOptions", "AddFlags"),
    ("component-base", MODULE_VERSION, "config/options/leaderelectionconfig.go", "", "BindLeaderElectionFlags"),
    ("component-base", MODULE_VERSION, "version/verflag/verflag.go", "", "AddFlags"),
    ("component-base", MODULE_VERSION, "logs/api/v1/options.go", "", "addFlags"),
    ("component-base", MODULE_VERSION, "cli/globalflag/globalflags.go", "", "AddGlobalFlags"),
    ("component-base", MODULE_VERSION, "featuregate/feature_gate.go", "featureGate", "AddFlag"),
    ("apiserver", MODULE_VERSION, "pkg/server/options/serving.go", "SecureServingOptions", "AddFlags"),
    ("apiserver", MODULE_VERSION, "pkg/server/options/authentication.go", "RequestHeaderAuthenticationOptions", "AddFlags"),
    ("apiserver", MODULE_VERSION, "pkg/server/options/authentication.go", "ClientCertAuthenticationOptions", "AddFlags"),
    ("apiserver", MODULE_VERSION, "pkg/server/options/authentication.go", "DelegatingAuthenticationOptions", "AddFlags"),
    ("apiserver", MODULE_VERSION, "pkg/server/options/authorization.go", "DelegatingAuthorizationOptions", "AddFlags"),
    ("cloud-provider-aws", "HEAD", "pkg/controllers/options/tagging_controller.go", "TaggingControllerOptions", "AddFlags"),
]

# Flag names given as constants rather than literals, and where they are defined.
CONSTANTS = {
    "LogFlushFreqFlagName": ("component-base", MODULE_VERSION, "logs/api/v1/options.go"),
    "flagName": ("component-base", MODULE_VERSION, "featuregate/feature_gate.go"),
    "versionFlagName": ("component-base", MODULE_VERSION, "version/verflag/verflag.go"),
}

# Registered only when the JSON log format is linked in; the Go CCM links
# only the text format (see docs/flags.md, --logging-format).
CONDITIONAL = {"log-json-split-stream", "log-json-info-buffer-size"}

KINDS = ("StringSlice", "StringArray", "StringToString", "Int32Slice", "IntSlice", "String", "Bool", "Int32",
         "Int64", "Int", "Uint32", "Uint", "Float32", "Float64", "Duration", "IPNet", "IP", "")
CALL = re.compile(r"\.(" + "|".join(k for k in KINDS if k) + r"|Var)(Var)?(P)?\(")
# `fs.AddFlag(flag.Lookup(name))`: a flag defined elsewhere, added by name.
LOOKUP = re.compile(r"\.AddFlag\(\w+\.Lookup\((\w+)\)\)")


def show(mirrors: Path, repo: str, rev: str, path: str) -> str:
    git_dir = mirrors / f"kubernetes+{repo}" / "repo"
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"{rev}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def body(source: str, receiver: str, name: str) -> tuple[str, int]:
    recv = rf"\(\w+ \*?{receiver}\) " if receiver else ""
    m = re.search(rf"^func {recv}{name}\(", source, re.M)
    if not m:
        raise SystemExit(f"gen-upstream-flags: func {receiver}.{name} not found")
    end = source.index("\n}\n", m.start())
    return source[m.start():end], source[:m.start()].count("\n") + 1


def constant(mirrors: Path, name: str) -> str:
    repo, rev, path = CONSTANTS[name]
    m = re.search(rf"\b{name}\s*=\s*\"([^\"]+)\"", show(mirrors, repo, rev, path))
    if not m:
        raise SystemExit(f"gen-upstream-flags: constant {name} not found in {path}")
    return m.group(1)


def flags_in(text: str, first_line: int, mirrors: Path):
    for m in LOOKUP.finditer(text):
        if m.group(1) in CONSTANTS:
            yield constant(mirrors, m.group(1)), "Value", first_line + text[:m.start()].count("\n")
    for m in CALL.finditer(text):
        kind = m.group(1)
        args = text[m.end():m.end() + 400]
        literal = re.match(r"\s*(?:[^,\"()]|\([^()]*(?:\([^()]*\)[^()]*)*\))*,\s*\"([a-z][a-z0-9-]*)\"", args) \
            if (m.group(2) or kind == "Var") else re.match(r"\s*\"([a-z][a-z0-9-]*)\"", args)
        if literal:
            name = literal.group(1)
        else:
            ident = re.match(r"\s*(?:[^,]*,\s*)?(?:\w+\.)?(\w+)\s*,", args)
            if not (ident and ident.group(1) in CONSTANTS):
                continue
            name = constant(mirrors, ident.group(1))
        line = first_line + text[:m.start()].count("\n")
        yield name, ("Value" if kind == "Var" else kind), line


def collect(mirrors: Path) -> list[dict]:
    flags: dict[str, dict] = {}
    for repo, rev, path, receiver, func in FUNCTIONS:
        text, first = body(show(mirrors, repo, rev, path), receiver, func)
        for name, kind, line in flags_in(text, first, mirrors):
            flags.setdefault(name, {
                "flag": name,
                "type": kind,
                "source": f"{repo}@{rev} {path}:{line}",
                "conditional": name in CONDITIONAL,
            })
    return sorted(flags.values(), key=lambda f: f["flag"])


def cloud_config_keys(mirrors: Path) -> list[dict]:
    """The gcfg sections (struct fields of CloudConfig) and their keys."""
    repo, rev, path = CLOUD_CONFIG
    source = show(mirrors, repo, rev, path)
    start = source.index("type CloudConfig struct {")
    out = []
    section = None
    depth = 0
    for number, line in enumerate(source[start:].splitlines(), source[:start].count("\n") + 1):
        code = line.split("//", 1)[0]
        opened = re.match(r"^\t(\w+)\s+(?:map\[string\]\*)?struct \{", code)
        if depth == 1 and opened:
            section = opened.group(1)
        field = re.match(r"^\t\t(\w+)\s+(\[\]|\*)?(\w+)", code)
        if depth == 2 and section and field:
            out.append({"section": section, "key": field.group(1), "type": field.group(3),
                        "source": f"{repo}@{rev} {path}:{number}"})
        depth += code.count("{") - code.count("}")
        if depth == 0 and section:
            break
    return out


def annotations(mirrors: Path) -> list[dict]:
    """Every annotation string literal in the Go CCM's non-test code."""
    git_dir = mirrors / "kubernetes+cloud-provider-aws" / "repo"
    grep = subprocess.run(["git", "--git-dir", str(git_dir), "grep", "-n", "-o", "-E",
                           r'"service\.beta\.kubernetes\.io/[a-z0-9-]+"', "HEAD", "--", "pkg/*.go",
                           ":!*_test.go"], check=True, capture_output=True, text=True).stdout
    found: dict[str, str] = {}
    for hit in grep.splitlines():
        _, path, line, literal = hit.split(":", 3)
        found.setdefault(literal.strip('"'), f"cloud-provider-aws@HEAD {path}:{line}")
    return [{"annotation": name, "source": src} for name, src in sorted(found.items())]


def main() -> int:
    args = sys.argv[1:]
    mirrors = Path(args[args.index("--mirrors") + 1]) if "--mirrors" in args else Path("/work/.mirror")
    outputs = {
        OUT: collect(mirrors),
        DATA / "upstream-cloud-config.json": cloud_config_keys(mirrors),
        DATA / "upstream-annotations.json": annotations(mirrors),
    }
    stale = []
    for path, data in outputs.items():
        text = json.dumps(data, indent=1) + "\n"
        if "--check" in args:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
            continue
        path.write_text(text)
        print(f"gen-upstream-flags: {len(data)} entries -> {path.relative_to(ROOT)}")
    if stale:
        print(f"gen-upstream-flags: stale {', '.join(stale)}; run scripts/gen-upstream-flags.py", file=sys.stderr)
        return 1
    if "--check" in args:
        print("gen-upstream-flags: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
