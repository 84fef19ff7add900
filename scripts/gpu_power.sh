#!/usr/bin/env bash
# Power on the GPU machine (issue 6): NVML watts and mJ/frame of a detector through the ONNX Runtime CUDA
# session, and power-budget runs set below the unconstrained draw. Run ON THE GPU MACHINE from the repo root,
# in a run where the GPU kit is already installed (e.g. right after scripts/gpu_check.sh or gpu_pipeline.sh,
# while the machine is still warm; send .gpu/kit with the run):
#
#   source .gpu/kit/device-setup.sh; bash scripts/gpu_power.sh
#
# Writes $OUT/gpu_power.json (or ./gpu-power-out), $OUT/gpu_power.log and $OUT/nvidia-smi*.txt. About 2 minutes:
# 5 s idle, 15 s flat out, an 8 s `edgert bench --power`, two 40 s budget runs. Extra arguments go to
# scripts/gpu_power.py (e.g. --levels 0.5 --budget-s 60). Never fails silently: whatever happens, the JSON says
# what ran and why not.
#   Without onnxruntime-gpu (kit not installed), the load is a torch conv stack instead (torch is on the image);
#   without the assets (/tmp/edgert-assets from gpu_stage_assets.sh, /tmp/edgert-gp-assets from gpu_pipeline.sh,
#   or $EDGERT_ASSETS) a synthetic ONNX convolution model stands in. The JSON records which.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-power-out}"
mkdir -p "$out"
if [ -z "${EDGERT_ASSETS:-}" ]; then
  for d in /tmp/edgert-assets /tmp/edgert-gp-assets; do
    [ -f "$d/models/detection/yolov8s-fall-640.onnx" ] && { export EDGERT_ASSETS="$d"; break; }
  done
fi
if [ -z "${EDGERT_ASSETS:-}" ] && ls -d .gpu/assets[0-9]* >/dev/null 2>&1; then
  bash scripts/gpu_stage_assets.sh unpack && export EDGERT_ASSETS=/tmp/edgert-assets
fi
[ -f /tmp/gpusite/.done ] && case ":${PYTHONPATH:-}:" in *:/tmp/gpusite:*) ;; *) export PYTHONPATH="/tmp/gpusite${PYTHONPATH:+:$PYTHONPATH}";; esac
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
echo "gpu_power: assets ${EDGERT_ASSETS:-none}; GPU stack $([ -f /tmp/gpusite/.done ] && echo ready || echo 'not installed (torch stands in)')"
nvidia-smi --query-gpu=name,driver_version,power.draw,power.limit,clocks.sm,temperature.gpu --format=csv 2>&1 \
  | tee "$out/nvidia-smi-before.txt"
python3 -c "import pynvml; print('nvidia-ml-py', getattr(pynvml, '__version__', '?'))" 2>&1 | tee "$out/versions.txt"
python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())" 2>&1 \
  | tee -a "$out/versions.txt"
python3 -m edgert.cli.main power --meter nvml 2>&1 | tee "$out/edgert_power.txt"
timeout 500 python3 scripts/gpu_power.py --out "$out/gpu_power.json" "$@" 2>&1 | tee "$out/gpu_power.log" | grep -v "^INFO"
rc=${PIPESTATUS[0]}
nvidia-smi --query-gpu=name,power.draw,clocks.sm,temperature.gpu --format=csv > "$out/nvidia-smi-after.txt" 2>&1
echo "gpu_power: exit $rc; results in $out/gpu_power.json"
exit "$rc"
