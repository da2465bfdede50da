#!/usr/bin/env bash
# The kubeadm configs of docs/install-kubeadm.md, offline: see
# scripts/check-kubeadm.py.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/check-kubeadm.py
