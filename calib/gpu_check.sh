#!/usr/bin/env bash
# Single-GPU check: bash calib/gpu_check.sh OUT_DIR  (≤ 8 min on one H200; fails at once without a GPU)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: calib/gpu_check.sh OUT_DIR" >&2; exit 2; }
cd "$(dirname "$0")/.."
PYTHONUNBUFFERED=1 exec python3 -m calib.gpu_check "$@"
