#!/usr/bin/env bash
# On a GPU host (no install, no network): packtrain from src/, carried wheels from .whl/ (or $WHEELHOUSE: the folder
# `make wheelhouse` wrote, docs/install.md), then `python -m bench`.
#   bash bench/gpu_env.sh SUITE [--smoke] --out $OUT/... [ARGS]     e.g. bash bench/gpu_env.sh fp8 --out $OUT
set -eu
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD/src
export TORCH_EXTENSIONS_DIR=/tmp/torch_ext TORCH_CUDA_ARCH_LIST=9.0   # "9.0a" breaks DeepSpeed's FusedAdam build
WHEELHOUSE=${WHEELHOUSE:-.whl}
if [ -d "$WHEELHOUSE" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELHOUSE"/*.whl
  export PYTHONPATH=$PWD/src:/tmp/site
fi
exec python3 -m bench "$@"
