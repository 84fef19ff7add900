#!/usr/bin/env bash
# edgert on real TensorRT 8.5 (JetPack 5.1's) on the device machine; the kit is ../shared/gpu/trt85 (README.md).
#   here:  bash scripts/gpu_trt85.sh models   makes the quantized models into .gpu/int8 (minutes per detector);
#          bash scripts/gpu_trt85.sh pack     splits the kit's first part in two (each run carries <= 64 MiB beside
#          the ~10 MiB tree), and packs the assets, OpenCV for Python 3.9 and the quantized models of .gpu/int8
#          (edgert calibrate and ModelOpt outputs) into .gpu/ta/1..N, then prints the chain of runs.
#   there: each run `source .gpu/trt85/PART/setup.sh; bash scripts/gpu_trt85.sh STEP`, STEP one of
#          unpack (collect the asset parts; ready once all came), smoke, tests, int8 [MODELS], pipeline.
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
step="${1:?usage: gpu_trt85.sh pack|unpack|smoke|tests|int8|pipeline}"
TA=/tmp/edgert-ta
ASSETS=/tmp/edgert-trt-assets
export EDGERT_ASSETS=$ASSETS
PY=${PY:-/tmp/trt85/py39/usr/bin/python3.9}  # setup.sh sets it in the caller's shell, not for this script

pack() {
  set -e
  local kit=.gpu/trt85
  if [ -d $kit/p1 ]; then  # 58 MB: over the limit beside the tree; two parts
    mkdir -p $kit/p1a $kit/p1b
    mv $kit/p1/py39.tar.zst $kit/p1/stubs.tar $kit/p1/zstandard-*.whl $kit/p1a/ && mv $kit/p1/wheels39a.tar $kit/p1b/
    cp $kit/p1/setup.sh $kit/p1a/ && cp $kit/p1/setup.sh $kit/p1b/ && rm -r $kit/p1
  fi
  mkdir -p $kit/px && cp $kit/p1a/setup.sh $kit/px/  # setup alone, for the runs after the chain
  local src="${EDGERT_ASSETS_SRC:-../shared/assets}" stage=.gpu/ta-stage
  rm -rf $stage .gpu/ta && mkdir -p $stage/assets/models/detection $stage/assets/video $stage/int8 .gpu/ta
  cp "$src"/README.md $stage/assets/ && cp -r "$src"/images $stage/assets/
  cp "$src"/models/detection/*.onnx "$src"/models/detection/coco.names $stage/assets/models/detection/
  cp "$src"/video/vtest.avi $stage/assets/video/
  cp .gpu/int8/*-edgert.onnx .gpu/int8/*-edgert-full.onnx .gpu/int8/*-modelopt.onnx .gpu/int8/*.calib \
     .gpu/int8/*_images.txt $stage/int8/ 2>/dev/null || true
  cp .gpu/cv39/*.whl $stage/
  tar cf - -C $stage . | zstd -q -3 -T2 > .gpu/ta.tar.zst
  # MiB beside each kit part: p1a 30, p1b 17, p2 3, p3 17, p4 17, p5 27, then 55 a run
  python3 - <<'PY'
from pathlib import Path
data = Path(".gpu/ta.tar.zst").read_bytes()
sizes = [30, 17, 3, 17, 17, 27] + [55] * 20
pos = n = 0
while pos < len(data):
    n += 1
    d = Path(f".gpu/ta/{n}"); d.mkdir(parents=True)
    (d / f"part.{n:02d}").write_bytes(data[pos:pos + (sizes[n - 1] << 20)]); pos += sizes[n - 1] << 20
Path(".gpu/ta/1/count").write_text(str(n))
print(f"{len(data) / 2**20:.1f} MiB in {n} parts")
PY
  # The kit prunes libnvinfer_builder_resource to sm_90, and TensorRT 8.5 checks that library's sha256 before it
  # builds ("Assertion validateCaskKLibDigest(sha256sum) failed": runtime only). The wheel's own copy travels too.
  rm -rf .gpu/br && mkdir -p .gpu/br && python3 - <<'PY'
import glob, hashlib, subprocess, zipfile
from pathlib import Path
wheel = glob.glob(".gpu/trt85/work/dl/tensorrt-8.5*.whl")[0]
data = zipfile.ZipFile(wheel).read("tensorrt/libnvinfer_builder_resource.so.8.5.3")
packed = subprocess.run(["zstd", "-q", "-6", "-T2", "-c"], input=data, capture_output=True, check=True).stdout
step, n = 52 << 20, 0
for n, pos in enumerate(range(0, len(packed), step)):
    d = Path(f".gpu/br/d{n:02d}"); d.mkdir()
    (d / f"br.zst.{n:02d}").write_bytes(packed[pos:pos + step])
Path(".gpu/br/d00/br.count").write_text(f"{n + 1} {hashlib.sha256(data).hexdigest()}")
print(f"builder resource: {len(packed) / 2**20:.0f} MiB in {n + 1} parts")
PY
  local parts=(p1a p1b p2 p3 p4 p5) n
  n=$(cat .gpu/ta/1/count)
  for ((i = 1; i <= n || i <= 6; i++)); do
    local kp=${parts[$((i - 1))]:-px} carry=".gpu/trt85/${parts[$((i - 1))]:-px}"
    [ $i -le "$n" ] && carry="$carry\", \".gpu/ta/$i"
    echo "run $i: carry [\"$carry\"], command: source .gpu/trt85/$kp/setup.sh; bash scripts/gpu_trt85.sh unpack"
  done
  for d in .gpu/br/d*; do
    echo "run: carry [\".gpu/trt85/px\", \"$d\"], command: source .gpu/trt85/px/setup.sh; bash scripts/gpu_trt85.sh unpack"
  done
}

dec() {  # the image may lack the zstd tool: the kit's zstandard for its Python 3.12 then (setup.sh unpacked it)
  if command -v zstd >/dev/null; then zstd -qdc; else env -u PYTHONHOME PYTHONPATH=/tmp/trt85/zs python3 -c \
    "import sys,zstandard; zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"; fi
}

builder_resource() {  # the unpruned libnvinfer_builder_resource, once its parts have all come
  mkdir -p /tmp/edgert-br && cp -n .gpu/br/*/* /tmp/edgert-br/ 2>/dev/null
  local lib=/tmp/trt85/site/tensorrt/libnvinfer_builder_resource.so.8.5.3 want sha
  read -r want sha < /tmp/edgert-br/br.count 2>/dev/null || { echo "builder resource: 0 parts"; return 3; }
  [ -f /tmp/edgert-br/.done ] && return 0
  [ "$(ls /tmp/edgert-br/br.zst.* | wc -l)" -lt "$want" ] && { echo "builder resource: parts still to come"; return 3; }
  [ -f $lib ] || { echo "builder resource: TensorRT not unpacked yet"; return 3; }
  cat /tmp/edgert-br/br.zst.* | dec > $lib.new && [ "$(sha256sum < $lib.new | cut -d' ' -f1)" = "$sha" ] &&
    mv $lib.new $lib && touch /tmp/edgert-br/.done && echo "builder resource: ready"
}

unpack() {
  builder_resource || true
  mkdir -p $TA && cp -n .gpu/ta/*/* $TA/ 2>/dev/null
  local want have
  want=$(cat $TA/count 2>/dev/null || echo "?"); have=$(ls $TA/part.* 2>/dev/null | wc -l)
  if [ -f $ASSETS/.done ]; then echo "assets: ready"; return 0; fi
  if [ "$want" = "?" ] || [ "$have" -lt "$want" ]; then echo "assets: $have of $want parts"; return 3; fi
  if [ ! -d $ASSETS ]; then
    mkdir -p $ASSETS.stage && cat $TA/part.* | dec | tar x -C $ASSETS.stage || return 1
    mv $ASSETS.stage/assets $ASSETS && mv $ASSETS.stage/int8 /tmp/edgert-int8
  fi
  $PY -c "import zipfile,glob,sys; zipfile.ZipFile(glob.glob('$ASSETS.stage/*.whl')[0]).extractall(sys.argv[1])" \
    /tmp/trt85/site && touch $ASSETS/.done && echo "assets: ready" || return 1
}

ready() {
  unpack >/dev/null || { echo "not ready: $(unpack)"; exit 3; }
  [ -f /tmp/edgert-br/.done ] || { echo "not ready: the builder resource's parts (.gpu/br) have not all come"; exit 3; }
}

smoke() {
  ready
  local m=$ASSETS/models/detection/nanodet-m-416-coco-v8layout.onnx e=/tmp/edgert-smoke
  mkdir -p $e && cp $m $e/nanodet.onnx
  ( set -x
    $PY -m edgert info
    time $PY -m edgert build $e/nanodet.onnx --backend tensorrt --precision fp32 --json
    time $PY -m edgert build $e/nanodet.onnx --backend tensorrt --precision fp32
    time $PY -m edgert build $e/nanodet.onnx --backend tensorrt --precision fp16 -o $e/nanodet16.engine
    cp /tmp/edgert-int8/nanodet-edgert.onnx $e/ && time $PY -m edgert build $e/nanodet-edgert.onnx --backend tensorrt --precision int8
    time $PY -m edgert build $e/nanodet.onnx --backend tensorrt --precision int8 --calib-cache /tmp/edgert-int8/nanodet-edgert.calib -o $e/nanodet-implicit.engine
    $PY -m edgert bench $e/nanodet.engine --backend tensorrt --iterations 100
    $PY -m edgert bench $e/nanodet-implicit.engine --backend tensorrt --iterations 100
    $PY -m edgert bench $e/nanodet-edgert.engine --backend tensorrt --iterations 100
    $PY -m edgert run --backend tensorrt --model $e/nanodet-edgert.onnx --source $ASSETS/video/vtest.avi --max-frames 100 --json
  ) > $OUT/smoke.log 2>&1
  echo "smoke rc $?"; tail -c 6000 $OUT/smoke.log
}

tests() {
  ready
  EDGERT_GPU_BACKEND=tensorrt timeout 560 $PY -m pytest -q -rs ${TESTS:-tests/gpu} 2>&1 | tee $OUT/tests-gpu-trt85.log | tail -60
}

int8() {
  ready
  local models="${2:-nanodet,yolov3tiny,yolov8s}"
  cp docs/results/trt85-int8-h100.json /tmp/edgert-int8.json 2>/dev/null || true
  (cd scripts && timeout 580 $PY bench_trt_int8.py --int8 /tmp/edgert-int8 --heldout /tmp/edgert-int8/heldout_images.txt \
    --models "$models" --out /tmp/edgert-int8.json ${PHASE:+--phase $PHASE}) 2>&1 | tee -a $OUT/int8.log | tail -40
  cp /tmp/edgert-int8.json $OUT/trt85-int8.json
}

pipeline() {
  ready
  local m=$ASSETS/models/detection/${2:-nanodet-m-416-coco-v8layout.onnx} v=$ASSETS/video/vtest.avi
  local src=() i
  for i in $(seq 16); do src+=(--source "$v"); done
  local name; name=$(basename "$m" .onnx)
  $PY -m edgert build "$m" --backend tensorrt --precision fp16 --batch 16 --json > $OUT/build16-$name.json || return 1
  local engine; engine=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['engine'])" $OUT/build16-$name.json)
  $PY -m edgert bench "$engine" --backend tensorrt --json > $OUT/compute16-$name.json
  $PY -m edgert run --backend tensorrt --model "$m" "${src[@]}" --json > $OUT/run16-$name.json 2> $OUT/run16-$name.err
  tail -3 $OUT/run16-$name.err; $PY - "$name" <<'PY'
import json, os, sys
out, name = os.environ["OUT"], sys.argv[1]
b = json.load(open(f"{out}/compute16-{name}.json"))
b = b[0] if isinstance(b, list) else b
compute = 16 * b["gpu"]["compute_only_fps"]
r = json.load(open(f"{out}/run16-{name}.json"))
print(f"{name}: compute-only batch 16 {compute:.0f} frames/s (with copies {16 * b['throughput_fps']:.0f}); "
      f"16 file streams through edgert run {r['fps']:.0f} frames/s = {r['fps'] / compute:.2f}x")
PY
}

# The quantized models (here, before pack): edgert's default and --full-int8 per detector, NanoDet's calibration
# cache for TensorRT 8.5, and ModelOpt's default INT8 on the same 32 images (a throwaway venv, through
# scripts/_quant_tools.py). Minutes per model on two cores; MODELS="nanodet" for one.
make_models() {
  set -e
  local src out=.gpu/int8 name file here_py="${HERE_PY:-.venv/bin/python}"
  src=$(cd "${EDGERT_ASSETS_SRC:-../shared/assets}" && pwd)
  mkdir -p $out
  declare -A files=([nanodet]=nanodet-m-416-coco-v8layout.onnx [yolov3tiny]=yolov3-tiny-coco-416.onnx
                    [yolov8s]=yolov8s-fall-640.onnx)
  for name in ${MODELS:-nanodet yolov3tiny yolov8s}; do
    file=$src/models/detection/${files[$name]}
    local cache=(); [ "$name" = nanodet ] && cache=(--trt-version 8.5.3)
    $here_py -m edgert calibrate "$file" --images "$src/images" -o $out/$name-edgert.onnx "${cache[@]}" \
      > $out/$name-edgert.log 2>&1 || true
    $here_py -m edgert calibrate "$file" --images "$src/images" -o $out/$name-edgert-full.onnx --full-int8 \
      > $out/$name-edgert-full.log 2>&1 || true
    (cd scripts && ../$here_py - "$name" "$file" "$src/images" "$(cd .. && pwd)/$out" <<'PY'
import json, sys
from pathlib import Path
from _quant_tools import modelopt_env, modelopt_quantize
from bench_calibration import calibration_data, carry_metadata
name, model, images, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
venv = Path.home() / ".cache/edgert-bench/modelopt-venv"
env = modelopt_env(venv, "nvidia-modelopt[onnx]==0.47.0", "torch==2.13.0+cpu")
work = out / "work" / name
work.mkdir(parents=True, exist_ok=True)
data = calibration_data(model, images, 32, work / "calib32.npz")
info = modelopt_quantize(venv, model, work / "calib32.npz", out / f"{name}-modelopt.onnx", work / "modelopt", [])
if (out / f"{name}-modelopt.onnx").exists():
    carry_metadata(model, out / f"{name}-modelopt.onnx")
(out / f"{name}-modelopt.json").write_text(json.dumps({"env": env, "data": data, "run": info}, default=str, indent=2))
PY
    ) > $out/$name-modelopt.log 2>&1 || true
    ls -la $out/$name-*.onnx
  done
}

# Quantized models made after the chain started: `pack-int8` here, then a run carrying .gpu/tb runs `int8-extra`.
pack_int8() {
  rm -rf .gpu/tb && mkdir -p .gpu/tb && (cd .gpu/int8 && tar cf ../tb/int8.tar *-edgert.onnx *-edgert-full.onnx \
    *-modelopt.onnx *.calib *_images.txt 2>/dev/null); du -sh .gpu/tb/int8.tar
}

case "$step" in
  pack) pack ;;
  models) make_models ;;
  pack-int8) pack_int8 ;;
  int8-extra) mkdir -p /tmp/edgert-int8 && tar xf .gpu/tb/int8.tar -C /tmp/edgert-int8 && ls -la /tmp/edgert-int8 ;;
  unpack) unpack ;;
  smoke) smoke ;;
  tests) tests ;;
  int8) int8 "$@" ;;
  pipeline) pipeline "$@" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
