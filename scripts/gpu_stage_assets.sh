#!/usr/bin/env bash
# Move assets to the GPU machine, which receives at most 64 MiB per run:
#   pack [FILE ...]  (development machine, repo root): tar FILEs (paths under ../shared/assets; default: the three
#          detectors + a few images, what scripts/gpu_check.sh needs) and split the tar into
#          .gpu/${STAGE_NAME}1 .. N (git-excluded), sized to ride along with the kit's .gpu/ort1 .. .gpu/ort5 runs
#          (see docs/gpu-benchmarks.md); the last part goes in a run of its own.
#   unpack (GPU machine): collect the parts sent so far (the parts folder outlives a run while the machine stays
#          warm) and, once all have arrived, unpack them into $STAGE_DEST. Exit 0: ready; 3: parts still to
#          come; 1: a part is damaged.
# STAGE_NAME (default "assets") names the parts, so two staged sets can travel side by side
# (scripts/gpu_pipeline.sh uses "gp"); STAGE_DEST defaults to /tmp/edgert-$STAGE_NAME.
# Sourced (`source scripts/gpu_stage_assets.sh` by the device scripts, after the kit's device-setup.sh), it only
# defines gpu_ready NAME:
# Points EDGERT_ASSETS at the assets staged as .gpu/NAME1..N (scripts/gpu_stage_assets.sh; unpacked into
# /tmp/edgert-NAME-assets once every part has come) unless it already names a full set, and checks that the GPU
# stack is installed. Returns 0: ready; 3: parts or the stack still to come (the caller exits 0 and waits for its
# next run); 1: a part is damaged.
gpu_ready() {
  local name="$1"
  if [ -z "${EDGERT_ASSETS:-}" ] || [ ! -f "${EDGERT_ASSETS}/video/vtest.avi" ]; then
    STAGE_NAME="$name" STAGE_DEST="/tmp/edgert-$name-assets" bash scripts/gpu_stage_assets.sh unpack || return $?
    export EDGERT_ASSETS="/tmp/edgert-$name-assets"
  fi
  if [ ! -f /tmp/gpusite/.done ]; then
    echo "gpu_ready: GPU stack not installed yet (send the next .gpu/ortN)"
    return 3
  fi
}
# What the one pipeline's device runs read (scripts/gpu_pipeline.sh pack, scripts/gpu_ort_kit.sh pack), under assets
PIPELINE_ASSETS=(README.md models/detection/coco.names models/detection/nanodet-m-416-coco-v8layout.onnx
  models/detection/yolov8s-fall-640.onnx video/vtest.avi images/bus.jpg images/opencv_hfs_000.jpg)
if [ "${BASH_SOURCE[0]}" != "$0" ]; then return 0; fi

set -euo pipefail
cmd="${1:-pack}"
name="${STAGE_NAME:-assets}"
dest="${STAGE_DEST:-/tmp/edgert-$name}"
if [ "$cmd" = pack ]; then
  src="${EDGERT_ASSETS:-../shared/assets}"
  shift || true
  files=("$@")
  if [ ${#files[@]} -eq 0 ]; then
    files=(README.md models/detection/coco.names models/detection/yolov8s-fall-640.onnx
      models/detection/nanodet-m-416-coco-v8layout.onnx models/detection/yolov3-tiny-coco-416.onnx
      images/bus.jpg images/zidane.jpg images/darknet_dog.jpg images/darknet_horses.jpg
      images/darknet_person.jpg images/opencv_messi5.jpg images/darknet_kite.jpg images/opencv_basketball1.png)
  fi
  mkdir -p .gpu
  rm -rf ".gpu/$name"[0-9]* ".gpu/$name.tar"
  (cd "$src" && tar cf - "${files[@]}") > ".gpu/$name.tar"
  # MiB per part: parts 1-4 beside ort1-4 (53 MB each), part 5 beside ort5 (36 MB), the rest alone.
  python3 - "${PART_MIB:-8 8 8 8 24 60}" "$name" <<'PY'
import hashlib, sys
from pathlib import Path
sizes = [int(x) << 20 for x in sys.argv[1].split()]
name = sys.argv[2]
data = Path(f".gpu/{name}.tar").read_bytes()
pos, n = 0, 0
while pos < len(data):
    n += 1
    size = sizes[min(n - 1, len(sizes) - 1)]
    d = Path(f".gpu/{name}{n}")
    d.mkdir()
    (d / f"part.{n:02d}").write_bytes(data[pos:pos + size])
    pos += size
for i in range(1, n + 1):
    Path(f".gpu/{name}{i}/manifest").write_text(f"{n} {hashlib.sha256(data).hexdigest()}\n")
print(f"gpu_stage_assets: {len(data) >> 20} MiB in {n} parts: .gpu/{name}1 .. .gpu/{name}{n}")
PY
  rm -f ".gpu/$name.tar"
  exit 0
fi
# unpack, on the GPU machine
parts="${STAGE_PARTS:-/tmp/edgert-$name-parts}"
mkdir -p "$parts"
for d in ".gpu/$name"[0-9]*; do [ -d "$d" ] && cp -n "$d"/* "$parts"/ 2>/dev/null; done
[ -f "$dest/.done" ] && { echo "gpu_stage_assets: assets ready in $dest"; exit 0; }
[ -f "$parts/manifest" ] || { echo "gpu_stage_assets: no asset parts sent yet"; exit 3; }
read -r total sha < "$parts/manifest"
have=$(ls "$parts"/part.* 2>/dev/null | wc -l)
if [ "$have" -lt "$total" ]; then echo "gpu_stage_assets: $have of $total asset parts here"; exit 3; fi
cat "$parts"/part.* > "$dest.tar"
echo "$sha  $dest.tar" | sha256sum -c --quiet || { echo "gpu_stage_assets: checksum differs"; exit 1; }
mkdir -p "$dest" && tar xf "$dest.tar" -C "$dest" && touch "$dest/.done"
rm -f "$dest.tar"
echo "gpu_stage_assets: assets ready in $dest"
