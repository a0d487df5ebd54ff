#!/usr/bin/env bash
# Install remote-magic and what it needs into ./.venv (creating it), on a fresh Debian machine too.
# Usage: bash scripts/setup.sh [EXTRAS]   `worker` for remote-worker, `test` for the test suite (worker included)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extras="${1:-}"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c "import ensurepip" 2>/dev/null; then
    echo "setup: installing python3-venv" >&2
    as_root apt-get update -q && as_root apt-get install -y -q python3-venv python3-pip
fi
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}"
