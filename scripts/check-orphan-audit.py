#!/usr/bin/env python3
"""Every CCM integration test ends with the orphan audit (issue 18).

A `#[tokio::test]` in crates/aws-ccm/tests/ccm/ that binds a test world
(`let env`, `let (env, ...)`, `let mut env`) must call `env.finish()`, the
audit by `aws-ccm orphans`' own code, or say why not with a comment
`// orphan audit: <reason>`. `--fix` turns a final `Ok(())` into
`env.finish().await` where that is all it takes.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
TESTS = ROOT / "crates/aws-ccm/tests/ccm"
BINDS_ENV = re.compile(r"let\s+(mut\s+)?(env\b|\(\s*env\b)")
AUDITED = re.compile(r"env\s*\.\s*finish\s*\(|// orphan audit: \S")


def test_functions(text):
    """(name, start, end) of each #[tokio::test] function body."""
    for m in re.finditer(r"#\[tokio::test[^\]]*\]\s*(?:#\[[^\]]*\]\s*)*async fn (\w+)", text):
        open_at = text.index("{", m.end())
        yield m.group(1), open_at, block_end(text, open_at)


def block_end(text, i):
    """Index of the brace closing the block opened at `i`, skipping strings,
    char literals and comments."""
    depth = 0
    while i < len(text):
        c = text[i]
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        raw = re.match(r'r(#*)"', text[i:]) if c == "r" and not text[i - 1].isalnum() else None
        if raw:
            i = text.index('"' + raw.group(1), i + len(raw.group(0))) + len(raw.group(0)) - 1
            continue
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            i += len(re.match(r"'(\\.|[^\\'])'", text[i:]).group(0)) - 1
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


def main():
    fix = "--fix" in sys.argv
    missing = []
    for path in sorted(TESTS.glob("*.rs")):
        text = path.read_text()
        edits = []
        for name, start, end in test_functions(text):
            body = text[start:end]
            if not BINDS_ENV.search(body) or AUDITED.search(body):
                continue
            tail = re.search(r"\n(\s*)Ok\(\(\)\)\s*$", body)
            if fix and tail:
                edits.append((start + tail.start(), start + len(body), f"\n{tail.group(1)}env.finish().await\n"))
            else:
                missing.append(f"{path.relative_to(ROOT)}: {name}")
        for a, b, new in reversed(edits):
            text = text[:a] + new + text[b:]
        if edits:
            path.write_text(text)
    if missing:
        print("check-orphan-audit: these tests end without the orphan audit; end them with "
              "`env.finish().await` or say why not in a `// orphan audit: <reason>` comment:")
        for m in missing:
            print(f"  {m}")
        return 1
    print("check-orphan-audit: every CCM integration test ends with the orphan audit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
