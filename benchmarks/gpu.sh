#!/usr/bin/env bash
# BERT-base pretraining steps on one GPU, bertkit beside transformers (a few minutes).
# Exits 0 with a message on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "benchmarks/gpu.sh: no GPU visible to torch on this machine; skipping"
  exit 0
fi
exec timeout 300 "$PY" benchmarks/gpu_pretrain.py "$@"
