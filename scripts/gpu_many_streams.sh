#!/usr/bin/env bash
# Many streams at a camera's rate and at the engine's, on the GPU machine (docs/pipeline.md's figures for
# several sources).
#
#   bash scripts/gpu_many_streams.sh pack      development machine, repo root: tar the two detectors, vtest.avi and
#                                              two images from ../shared/assets into .gpu/ms1 (16 MiB, beside the
#                                              kit's .gpu/ort5) and .gpu/ms2 (in a run of its own): with a 9 MiB
#                                              tree, an ort1..ort4 run has no room left for assets
#   bash scripts/gpu_many_streams.sh STEP ...  GPU machine, after `source .gpu/kit/device-setup.sh`: collect the
#                                              parts sent so far, then run each STEP, writing JSON and logs to $OUT
# STEPs:
#   camera   every source a live camera (`--realtime`: vtest.avi at its own 10 fps), 1 and 16 streams, both
#            detectors, the 16 in step (started together) and out of step (`--stagger`, as unsynchronized
#            cameras run): the p99 row of issue 28 as a user with cameras meets it
#   fixed    the 16 cameras in and out of step with every engine call at the full batch (`--fixed-batch`), where
#            the default runs a part batch at its own size (1, 2, 4, 8, 16)
#   rule     the 16 cameras out of step with the batcher's previous straggler rule (launch a part batch while any
#            slot is free, where the default waits while a batch is in flight), from a patched copy of the tree
#   rate     file sources read as fast as the pipeline takes them, 1 / 16 / 32 streams, with the compute-only
#            column (the throughput rows); rate16: 16 streams only
#   tests    tests/gpu
set -uo pipefail
cd "$(dirname "$0")/.."
cmd="${1:-}"
if [ "$cmd" = pack ]; then
  STAGE_NAME=ms PART_MIB="16 52" exec bash scripts/gpu_stage_assets.sh pack README.md models/detection/coco.names \
      models/detection/nanodet-m-416-coco-v8layout.onnx models/detection/yolov8s-fall-640.onnx video/vtest.avi \
      images/bus.jpg images/zidane.jpg images/opencv_hfs_000.jpg
fi
out="${OUT:-gpu-many-streams-out}"
mkdir -p "$out" && out=$(cd "$out" && pwd)
source scripts/gpu_stage_assets.sh
gpu_ready ms
case $? in 0) ;; 3) exit 0 ;; *) exit 1 ;; esac  # 3: more parts (or the GPU stack) to come in the next run
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
models=(nanodet-m-416-coco-v8layout.onnx yolov8s-fall-640.onnx)
bench() { python3 scripts/bench_many_streams.py --tracking off --no-check --models "${models[@]}" "$@"; }
for step in "$@"; do
  case "$step" in
    camera)
      bench --streams 1,16 --frames 300 --run-args=--realtime --out "$out/camera.json" 2>&1 \
        | tee "$out/camera.log" | grep -v '^INFO'
      bench --streams 16 --frames 300 --run-args="--realtime --stagger" --out "$out/camera-stagger.json" 2>&1 \
        | tee "$out/camera-stagger.log" | grep -v '^INFO' ;;
    fixed)
      # Every engine call at the full batch (--fixed-batch), the earlier default: 16 cameras in step and
      # out of step, against the camera step's rows (part batches at their own size)
      bench --streams 16 --frames 300 --run-args="--realtime --fixed-batch" --out "$out/camera-fixed.json" 2>&1 \
        | tee "$out/camera-fixed.log" | grep -v '^INFO'
      bench --streams 16 --frames 300 --run-args="--realtime --stagger --fixed-batch" \
          --out "$out/camera-stagger-fixed.json" 2>&1 | tee "$out/camera-stagger-fixed.log" | grep -v '^INFO' ;;
    rule)
      # The previous rule, from a copy of this tree: the straggler wait ends while any slot is free.
      rm -rf /tmp/rule-other && mkdir -p /tmp/rule-other && cp -r edgert scripts /tmp/rule-other/
      sed -i 's/or seq == self._batches_done:/or seq - self._batches_done < lanes:/' /tmp/rule-other/edgert/pipeline/runner.py
      grep -q 'seq - self._batches_done < lanes' /tmp/rule-other/edgert/pipeline/runner.py || { echo "rule: patch missed"; exit 1; }
      (cd /tmp/rule-other && PYTHONPATH="/tmp/rule-other:/tmp/gpusite" bench --streams 16 --frames 300 \
          --run-args="--realtime --stagger" --out "$out/camera-rule-slotfree.json") 2>&1 \
        | tee "$out/camera-rule-slotfree.log" | grep -v '^INFO' ;;
    rate|rate16)
      streams=1,16,32; [ "$step" = rate16 ] && streams=16
      bench --compute --streams "$streams" --frames 1000 --out "$out/$step.json" 2>&1 | tee "$out/$step.log" \
        | grep -v '^INFO' ;;
    tests) python3 -m pytest -q -p no:cacheprovider tests/gpu -rs 2>&1 | tee "$out/tests_gpu.log" | tail -15 ;;
    *) echo "gpu_many_streams: unknown step $step (camera, fixed, rule, rate, rate16, tests)"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,driver_version,compute_cap,power.draw,clocks.sm --format=csv > "$out/nvidia-smi.txt" 2>&1
