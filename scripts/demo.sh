#!/usr/bin/env bash
# The main job: install, start a local remote-worker, offload notebook cells to it, show what came back.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh worker
export PATH="$PWD/.venv/bin:$PATH"
exec python examples/demo.py
