#!/usr/bin/env bash
# Installs moto (the AWS mock the tests run against) into a project-local
# virtualenv at <repo>/.venv, so tests never depend on what the machine's
# global Python happens to have. Idempotent: re-running is a cheap no-op
# when the pinned version is already installed.
#
# Environment:
#   PYTHON        interpreter used to create the venv (default: python3)
#   MOTO_VERSION  moto version to pin (default: the one the tests are written for)
set -euo pipefail

MOTO_VERSION="${MOTO_VERSION:-5.2.5}"
PYTHON="${PYTHON:-python3}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${repo_root}/.venv"

if ! command -v "${PYTHON}" >/dev/null 2>&1; then
    echo "install-moto: ${PYTHON} not found; install Python 3 (with the venv module) first" >&2
    exit 1
fi

# Prints the installed moto version, or nothing when moto is absent or broken.
installed_version() {
    if [[ -x "${venv}/bin/python" ]]; then
        "${venv}/bin/python" -c 'import importlib.metadata as m; print(m.version("moto"))' 2>/dev/null || true
    fi
}

if [[ -x "${venv}/bin/moto_server" && "$(installed_version)" == "${MOTO_VERSION}" ]]; then
    echo "install-moto: moto ${MOTO_VERSION} already installed in ${venv}"
    exit 0
fi

# A venv whose interpreter no longer runs (the repo moved, or the Python it
# was made from was removed) cannot be repaired in place: make it afresh.
if [[ -e "${venv}" ]] && ! "${venv}/bin/python" -c '' >/dev/null 2>&1; then
    echo "install-moto: ${venv} exists but its python does not run; recreating it"
    rm -rf "${venv}"
fi

if [[ ! -x "${venv}/bin/python" ]]; then
    echo "install-moto: creating virtualenv ${venv}"
    if ! "${PYTHON}" -m venv "${venv}"; then
        echo "install-moto: '${PYTHON} -m venv' failed; on Debian/Ubuntu install the python3-venv package" >&2
        exit 1
    fi
fi

echo "install-moto: installing moto[server]==${MOTO_VERSION} into ${venv}"
"${venv}/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==${MOTO_VERSION}"

if [[ ! -x "${venv}/bin/moto_server" ]]; then
    echo "install-moto: pip finished but ${venv}/bin/moto_server is missing" >&2
    exit 1
fi
echo "install-moto: moto $(installed_version) ready at ${venv}/bin/moto_server"
