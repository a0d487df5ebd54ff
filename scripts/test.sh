#!/usr/bin/env bash
# The whole test suite, on a fresh Debian machine too: installs what it needs, then runs pytest.
# GPU tests run WGSL on a real wgpu adapter; without a GPU that is Mesa's lavapipe (mesa-vulkan-drivers). The
# browser-tab tests drive Debian's Chromium through Playwright (its WebGPU is SwiftShader without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

missing=()
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)  # Mesa's lavapipe
command -v ip >/dev/null 2>&1 || missing+=(iproute2)  # network namespaces for the slow and lossy links
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # a real browser for the browser-tab workers' tests
command -v clang >/dev/null 2>&1 || missing+=(clang)  # tinygrad's CPU device, which tinygrad's test_ops.py uses too
if [ ${#missing[@]} -gt 0 ]; then
    echo "test: installing ${missing[*]}" >&2
    as_root apt-get update -q && as_root apt-get install -y -q "${missing[@]}"
fi
bash scripts/setup.sh test
export PATH="$PWD/.venv/bin:$PATH"
# In CI a missing GPU adapter (or Chromium) fails the GPU tests instead of skipping them.
if [ "${CI:-}" = "true" ]; then export REMOTE_MAGIC_REQUIRE_GPU=1; fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
# The suite starts hundreds of Python processes (workers, executors, kernels, venvs' interpreters): with bytecode
# caching turned off in the environment, each would compile every module it imports from source again.
unset PYTHONDONTWRITEBYTECODE
bash scripts/check.sh    # ruff, and mypy --strict on the package
# Three processes, one test file each at a time: a test often waits on the workers, kernels, browsers and
# emulated links it started, so two processes left a 2-core machine's CPUs idle a sixth of the time, and three
# keep them busy. Files go out in collection order, which puts the longest first (tests/conftest.py,
# LONGEST_FILES), so the run doesn't end on one long file while the other processes idle.
# REMOTE_MAGIC_TEST_PROCESSES=1 runs everything in one process.
exec python -m pytest -n "${REMOTE_MAGIC_TEST_PROCESSES:-3}" --dist loadfile --no-loadscope-reorder "$@"
