#!/usr/bin/env bash
# The monitoring files, offline (scripts/check-observability.py lint): the
# PromQL of the alerts and the Grafana dashboard parses (promql-parser); the
# chart's monitoring templates and manifests/monitoring render the same rules
# and dashboard from equal files; PrometheusRule and ServiceMonitor objects
# validate against prometheus-operator's schema (scripts/validate-monitoring.mjs)
# and a strict field check; every alert has a runbook in
# docs/troubleshooting.md, and so does every Warning event reason the code
# emits. That the queried metrics are the ones the binary serves is checked by
# the integration test crates/aws-ccm/tests/ccm/observability.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/check-observability.py lint
