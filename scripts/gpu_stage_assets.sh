#!/usr/bin/env bash
# Move the assets scripts/gpu_check.sh needs to the GPU machine, which receives at most 64 MiB per run:
#   pack   (development machine, repo root): tar the three detectors + a few images from ../shared/assets and
#          split it into .gpu/assets1 .. .gpu/assetsN (git-excluded), sized to ride along with the kit's
#          .gpu/ort1 .. .gpu/ort5 runs (see docs/gpu-benchmarks.md); the last part goes in a run of its own.
#   unpack (GPU machine): collect the parts sent so far in /tmp/edgert-assets-parts (it outlives a run while
#          the machine stays warm) and, once all have arrived, unpack them into /tmp/edgert-assets.
set -euo pipefail
cmd="${1:-pack}"
if [ "$cmd" = pack ]; then
  src="${EDGERT_ASSETS:-../shared/assets}"
  mkdir -p .gpu
  rm -rf .gpu/assets[0-9]* .gpu/assets.tar
  (cd "$src" && tar cf - README.md models/detection/coco.names models/detection/yolov8s-fall-640.onnx \
      models/detection/nanodet-m-416-coco-v8layout.onnx models/detection/yolov3-tiny-coco-416.onnx \
      images/bus.jpg images/zidane.jpg images/darknet_dog.jpg images/darknet_horses.jpg \
      images/darknet_person.jpg images/opencv_messi5.jpg images/darknet_kite.jpg \
      images/opencv_basketball1.png) > .gpu/assets.tar
  # MiB per part: parts 1-4 beside ort1-4 (53 MB each), part 5 beside ort5 (36 MB), the rest alone.
  python3 - "${PART_MIB:-8 8 8 8 24 60}" <<'PY'
import hashlib, sys
from pathlib import Path
sizes = [int(x) << 20 for x in sys.argv[1].split()]
data = Path(".gpu/assets.tar").read_bytes()
pos, n = 0, 0
while pos < len(data):
    n += 1
    size = sizes[min(n - 1, len(sizes) - 1)]
    d = Path(f".gpu/assets{n}")
    d.mkdir()
    (d / f"part.{n:02d}").write_bytes(data[pos:pos + size])
    pos += size
for i in range(1, n + 1):
    Path(f".gpu/assets{i}/manifest").write_text(f"{n} {hashlib.sha256(data).hexdigest()}\n")
print(f"gpu_stage_assets: {len(data) >> 20} MiB in {n} parts: .gpu/assets1 .. .gpu/assets{n}")
PY
  rm -f .gpu/assets.tar
  exit 0
fi
# unpack, on the GPU machine
parts=/tmp/edgert-assets-parts
mkdir -p "$parts"
for d in .gpu/assets[0-9]*; do [ -d "$d" ] && cp -n "$d"/* "$parts"/ 2>/dev/null; done
[ -f /tmp/edgert-assets/.done ] && { echo "gpu_stage_assets: assets ready in /tmp/edgert-assets"; exit 0; }
[ -f "$parts/manifest" ] || { echo "gpu_stage_assets: no asset parts sent yet"; exit 1; }
read -r total sha < "$parts/manifest"
have=$(ls "$parts"/part.* 2>/dev/null | wc -l)
if [ "$have" -lt "$total" ]; then echo "gpu_stage_assets: $have of $total asset parts here"; exit 1; fi
cat "$parts"/part.* > /tmp/edgert-assets.tar
echo "$sha  /tmp/edgert-assets.tar" | sha256sum -c --quiet || { echo "gpu_stage_assets: checksum differs"; exit 1; }
mkdir -p /tmp/edgert-assets && tar xf /tmp/edgert-assets.tar -C /tmp/edgert-assets && touch /tmp/edgert-assets/.done
rm -f /tmp/edgert-assets.tar
echo "gpu_stage_assets: assets ready in /tmp/edgert-assets"
