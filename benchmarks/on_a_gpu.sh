#!/usr/bin/env bash
# The GPU benchmarks in one run, for a machine with a real GPU that is lent for minutes at a time (issue 31's open
# goal first). On the GPU machine, in the repository's root:
#
#     bash benchmarks/on_a_gpu.sh          # updates benchmarks/results.md; with OUT set, copies it and the log there
#
# It needs a Python 3.12 with PyTorch (CUDA) and numpy. What that Python lacks travels as wheels in .whl/, and a
# Vulkan loader as Debian packages in .gl/ where the machine has none; both are made here, where pip and apt reach
# their registries, at the versions .venv has (scripts/setup.sh test made it), by
#
#     bash benchmarks/on_a_gpu.sh --prepare
#
# What it runs, in order of what the open goal needs to know:
# 1. where a warm step's time goes on the GPU (each kernel's GPU time, and the rest: Python, submits, the wait);
# 2. the ML table (tinygrad on the worker's GPU beside PyTorch on the same GPU);
# 3. the matmul tilings by shape. (tinygrad's kernel search over the block ran past 5 minutes on an H200: not here.)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
    PYTHON="${PYTHON:-.venv/bin/python}"
    grep -qx '/.whl/' .git/info/exclude || echo /.whl/ >> .git/info/exclude
    grep -qx '/.gl/' .git/info/exclude || echo /.gl/ >> .git/info/exclude
    rm -rf .whl && mkdir -p .whl .gl /tmp/amd64/partial
    "$PYTHON" -m pip wheel -q --no-deps -w .whl .
    pins=$("$PYTHON" -m pip freeze | grep -iE '^(wgpu|cffi|pycparser|tinygrad|pyzmq|zstandard)==' || true)
    # shellcheck disable=SC2086  # (one argument per pin)
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $pins
    apt_amd64=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
    apt-get "${apt_amd64[@]}" update -q
    (cd .gl && apt-get "${apt_amd64[@]}" download libvulkan1)
    ls .whl .gl
    exit 0
fi
PYTHON="${PYTHON:-python3}"

if ! ldconfig -p | grep -q libvulkan && compgen -G ".gl/*.deb" >/dev/null; then
    for deb in .gl/*.deb; do dpkg -x "$deb" /; done
    ldconfig
fi
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
log="${OUT:-/tmp}/on_a_gpu.log"
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    "$PYTHON" benchmarks/bench_ml.py --kernel-times block,mlp --repeat 5
    "$PYTHON" benchmarks/bench_ml.py --tab-models= --repeat 9
    "$PYTHON" benchmarks/bench_matmul_tiles.py
} 2>&1 | tee "$log"
if [ -n "${OUT:-}" ]; then cp benchmarks/results.md "$OUT/"; fi
