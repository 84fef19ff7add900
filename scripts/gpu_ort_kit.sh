#!/usr/bin/env bash
# The GPU stack (onnxruntime-gpu, pycuda) and the pipeline's assets in three device runs instead of six:
# onnxruntime-gpu's CUDA provider carries kernels for six GPU generations (218 MB); the device machine runs only
# sm_90 (H100, H200), so the others are zeroed with the TensorRT kit's prune_fatbin.py and the whole set packs to
# about 120 MB with xz (the device image has no zstd tool; Python's lzma reads xz).
#   bash scripts/gpu_ort_kit.sh pack     development machine, repo root, after `bash ../shared/gpu/stage.sh` (its
#                                        download in .gpu/dl): .gpu/kp1 .. .gpu/kpN, 50 MiB each (git-excluded)
#   bash scripts/gpu_ort_kit.sh unpack   GPU machine (scripts/gpu_pipeline.sh calls it when .gpu/kp* travel):
#                                        collect the parts sent so far; once all have come, install the stack into
#                                        /tmp/gpusite and the assets into /tmp/edgert-gp-assets, where
#                                        gpu_pipeline.sh looks. Exit 0: ready; 3: parts still to come; 1: damaged.
# The six-run chain of ../shared/gpu (.gpu/ort1..5 + .gpu/gp1..6) stays the fallback: docs/gpu-pipeline.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd="${1:?usage: gpu_ort_kit.sh pack|unpack}"
SM="${SM:-90}"
if [ "$cmd" = pack ]; then
  whl=.gpu/dl/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl
  [ -f "$whl" ] || { echo "gpu_ort_kit: $whl not here: run bash ../shared/gpu/stage.sh first"; exit 1; }
  src="${EDGERT_ASSETS:-../shared/assets}" stage=.gpu/kp-stage
  rm -rf $stage .gpu/kp[0-9]* && mkdir -p $stage/site $stage/wheels $stage/assets
  unzip -q "$whl" -d $stage/site
  python3 ../shared/gpu/trt85/prune_fatbin.py $stage/site/onnxruntime/capi/libonnxruntime_providers_cuda.so "$SM"
  cp ../shared/gpu/wheels/*.whl $stage/wheels/
  source scripts/gpu_stage_assets.sh
  (cd "$src" && tar cf - "${PIPELINE_ASSETS[@]}") | tar xf - -C $stage/assets
  tar cf - -C $stage . | xz -9e -T0 > .gpu/kp.tar.xz
  python3 - <<'PY'
import hashlib
from pathlib import Path
data = Path(".gpu/kp.tar.xz").read_bytes()
size, n = 50 << 20, -(-len(data) // (50 << 20))
for i in range(n):
    d = Path(f".gpu/kp{i + 1}")
    d.mkdir()
    (d / f"part.{i + 1:02d}").write_bytes(data[i * size:(i + 1) * size])
    (d / "manifest").write_text(f"{n} {hashlib.sha256(data).hexdigest()}\n")
print(f"gpu_ort_kit: {len(data) >> 20} MiB in {n} parts: .gpu/kp1 .. .gpu/kp{n}, one per run")
PY
  rm -rf $stage .gpu/kp.tar.xz
  exit 0
fi
# unpack, on the GPU machine: the parts folder outlives a run while the machine stays warm
parts=/tmp/edgert-kp-parts assets=/tmp/edgert-gp-assets
[ -f /tmp/gpusite/.done ] && [ -f $assets/.done ] && { echo "gpu_ort_kit: GPU stack and assets ready"; exit 0; }
mkdir -p $parts
for d in .gpu/kp[0-9]*; do [ -d "$d" ] && cp -n "$d"/* $parts/ 2>/dev/null; done
[ -f $parts/manifest ] || { echo "gpu_ort_kit: no parts sent yet (carry .gpu/kp1)"; exit 3; }
read -r total sha < $parts/manifest
have=$(ls $parts/part.* | wc -l)
[ "$have" -ge "$total" ] || { echo "gpu_ort_kit: $have of $total parts here; carry the next .gpu/kpN"; exit 3; }
cat $parts/part.* > /tmp/edgert-kp.tar.xz
echo "$sha  /tmp/edgert-kp.tar.xz" | sha256sum -c --quiet || { echo "gpu_ort_kit: checksum differs"; exit 1; }
rm -rf /tmp/edgert-kp && mkdir -p /tmp/edgert-kp
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='data')" \
  /tmp/edgert-kp.tar.xz /tmp/edgert-kp
mkdir -p /tmp/gpusite && cp -r /tmp/edgert-kp/site/. /tmp/gpusite/
# the device image's Python is 3.12; named, so the unpack can be tried on any machine
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gpusite --only-binary=:all: \
  --python-version 3.12 --implementation cp --abi cp312 --platform linux_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 /tmp/edgert-kp/wheels/*.whl
rm -rf $assets && mv /tmp/edgert-kp/assets $assets && touch $assets/.done /tmp/gpusite/.done
rm -rf /tmp/edgert-kp /tmp/edgert-kp.tar.xz
echo "gpu_ort_kit: GPU stack (onnxruntime-gpu for sm_$SM, pycuda) in /tmp/gpusite, assets in $assets"
