#!/usr/bin/env bash
# GPU check of edgert's CUDA runtime path, run ON THE GPU MACHINE from the repo root, e.g. through the device
# tool:  source .gpu/kit/device-setup.sh; bash scripts/gpu_check.sh
# Needs: pycuda + onnxruntime-gpu on PYTHONPATH (../shared/gpu kit), the assets under $EDGERT_ASSETS
# (or split into .gpu/assets* parts by scripts/gpu_stage_assets.sh, reassembled here).
# Writes $OUT/gpu_check.json (or ./gpu-check-out) and prints a summary.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
if [ -z "${EDGERT_ASSETS:-}" ] || [ ! -f "${EDGERT_ASSETS}/README.md" ]; then
  bash scripts/gpu_stage_assets.sh unpack || exit 1
  export EDGERT_ASSETS=/tmp/edgert-assets
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap,power.draw --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
python3 -c "import onnxruntime as o, pycuda; print('onnxruntime', o.__version__, o.get_available_providers())"
python3 -m edgert.cli.main info 2>&1 | tail -6
python3 scripts/gpu_check.py "$out" 2>&1 | tee "$out/gpu_check.log"
