#!/usr/bin/env bash
# The GPU pipeline's device entry point (issue 9): tests/gpu, then scripts/bench_gpu_pipeline.py.
#
#   bash scripts/gpu_pipeline.sh pack    development machine, repo root: tar the two detectors, vtest.avi and
#                                        the asset images from ../shared/assets and split the tar into
#                                        .gpu/gp1 .. .gpu/gpN (git-excluded) sized to ride along with the GPU
#                                        kit's .gpu/ort1 .. .gpu/ort5 runs (64 MiB per run; see docs/gpu-pipeline.md)
#   bash scripts/gpu_pipeline.sh run     GPU machine, after `source .gpu/kit/device-setup.sh`: collect the parts
#                                        sent so far; once all parts and the GPU stack are there, run the tests
#                                        and the benchmark, writing logs and JSON to $OUT (or ./gpu-pipeline-out)
# With EDGERT_ASSETS already pointing at a full assets folder, `run` skips the parts.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd="${1:-run}"
if [ "$cmd" = pack ]; then
  set -e
  src="${EDGERT_ASSETS:-../shared/assets}"
  mkdir -p .gpu
  rm -rf .gpu/gp[0-9]* .gpu/gp.tar
  (cd "$src" && tar cf - README.md models/detection/coco.names models/detection/nanodet-m-416-coco-v8layout.onnx \
      models/detection/yolov8s-fall-640.onnx video/vtest.avi images) > .gpu/gp.tar
  python3 - "${PART_MIB:-8 8 8 8 24 60}" <<'PY'
import hashlib, sys
from pathlib import Path
sizes = [int(x) << 20 for x in sys.argv[1].split()]
data = Path(".gpu/gp.tar").read_bytes()
pos, n = 0, 0
while pos < len(data):
    n += 1
    size = sizes[min(n - 1, len(sizes) - 1)]
    d = Path(f".gpu/gp{n}")
    d.mkdir()
    (d / f"part.{n:02d}").write_bytes(data[pos:pos + size])
    pos += size
for i in range(1, n + 1):
    Path(f".gpu/gp{i}/manifest").write_text(f"{n} {hashlib.sha256(data).hexdigest()}\n")
print(f"gpu_pipeline: {len(data) >> 20} MiB of assets in {n} parts: .gpu/gp1 .. .gpu/gp{n}")
PY
  rm -f .gpu/gp.tar
  exit 0
fi

out="${OUT:-gpu-pipeline-out}"
mkdir -p "$out"
if [ -z "${EDGERT_ASSETS:-}" ] || [ ! -f "${EDGERT_ASSETS}/video/vtest.avi" ]; then
  parts=/tmp/edgert-gp-parts dest=/tmp/edgert-gp-assets
  mkdir -p "$parts"
  for d in .gpu/gp[0-9]*; do [ -d "$d" ] && cp -n "$d"/* "$parts"/ 2>/dev/null; done
  if [ ! -f "$dest/.done" ]; then
    [ -f "$parts/manifest" ] || { echo "gpu_pipeline: no asset parts sent yet"; exit 0; }
    read -r total sha < "$parts/manifest"
    have=$(ls "$parts"/part.* 2>/dev/null | wc -l)
    if [ "$have" -lt "$total" ]; then echo "gpu_pipeline: $have of $total asset parts here"; exit 0; fi
    cat "$parts"/part.* > /tmp/edgert-gp.tar
    echo "$sha  /tmp/edgert-gp.tar" | sha256sum -c --quiet || { echo "gpu_pipeline: asset checksum differs"; exit 1; }
    mkdir -p "$dest" && tar xf /tmp/edgert-gp.tar -C "$dest" && touch "$dest/.done" && rm -f /tmp/edgert-gp.tar
  fi
  export EDGERT_ASSETS="$dest"
  echo "gpu_pipeline: assets ready in $dest"
fi
if [ ! -f /tmp/gpusite/.done ]; then echo "gpu_pipeline: GPU stack not installed yet (send the next .gpu/ortN)"; exit 0; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,compute_cap,power.draw,clocks.sm --format=csv 2>&1 | tee "$out/nvidia-smi.txt"
python3 -m pytest -q -p no:cacheprovider tests/gpu -rs 2>&1 | tee "$out/tests_gpu.log" | tail -25
python3 scripts/bench_gpu_pipeline.py --out "$out/gpu_pipeline.json" "${@:2}" 2>&1 | tee "$out/bench.log" | grep -v "^INFO"
