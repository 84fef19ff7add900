#!/usr/bin/env bash
# The CPU test suite on a second Python: the device machine's Python 3.12 (issue 15; CI runs 3.11 here).
#
#   bash scripts/py312_suite.sh pack   development machine, repo root: download the cp312 wheels of the test
#                                      dependencies the device image lacks into .whl/ (git-excluded; ~5 MB)
#   bash scripts/py312_suite.sh run    device machine (no network): install those wheels into its python3 and
#                                      run the suite without the GPU tests; log and summary into $OUT
# Assets: with EDGERT_ASSETS pointing at staged assets (scripts/gpu_stage_assets.sh) the asset tests run too;
# without, they skip with their reason, as on any machine without ../shared/assets.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd="${1:-run}"
# What tests import beyond the device image's packages (KINDS.md lists those): the val extra, the speech
# extra and librosa (the test-only reference for the speech features), with their own missing dependencies.
WHEELS=(pycocotools soundfile soxr cffi pycparser librosa audioread pooch decorator platformdirs paho-mqtt)
if [ "$cmd" = pack ]; then
  exclude="$(git rev-parse --git-path info/exclude)"
  grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
  rm -rf .whl && mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "${WHEELS[@]}"
  ls .whl
  exit 0
fi
out="${OUT:-py312-out}"
mkdir -p "$out"
python3 --version 2>&1 | tee "$out/python.txt"
python3 -m pip install -q --no-deps --no-index .whl/*.whl 2>&1 | tail -3
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import edgert, numpy, onnxruntime, cv2, pycocotools; print('edgert', edgert.__version__, 'numpy',
numpy.__version__, 'onnxruntime', onnxruntime.__version__, 'cv2', cv2.__version__)" 2>&1 | tee -a "$out/python.txt"
python3 -m pytest -q -p no:cacheprovider -m "not gpu" -rs "${@:2}" > "$out/suite.log" 2>&1
rc=$?
tail -40 "$out/suite.log"
exit "$rc"
