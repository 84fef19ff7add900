#!/usr/bin/env bash
# The one pipeline's device entry point: tests/gpu, then scripts/bench_one_pipeline.py.
#
#   bash scripts/gpu_pipeline.sh pack    development machine, repo root: the setup script alone into .gpu/kitsh;
#                                        tar the two detectors, vtest.avi and the asset images from ../shared/assets
#                                        and split the tar into .gpu/gp1 .. .gpu/gpN (git-excluded), to ride along
#                                        with the GPU kit's .gpu/ort1 .. .gpu/ort5 runs (64 MiB per run with the
#                                        tree; the chain is in docs/gpu-pipeline.md)
#   bash scripts/gpu_pipeline.sh run     GPU machine, after `source .gpu/kitsh/device-setup.sh`: collect the parts
#                                        sent so far; once all parts and the GPU stack are there, run the tests
#                                        and the benchmark, writing logs and JSON to $OUT (or ./gpu-pipeline-out)
#   bash scripts/gpu_pipeline.sh check   GPU machine, the parts collected: tests/gpu, then `update` below (a change to the
#                                        model update or the GPU processor lands on both)
#   bash scripts/gpu_pipeline.sh bench [--steps ...]   the benchmark alone (the parts already collected)
#   bash scripts/gpu_pipeline.sh update  GPU machine, the parts collected: scripts/bench_model_update.py on ONNX
#                                        Runtime CUDA with the GPU processor (FRAMES=20000, a model at frame 2000),
#                                        then scripts/probe_first_batch.py (a slot's first batch on a new thread)
# With EDGERT_ASSETS already pointing at a full assets folder, `run` skips the parts. Runs that carry .gpu/kp1..3
# (scripts/gpu_ort_kit.sh pack) bring the GPU stack and the assets in three runs, without device-setup.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd="${1:-run}"
if [ "$cmd" = pack ]; then
  mkdir -p .gpu/kitsh && cp ../shared/gpu/device-setup.sh .gpu/kitsh/  # the setup alone, for runs with no room for .gpu/kit
  source scripts/gpu_stage_assets.sh
  STAGE_NAME=gp exec bash scripts/gpu_stage_assets.sh pack "${PIPELINE_ASSETS[@]}"
fi

out="${OUT:-gpu-pipeline-out}"
mkdir -p "$out"
if compgen -G ".gpu/kp[0-9]*" > /dev/null || [ -d /tmp/edgert-kp-parts ]; then  # the three-run kit (gpu_ort_kit.sh)
  bash scripts/gpu_ort_kit.sh unpack
  case $? in 0) ;; 3) exit 0 ;; *) exit 1 ;; esac
  export PYTHONPATH="/tmp/gpusite${PYTHONPATH:+:$PYTHONPATH}"
fi
source scripts/gpu_stage_assets.sh
gpu_ready gp
case $? in 0) ;; 3) exit 0 ;; *) exit 1 ;; esac  # 3: more parts (or the GPU stack) to come in the next run
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap,power.draw,clocks.sm --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
if [ "$cmd" = run ] || [ "$cmd" = check ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu -rs 2>&1 | tee "$out/tests_gpu.log" | tail -25
fi
if [ "$cmd" = update ] || [ "$cmd" = check ]; then  # a model dropped into a running GPU-processor pipeline on ONNX Runtime CUDA
  python3 scripts/bench_model_update.py --backend onnxruntime-cuda --processing gpu --frames "${FRAMES:-20000}" \
    --drop-at 2000 --out "$out/model-update-ort-cuda.json" 2>&1 | tee "$out/update.log" | tail -40
  # what the stall at the swap is made of: a slot's first batch on a thread other than the warm-up's
  python3 scripts/probe_first_batch.py --out "$out/probe-first-batch.json" 2>&1 | tee "$out/probe.log" | tail -12
  exit
fi
python3 scripts/bench_one_pipeline.py --out "$out/one_pipeline.json" "${@:2}" 2>&1 | tee "$out/bench.log" | grep -v "^INFO"
