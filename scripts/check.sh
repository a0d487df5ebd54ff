#!/usr/bin/env bash
# Types and lint: ruff on the tree; mypy --strict on the package as it installs (one import name,
# so worker/, shaders/ and kernel_provider/ are seen inside remote_magic/, as setuptools maps them).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check .
mirror="$(mktemp -d)"
trap 'rm -rf "$mirror"' EXIT
mkdir "$mirror/remote_magic"
for entry in remote_magic/*.py remote_magic/*/; do ln -s "$PWD/${entry%/}" "$mirror/remote_magic/"; done
for folder in worker shaders kernel_provider; do ln -s "$PWD/$folder" "$mirror/remote_magic/$folder"; done
repo="$PWD"
cd "$mirror"
python -m mypy --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" --strict -p remote_magic
