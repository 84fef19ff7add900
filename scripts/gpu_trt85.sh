#!/usr/bin/env bash
# edgert on real TensorRT 8.5 (JetPack 5.1's) on the device machine; the kit is ../shared/gpu/trt85 (README.md).
#   here:  bash scripts/gpu_trt85.sh models   makes the quantized models into .gpu/int8 (minutes per detector);
#          bash scripts/gpu_trt85.sh pack     splits the kit's first part in two (each run carries <= 64 MiB beside
#          the ~10 MiB tree), makes its TensorRT parts again without the pruned builder resource, and packs the
#          assets, the quantized models of .gpu/int8 (edgert calibrate and ModelOpt outputs) and the wheel's
#          builder resource into .gpu/ta/1..N, then prints the chain of runs (8 with every detector).
#   there: each run `source .gpu/trt85/PART/setup.sh; bash scripts/gpu_trt85.sh STEP`, STEP one of
#          unpack (collect the parts; ready once all came; restores .gpu/timing/timing-cache.tgz when carried),
#          start (the programme in the background: STEPS, default STEPS_DEFAULT below; JOBS=3 engines built at
#          once: five at once made each 2.6 times longer, and only a finished engine is kept for the next
#          session), watch [SECONDS] (wait up to SECONDS, bring back its results, timing caches and engines),
#          or one step within one call: smoke, builds, int8 [MODELS] (PHASE=build|measure|pipeline), through,
#          tests, update.
#   here, after each call: bash scripts/gpu_trt85.sh keep FILES_AT   keeps its results (.gpu/results), timing
#          caches (.gpu/timing) and the finished engines' parts (.gpu/engines/N, with the runs that carry them)
# Results go to $OUT (the device tool brings them back).
set -uo pipefail
step="${1:?usage: gpu_trt85.sh models|pack|unpack|smoke|builds|int8|pipeline|tests}"
TA=/tmp/edgert-ta
ASSETS=/tmp/edgert-trt-assets
export EDGERT_ASSETS=$ASSETS
# CUDA's kernel cache and lazy module loading (CUDA >= 11.7, which TensorRT 8.5's wheel carries): builds load
# thousands of kernels; neither changes which kernels an engine runs
export CUDA_CACHE_PATH=/tmp/cuda-cache CUDA_CACHE_MAXSIZE=4294967296 CUDA_MODULE_LOADING=LAZY
PY=${PY:-/tmp/trt85/py39/usr/bin/python3.9}  # setup.sh sets it in the caller's shell, not for this script

pack() {
  set -e
  local kit=.gpu/trt85
  if [ -d $kit/p1 ]; then  # 58 MB: over the limit beside the tree; two parts
    mkdir -p $kit/p1a $kit/p1b
    mv $kit/p1/py39.tar.zst $kit/p1/stubs.tar $kit/p1/zstandard-*.whl $kit/p1a/ && mv $kit/p1/wheels39a.tar $kit/p1b/
    cp $kit/p1/setup.sh $kit/p1a/ && cp $kit/p1/setup.sh $kit/p1b/ && rm -r $kit/p1
  fi
  # The kit's TensorRT part holds the builder resource pruned to sm_90, which TensorRT 8.5 refuses (it checks the
  # library's sha256; the wheel's own copy travels in the br stream below): its parts are made again without it,
  # one run fewer
  if [ ! -f $kit/p2/trt.nobr ]; then
    if [ ! -f $kit/work/trt-nobr.tar.zst ]; then
      (cd $kit/work/site && tar cf - --exclude=tensorrt/libnvinfer_builder_resource.so.8.5.3 tensorrt \
        tensorrt-8.5.3.1.dist-info nvidia) | zstd -q -19 --long=31 -T0 -o $kit/work/trt-nobr.tar.zst.new
      mv $kit/work/trt-nobr.tar.zst.new $kit/work/trt-nobr.tar.zst
    fi
    rm -f $kit/p[2-9]/trt.zst.* $kit/p[2-9]/trt.nparts
    split -b 36m -d -a 1 $kit/work/trt-nobr.tar.zst $kit/work/trt.zst.
    local n i=2 f
    n=$(ls $kit/work/trt.zst.* | wc -l)
    for f in $kit/work/trt.zst.*; do
      mkdir -p $kit/p$i && cp $kit/p1a/setup.sh $kit/p$i/ && mv "$f" $kit/p$i/ && echo "$n" > $kit/p$i/trt.nparts
      i=$((i + 1))
    done
    for ((; i <= 9; i++)); do rm -rf $kit/p$i; done
    touch $kit/p2/trt.nobr
  fi
  mkdir -p $kit/px && cp $kit/p1a/setup.sh $kit/px/  # setup alone, for the runs after the kit's
  local src="${EDGERT_ASSETS_SRC:-../shared/assets}" stage=.gpu/ta-stage d
  d=$src/models/detection
  rm -rf $stage .gpu/ta && mkdir -p $stage/assets/models/detection $stage/assets/video $stage/int8 .gpu/ta
  cp "$src"/README.md $stage/assets/ && cp -r "$src"/images $stage/assets/
  if [ "${ONLY:-}" = none ]; then  # TensorRT alone (tests on tiny models): the kit's five runs
    :
  elif [ -n "${ONLY:-}" ]; then  # one detector's files (ONLY=yolov3tiny): two runs fewer, no video
    declare -A fp32=([nanodet]=nanodet-m-416-coco-v8layout.onnx [yolov3tiny]=yolov3-tiny-coco-416.onnx
                     [yolov8s]=yolov8s-fall-640.onnx)
    cp $d/${fp32[$ONLY]} $d/coco.names $stage/assets/models/detection/
    cp .gpu/int8/$ONLY-edgert.onnx .gpu/int8/$ONLY-edgert-full.onnx .gpu/int8/$ONLY-modelopt.onnx \
       .gpu/int8/*_images.txt $stage/int8/ && cp .gpu/int8/$ONLY-edgert-prev.onnx $stage/int8/ 2>/dev/null || true
  else
    cp $d/nanodet-m-416-coco-v8layout.onnx $d/yolov3-tiny-coco-416.onnx $d/yolov8s-fall-640.onnx $d/coco.names \
       $stage/assets/models/detection/
    cp "$src"/video/vtest.avi $stage/assets/video/
    cp .gpu/int8/*-edgert.onnx .gpu/int8/*-edgert-full.onnx .gpu/int8/*-edgert-prev.onnx .gpu/int8/*-modelopt.onnx \
       .gpu/int8/*.calib .gpu/int8/*_images.txt $stage/int8/ 2>/dev/null || true
  fi
  # OpenCV for Python 3.9 only when asked (CV=1), else in a run of its own if needed (carry .gpu/cvw): the
  # device image's own (abi3) OpenCV is tried first
  if [ "${CV:-0}" = 1 ]; then cp .gpu/cv39/*.whl $stage/; else mkdir -p .gpu/cvw && cp .gpu/cv39/*.whl .gpu/cvw/; fi
  # level 19 with a 2 GiB window: the builder resource packs to half of level 6's size (one run fewer per 50 MiB)
  tar cf - -C $stage . | zstd -q -19 --long=31 -T0 > .gpu/ta.tar.zst
  # The kit prunes libnvinfer_builder_resource to sm_90, and TensorRT 8.5 checks that library's sha256 before it
  # builds ("Assertion validateCaskKLibDigest(sha256sum) failed": runtime only). The wheel's own copy travels too.
  python3 - <<'PY'
import glob, hashlib, subprocess, zipfile
from pathlib import Path
wheel = glob.glob(".gpu/trt85/work/dl/tensorrt-8.5*.whl")[0]
data = zipfile.ZipFile(wheel).read("tensorrt/libnvinfer_builder_resource.so.8.5.3")
Path(".gpu/br.sha256").write_text(hashlib.sha256(data).hexdigest())
if not Path(".gpu/br.zst").is_file():
    Path(".gpu/br.zst").write_bytes(subprocess.run(["zstd", "-q", "-19", "--long=31", "-T0", "-c"], input=data,
                                                   capture_output=True, check=True).stdout)
PY
  # Each run carries at most 64 MiB with the ~10 MiB tree: the streams fill what the kit part leaves
  python3 - <<'PY'
import hashlib
from pathlib import Path
room = 53 << 20
kit = [sum(f.stat().st_size for f in d.iterdir()) for d in sorted(Path(".gpu/trt85").glob("p[0-9]*")) if d.is_dir()]
used = kit + [0] * 20  # bytes each run already carries
streams = {"ta": Path(".gpu/ta.tar.zst").read_bytes(), "br": Path(".gpu/br.zst").read_bytes()}
run, counts = 0, {}
for name, data in streams.items():
    pos = k = 0
    while pos < len(data):
        while room - used[run] < 1 << 20:
            run += 1
        n = min(room - used[run], len(data) - pos)
        d = Path(f".gpu/ta/{run + 1}"); d.mkdir(parents=True, exist_ok=True)
        (d / f"{name}.{k:03d}").write_bytes(data[pos:pos + n])
        pos += n; k += 1; used[run] += n
    counts[name] = f"{k} {hashlib.sha256(data).hexdigest()}"
(Path(".gpu/ta/1") / "manifest").write_text("\n".join(f"{n} {c}" for n, c in counts.items()) + "\n")
Path(".gpu/ta/1/brlib.sha256").write_text(Path(".gpu/br.sha256").read_text())
print({n: f"{len(d) / 2**20:.1f} MiB" for n, d in streams.items()}, f"in {run + 1} runs")
PY
  local parts n i
  parts=($(cd .gpu/trt85 && ls -d p[0-9]* | sort))
  n=$(ls .gpu/ta | wc -l)
  for ((i = 1; i <= n || i <= ${#parts[@]}; i++)); do
    local kp=${parts[$((i - 1))]:-px}
    echo "run $i: carry [\".gpu/trt85/$kp\", \".gpu/ta/$i\"], command: source .gpu/trt85/$kp/setup.sh; bash scripts/gpu_trt85.sh unpack"
  done
  echo "then, in the last of those runs or the next (carry .gpu/trt85/px, and .gpu/timing if an earlier session"
  echo "brought its timing caches back): source .gpu/trt85/px/setup.sh; bash scripts/gpu_trt85.sh unpack &&"
  echo "bash scripts/gpu_trt85.sh start && bash scripts/gpu_trt85.sh watch 540; then watch again, each call within"
  echo "30 s of the last's return, until the programme is done or the device time is"
}

dec() {  # the image may lack the zstd tool: the kit's zstandard for its Python 3.12 then (setup.sh unpacked it)
  if command -v zstd >/dev/null; then zstd -qdc --memory=2048MB; else env -u PYTHONHOME PYTHONPATH=/tmp/trt85/zs python3 -c \
    "import sys,zstandard; zstandard.ZstdDecompressor(max_window_size=2**31).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"; fi
}

enc() {  # the other way, for the engines sent back (the device image has no zstd tool)
  if command -v zstd >/dev/null; then zstd -q -3 -c; else env -u PYTHONHOME PYTHONPATH=/tmp/trt85/zs python3 -c \
    "import sys,zstandard; zstandard.ZstdCompressor(level=3).copy_stream(sys.stdin.buffer, sys.stdout.buffer)"; fi
}

stream() {  # NAME: "ready" once every part of that stream has come and its sha256 matches the manifest
  local want sha have
  read -r want sha < <(grep "^$1 " $TA/manifest | cut -d' ' -f2-) || { echo "$1: 0 of ? parts"; return 3; }
  have=$(ls $TA/$1.* 2>/dev/null | wc -l)
  [ "$have" -lt "$want" ] && { echo "$1: $have of $want parts"; return 3; }
  [ "$(cat $TA/$1.* | sha256sum | cut -d' ' -f1)" = "$sha" ] || { echo "$1: sha256 mismatch"; return 1; }
}

opencv() {  # the kit has no OpenCV for Python 3.9: the device image's abi3 build, or the carried wheel (CV=1)
  $PY -c "import cv2" 2>/dev/null && return 0
  local whl; whl=$(ls $ASSETS.stage/opencv*.whl .gpu/cvw/opencv*.whl 2>/dev/null | head -1)
  if [ -n "$whl" ]; then
    $PY -c "import zipfile,sys; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/trt85/site')" "$whl"
  else
    local cv; cv=$(env -u PYTHONHOME -u PYTHONPATH python3 -c "import cv2,os; print(os.path.dirname(os.path.dirname(cv2.__file__)))") || return 1
    for d in "$cv"/cv2 "$cv"/opencv_python*.libs; do [ -e "$d" ] && ln -sfn "$d" /tmp/trt85/site/; done
  fi
  $PY -c "import cv2; print('opencv', cv2.__version__, 'for Python 3.9')"
}

unpack() {
  mkdir -p $TA && cp -n .gpu/ta/*/* $TA/ 2>/dev/null
  # an earlier session's timing caches (watch brings them back; carry .gpu/timing): TensorRT skips the timing of
  # layers it finds there, and a cache of another GPU or driver is named otherwise and left alone
  [ -f .gpu/timing/timing-cache.tgz ] && mkdir -p /root/.cache/edgert && tar xzf .gpu/timing/timing-cache.tgz -C /root/.cache/edgert
  # carried engine parts are kept at once (the carried folder is there for this call only), put back once ready
  mkdir -p /tmp/edgert-eng-parts && cp -n .gpu/engines/*/eng.* /tmp/edgert-eng-parts/ 2>/dev/null
  [ -f .gpu/engines/trt85-int8.json ] && [ ! -f /tmp/edgert-int8.json ] && cp .gpu/engines/trt85-int8.json /tmp/edgert-int8.json
  if [ ! -f $ASSETS/.done ] && stream ta; then
    rm -rf $ASSETS.stage && mkdir -p $ASSETS.stage && cat $TA/ta.* | dec | tar x -C $ASSETS.stage || return 1
    mv $ASSETS.stage/assets $ASSETS && mv $ASSETS.stage/int8 /tmp/edgert-int8 && touch $ASSETS/.done
  fi
  local lib=/tmp/trt85/site/tensorrt/libnvinfer_builder_resource.so.8.5.3
  if [ ! -f /tmp/edgert-br.done ] && [ -f /tmp/trt85/site/tensorrt/libnvinfer.so.8 ] && stream br; then
    cat $TA/br.* | dec > $lib.new && [ "$(sha256sum < $lib.new | cut -d' ' -f1)" = "$(cat $TA/brlib.sha256)" ] &&
      mv $lib.new $lib && touch /tmp/edgert-br.done
  fi
  [ -f $ASSETS/.done ] && echo "assets: ready" || stream ta
  [ -f /tmp/edgert-br.done ] && echo "builder resource: ready" || stream br
  [ -f $ASSETS/.done ] && [ -f /tmp/edgert-br.done ] || return 3
  restore_engines
  opencv || echo "opencv: not importable by Python 3.9 (a run carrying .gpu/cvw brings the wheel); builds and latency go on"
}

ready() {
  unpack >/dev/null 2>&1 || { echo "not ready: $(unpack 2>&1 | tr '\n' ' ')"; exit 3; }
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

update() {  # a model update on a running TensorRT pipeline (GPU processor): a re-exported NanoDet dropped mid-run
  ready
  local m=/tmp/edgert-update/nanodet.onnx c=/tmp/edgert-update/nanodet-retrained.onnx
  mkdir -p /tmp/edgert-update && cp $ASSETS/models/detection/nanodet-m-416-coco-v8layout.onnx $m
  $PY -c "import onnx,sys; m=onnx.load(sys.argv[1]); m.doc_string='retrained'; onnx.save(m, sys.argv[2])" $m $c
  $PY -m edgert build $m --backend tensorrt > /dev/null || return 1
  (cd scripts && timeout "${LIMIT:-560}" $PY bench_model_update.py --model $m --candidate $c --backend tensorrt \
    --processing gpu --frames "${FRAMES:-100000}" --drop-at 2000 --out $OUT/model-update-trt85.json) 2>&1 | tail -40
}

tests() {
  ready
  EDGERT_GPU_BACKEND=tensorrt timeout "${LIMIT:-560}" $PY -m pytest -q -rs --durations=12 \
    ${TESTS:-tests/gpu tests/calib/test_assets_calibration.py::test_the_batch_rewrite_of_the_qdq_model_checks_on_its_float_twins} 2>&1 |
    tee $OUT/tests-gpu-trt85.log | tail -60
}

int8() {  # PHASE=build|measure|pipeline|all, JOBS=N engines built at once (each build is mostly one CPU core)
  ready
  local models="${2:-nanodet,yolov3tiny,yolov8s}"
  (cd scripts && timeout "${LIMIT:-540}" $PY bench_trt_int8.py --int8 /tmp/edgert-int8 \
    --heldout /tmp/edgert-int8/heldout_images.txt --models "$models" --out /tmp/edgert-int8.json \
    --jobs "${JOBS:-1}" --iterations "${ITERS:-100}" ${VARIANTS:+--variants $VARIANTS} ${PHASE:+--phase $PHASE}) 2>&1 | tee -a $OUT/int8.log | tail -40
  cp /tmp/edgert-int8.json $OUT/trt85-int8.json
}

# The whole programme in the background: a device call ends at 600 s and kills what it started, which lost
# every build still running at that point (an INT8 Q/DQ build of yolov3-tiny takes longer than one call), while
# a process in a session of its own runs on as long as the machine is held. `start` launches it, `watch N`
# waits up to N seconds and brings back what it has written; each call must follow the last within the
# machine's 30 s idle time.
PROG=/tmp/edgert-prog
start() {
  ready
  if [ -f $PROG/pid ] && kill -0 "$(cat $PROG/pid)" 2>/dev/null; then echo "programme already running"; return 0; fi
  rm -rf $PROG && mkdir -p $PROG/out
  STEPS="${STEPS:-$STEPS_DEFAULT}" setsid nohup bash "$0" programme > $PROG/log 2>&1 < /dev/null &
  echo $! > $PROG/pid
  setsid nohup bash "$0" sample > /dev/null 2>&1 < /dev/null &
  echo "programme started: ${STEPS:-$STEPS_DEFAULT}; JOBS=${JOBS:-3}"
}

# The default programme, most wanted first: each table:MODELS:VARIANTS step builds its engines (JOBS at once),
# then measures them and runs them through edgert run, so a session's device time ends on whole rows; a STEP&
# runs beside the steps after it, and the next measurement waits for it
STEPS_DEFAULT="table:yolov3tiny:fp16,int8-edgert,int8-modelopt table:yolov8s:fp16,int8-edgert,int8-modelopt tests
table:nanodet:fp16,int8-edgert,int8-implicit table:yolov3tiny,yolov8s,nanodet:fp32,int8-edgert-full update"

programme() {  # STEPS one after another, each to its end (LIMIT: a bound for a step that hangs)
  export OUT=$PROG/out LIMIT=${LIMIT:-3000} JOBS=${JOBS:-3}
  local s models phase
  for s in $STEPS; do
    echo "== $s $(date -u +%T)"
    case $s in
      *\&) bash "$0" "${s%&}" >> $PROG/log 2>&1 & ;;  # beside the next steps' builds
      table:*)
        models=$(echo "$s" | cut -d: -f2)
        for phase in build measure pipeline; do
          [ $phase = measure ] && wait  # latency on a GPU no other build shares
          VARIANTS=$(echo "$s" | cut -d: -f3) PHASE=$phase int8 int8 "$models"
        done ;;
      buildtime-build|buildtime-measure) "$s" ;;
      tests) tests ;;
      update) update ;;
      smoke) smoke ;;
      *) echo "unknown step $s" ;;
    esac
    echo "== $s done $(date -u +%T)"
  done
  touch $PROG/done
}

buildtime-build() {  # yolov3-tiny FP16 built with and without the JIT and edge-mask convolution tactics
  ready
  (cd scripts && $PY bench_trt_build.py --phase build --variants "${BT_VARIANTS:-default,no-jit,no-jit-no-edge}" \
    --out $OUT/trt85-build-sources.json) 2>&1 | tail -20
}

buildtime-measure() {
  ready
  (cd scripts && $PY bench_trt_build.py --phase measure --variants "${BT_VARIANTS:-default,no-jit,no-jit-no-edge}" \
    --out $OUT/trt85-build-sources.json) 2>&1 | tail -20
}

sample() {  # every 30 s while the programme runs: GPU use, CUDA's kernel cache (grows when the driver compiles
  # PTX) and each build worker's CPU seconds, so a long build's idle GPU is told from its work
  until [ -f $PROG/done ]; do
    echo "$(date -u +%T) gpu $(nvidia-smi --query-gpu=utilization.gpu,memory.used,clocks.sm --format=csv,noheader \
      2>&1 | tr -d ' ') cuda-cache $(du -sm $CUDA_CACHE_PATH 2>/dev/null | cut -f1) MB workers $(ps -eo pid=,time=,args= \
      | awk '/python.*(multiprocessing|bench_)/ && !/awk/ {printf "%s:%s ", $1, $2}')" >> $PROG/out/samples.txt
    sleep 30
  done
}

watch() {  # up to $1 seconds (570), or until the programme ends; its results into $OUT (8 files at most)
  local end=$(($(date +%s) + ${1:-570}))
  while [ "$(date +%s)" -lt $end ] && [ ! -f $PROG/done ]; do sleep 5; done
  cp /tmp/edgert-int8.json $PROG/out/trt85-int8.json 2>/dev/null; cp $PROG/log $PROG/out/programme.log
  du -sh $CUDA_CACHE_PATH > $PROG/out/cuda-cache.txt 2>&1
  tar czf $OUT/results.tgz -C $PROG out
  tar czf $OUT/timing-cache.tgz -C /root/.cache/edgert timing 2>/dev/null
  send_engines 4; ls -l $OUT
  [ -f $PROG/done ] && echo "programme done" || echo "programme running"; tail -c 6000 $PROG/log
}

# Finished engines (the INT8 table's, tests/gpu's) go back to the machine the runs come from, a few parts per
# call: an INT8 build on 8.5 here outlasts a session's device time, and the next session carries them
# (.gpu/engines/N, one run each beside the chain: unpack puts them back once ready), so its builds find them in
# edgert's engine cache (which rebuilds one whose sidecar names another TensorRT) and its device time goes to
# measuring
ENG=/tmp/edgert-trt-int8
# where engines are built, by the key their parts carry: the INT8 table's, tests/gpu's beside the assets'
# models, and those beside the cached dynamic-batch rewrites (edgert run --batch, tests/gpu's batched runs)
declare -A ENGDIRS=([int8]=$ENG [assets]=$ASSETS/models/detection [batch]=/root/.cache/edgert/batch)
gpu_tag() {  # h100 or h200: the parts are named by the GPU they were built on, and restored only on that GPU
  local tag
  tag=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9][0-9]*' | head -1)
  echo "${tag:-gpu}" | tr 'H' 'h'
}

send_engines() {  # $1: how many part files of at most 15 MiB this call may bring back
  local room=$1 key e n m k part
  mkdir -p $PROG/parts && touch $PROG/sent
  for key in "${!ENGDIRS[@]}"; do
    for e in "${ENGDIRS[$key]}"/*.engine; do
      [ -f "$e.json" ] || continue  # the sidecar is written once the engine is whole
      n=$(gpu_tag).$key.$(basename "$e"); [ -f $PROG/parts/$n.packed ] && continue
      rm -f $PROG/parts/eng.$n.tzst.*
      tar cf - -C "${ENGDIRS[$key]}" "$(basename "$e")" "$(basename "$e").json" | enc |
        split -b 15m -d -a 1 - $PROG/parts/eng.$n.tzst.
      m=$(ls $PROG/parts/eng.$n.tzst.* 2>/dev/null | wc -l)
      [ "$m" -gt 0 ] && [ -s $PROG/parts/eng.$n.tzst.0 ] || { echo "engines: $n could not be packed"; continue; }
      for ((k = 0; k < m; k++)); do mv $PROG/parts/eng.$n.tzst.$k $PROG/parts/eng.$n.tzst.$k-of-$m; done
      touch $PROG/parts/$n.packed
    done
  done
  for part in $PROG/parts/eng.*; do
    [ -f "$part" ] && [ "$room" -gt 0 ] || continue
    grep -qxF "$(basename $part)" $PROG/sent && continue
    cp "$part" $OUT/ && basename "$part" >> $PROG/sent && room=$((room - 1))
  done
  echo "engine parts: $(wc -l < $PROG/sent) sent of $(ls $PROG/parts/eng.* 2>/dev/null | wc -l)"
}

keep() {  # here, after each device call: DIR (the reply's files_at) into .gpu: results, timing caches, engine parts
  set -e
  local dir=${1:?usage: gpu_trt85.sh keep DIR} stamp part n=1 size=0 s
  stamp=$(date -u +%H%M%S)
  mkdir -p .gpu/results/$stamp .gpu/timing .gpu/engines/incoming
  [ -f $dir/results.tgz ] && tar xzf $dir/results.tgz -C .gpu/results/$stamp && echo "results: .gpu/results/$stamp/out"
  [ -f .gpu/results/$stamp/out/trt85-int8.json ] && cp .gpu/results/$stamp/out/trt85-int8.json .gpu/engines/
  [ -s $dir/timing-cache.tgz ] && cp $dir/timing-cache.tgz .gpu/timing/
  cp $dir/eng.* .gpu/engines/incoming/ 2>/dev/null || true
  # into runs of at most 48 MiB each (a run carries 64 MiB with the tree), the folders the next chain carries
  while [ -d .gpu/engines/$n ]; do n=$((n + 1)); done
  for part in .gpu/engines/incoming/eng.*; do
    [ -f "$part" ] || continue
    s=$(stat -c %s "$part")
    if [ $((size + s)) -gt $((48 << 20)) ] && [ $size -gt 0 ]; then n=$((n + 1)); size=0; fi
    mkdir -p .gpu/engines/$n && mv "$part" .gpu/engines/$n/ && size=$((size + s))
  done
  for part in .gpu/engines/[0-9]*; do
    echo "carry [\".gpu/trt85/px\", \"$part\", \".gpu/engines/trt85-int8.json\"]: $(ls $part | tr '\n' ' ')"
  done
}

restore_engines() {  # the kept parts of engines built on this GPU, each engine once all its parts have come
  local first name m k key
  for first in /tmp/edgert-eng-parts/eng."$(gpu_tag)".*.tzst.0-of-*; do
    [ -f "$first" ] || continue
    name=${first%.tzst.0-of-*} m=${first##*-of-}
    [ -f "$name.restored" ] && continue
    [ "$(ls "$name".tzst.*-of-"$m" | wc -l)" = "$m" ] || { echo "engines: $(basename "$name") waits for parts"; continue; }
    key=$(basename "$name" | cut -d. -f3)
    [ -n "${ENGDIRS[$key]:-}" ] || { echo "engines: $(basename "$name"): no folder for $key"; continue; }
    mkdir -p "${ENGDIRS[$key]}"
    for ((k = 0; k < m; k++)); do cat "$name.tzst.$k-of-$m"; done | dec | tar x -C "${ENGDIRS[$key]}" &&
      touch "$name.restored" && echo "engines: ${name#*/eng.} restored"
  done
}

through() {  # builds, measure, pipeline, each resumable, within one device run's limit (END: epoch seconds)
  local end=${END:-$(($(date +%s) + 570))} phase left
  export VARIANTS=${VARIANTS:-fp16,int8-edgert,int8-modelopt,int8-edgert-full,fp32,int8-edgert-prev} JOBS=${JOBS:-14}
  for phase in build measure pipeline; do
    left=$((end - $(date +%s))); [ $left -lt 30 ] && { echo "no time left for $phase"; return 3; }
    if [ $phase = build ]; then LIMIT=$left builds "$@"; else PHASE=$phase LIMIT=$left int8 "$@"; fi
  done
}

builds() {  # every engine of the INT8 table (JOBS at once), the CLI smoke and the tests' engines beside them
  ready
  local pid= pre= limit=${LIMIT:-530}
  # beside the builds, within the same limit: a run past it loses everything the device brings back
  [ "${SMOKE:-1}" = 1 ] && { timeout -k 5 $limit bash "$0" smoke > $OUT/smoke-run.log 2>&1 & pid=$!; }
  # the engines tests/gpu opens beside the assets, and the batch-6 timings its batched copies then find cached
  [ "${PREBUILD:-1}" = 1 ] && EDGERT_GPU_BACKEND=tensorrt timeout -k 5 $limit $PY - > $OUT/tests-prebuild.log 2>&1 <<'PY' &
import os, tempfile, time
from pathlib import Path
from edgert.rewrite.batch import batched_model_path
from tests.gpu.test_gpu_device import NANODET, YOLOV8, prepared
a, tmp = Path(os.environ["EDGERT_ASSETS"]) / "models" / "detection", Path(tempfile.mkdtemp())
for model, batch in ((a / NANODET, 1), (a / YOLOV8, 1), (a / NANODET, 4), (batched_model_path(a / NANODET, tmp), 6),
                     (batched_model_path(a / YOLOV8, tmp), 6)):
    t0 = time.perf_counter(); prepared(model, batch); print(model.name, batch, f"{time.perf_counter() - t0:.0f} s", flush=True)
PY
  [ "${PREBUILD:-1}" = 1 ] && pre=$!
  PHASE=build LIMIT=$limit int8 "$@"
  wait $pid $pre; tail -c 2000 $OUT/smoke.log 2>/dev/null; cat $OUT/tests-prebuild.log 2>/dev/null
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
    if [ "${MODELOPT_ONLY:-0}" != 1 ]; then
      $here_py -m edgert calibrate "$file" --images "$src/images" -o $out/$name-edgert.onnx "${cache[@]}" \
        > $out/$name-edgert.log 2>&1 || true
      $here_py -m edgert calibrate "$file" --images "$src/images" -o $out/$name-edgert-full.onnx --full-int8 \
        > $out/$name-edgert-full.log 2>&1 || true
    fi
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
# ModelOpt's defaults but FP32 around the Q/DQ: its default (FP16 weights, activations and scales, opset 19)
# is for TensorRT 10, and TensorRT 8.5's parser reads FP16 scales as FP32 ("Scale coefficients must all be
# positive"). TensorRT still runs the float layers in FP16 (the builder's FP16 flag, as for edgert's models).
info = modelopt_quantize(venv, model, work / "calib32.npz", out / f"{name}-modelopt.onnx", work / "modelopt",
                         ["--high_precision_dtype", "fp32"])
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
  keep) keep "${2:-}" ;;
  models) make_models ;;
  pack-int8) pack_int8 ;;
  int8-extra) mkdir -p /tmp/edgert-int8 && tar xf .gpu/tb/int8.tar -C /tmp/edgert-int8 && ls -la /tmp/edgert-int8 ;;
  unpack) unpack ;;
  start) start ;;
  programme) programme ;;
  sample) sample ;;
  watch) watch "${2:-570}" ;;
  smoke) smoke ;;
  tests) tests ;;
  int8) int8 "$@" ;;
  builds) builds "$@" ;;
  through) through "$@" ;;
  update) update ;;
  buildtime-build) buildtime-build ;;
  buildtime-measure) buildtime-measure ;;
  pipeline) PHASE=pipeline int8 "$@" ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
