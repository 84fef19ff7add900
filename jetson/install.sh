#!/usr/bin/env bash
# Install what edgert needs on a JetPack system, or (--check) only report what is missing.
#
#   sudo jetson/install.sh                 # apt packages, /opt/edgert/venv, edgert[gpu] from this checkout
#   jetson/install.sh --check              # report only; changes nothing, needs no root
#   sudo jetson/install.sh --from dist/edgert-0.1.0-py3-none-any.whl   # or a wheel (python -m build)
#
# Idempotent: every step checks first and does only what is missing. The virtualenv is made with
# --system-site-packages so JetPack's TensorRT bindings (python3-libnvinfer) and its GStreamer-enabled
# OpenCV stay importable; pip never installs opencv-python into it (that wheel has no GStreamer and
# would shadow JetPack's cv2), and numpy stays below 2 because JetPack's cv2 and TensorRT bindings are
# built against numpy 1.x.
set -euo pipefail

PREFIX=/opt/edgert
SPEC=""
EXTRAS="gpu"
CHECK=0
FORCE=0
UPGRADE=0
PYTHON=${PYTHON:-/usr/bin/python3}

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    cat <<EOF

Options:
  --check          report what is missing, change nothing (exit 0: complete, 1: something missing)
  --prefix DIR     where the virtualenv goes: DIR/venv (default $PREFIX)
  --from SPEC      what pip installs: an edgert checkout, a wheel, or a requirement such as edgert (PyPI, once
                   published) (default: the checkout this script is in)
  --extras LIST    edgert extras (default: $EXTRAS)
  --upgrade        reinstall edgert even when the virtualenv already has it
  --force          install on a machine that is not a Jetson
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
        --check) CHECK=1 ;;
        --prefix) PREFIX=${2:?--prefix needs a folder}; shift ;;
        --from) SPEC=${2:?--from needs a path or requirement}; shift ;;
        --extras) EXTRAS=${2:?--extras needs a list, e.g. gpu,cpu}; shift ;;
        --upgrade) UPGRADE=1 ;;
        --force) FORCE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
VENV="$PREFIX/venv"

is_jetson() {
    [ -f /etc/nv_tegra_release ] || grep -qs "nvidia,tegra" /proc/device-tree/compatible
}

pkg_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

pkg_available() {
    apt-cache policy "$1" 2>/dev/null | grep -q "Candidate: [^(]"
}

MISSING=()        # human-readable lines
APT_MISSING=()    # packages to install

report() {  # report ok|missing WHAT WHY
    if [ "$1" = ok ]; then
        printf '  ok       %s\n' "$2"
    else
        printf '  missing  %s: %s\n' "$2" "$3"
        MISSING+=("$2")
    fi
}

need_pkg() {  # need_pkg PACKAGE WHY
    if pkg_installed "$1"; then
        report ok "$1 (apt)"
    else
        report missing "$1 (apt)" "$2"
        APT_MISSING+=("$1")
    fi
}

python_has() {  # python_has PYTHON CODE: true when the code runs
    "$1" -c "$2" >/dev/null 2>&1
}

CV2_GST='import cv2, re, sys; m = re.search(r"GStreamer:\s*(\w+)", cv2.getBuildInformation()); sys.exit(0 if m and m.group(1).upper().startswith("YES") else 1)'

survey() {
    MISSING=()
    APT_MISSING=()
    echo "edgert install check ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
    if is_jetson; then
        echo "  jetson   $(head -n1 /etc/nv_tegra_release 2>/dev/null | cut -c1-60 || echo yes)"
    else
        echo "  jetson   no: not a JetPack system (no /etc/nv_tegra_release); Jetson-only items are listed for reference"
    fi

    if [ -x "$PYTHON" ] && python_has "$PYTHON" 'import sys; sys.exit(0 if sys.version_info >= (3, 8) else 1)'; then
        report ok "python $("$PYTHON" -c 'import platform; print(platform.python_version())') ($PYTHON)"
    else
        report missing "python >= 3.8 ($PYTHON)" "edgert needs Python 3.8+ (JetPack 5 ships 3.8, JetPack 6 3.10, JetPack 7 3.12)"
    fi

    echo "system packages"
    need_pkg python3-venv "makes the virtualenv"
    need_pkg python3-dev "headers to build pycuda"
    need_pkg build-essential "compiler to build pycuda"
    need_pkg gstreamer1.0-tools "gst-inspect-1.0, gst-launch-1.0 for camera checks"
    need_pkg gstreamer1.0-plugins-good "rtspsrc, v4l2src, jpeg"
    need_pkg gstreamer1.0-plugins-bad "h264parse, h265parse"
    need_pkg gstreamer1.0-rtsp "rtspclientsink for the rtsp:// output"
    need_pkg gstreamer1.0-libav "software decoders when no hardware decoder fits"

    echo "JetPack packages"
    need_pkg python3-libnvinfer "TensorRT's Python bindings"
    need_pkg nvidia-l4t-gstreamer "nvarguscamerasrc (CSI cameras), nvv4l2decoder (hardware decoding)"
    if python_has "$PYTHON" "$CV2_GST"; then
        report ok "OpenCV with GStreamer (system python3)"
    elif pkg_available nvidia-opencv; then
        report missing "nvidia-opencv (apt)" "JetPack's OpenCV, built with GStreamer"
        APT_MISSING+=(nvidia-opencv)
    else
        need_pkg python3-opencv "OpenCV with GStreamer for camera and RTSP sources"
    fi
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        report ok "CUDA nvcc (/usr/local/cuda/bin/nvcc)"
    elif pkg_available nvidia-cuda-dev; then
        report missing "nvidia-cuda-dev (apt)" "nvcc, to build pycuda"
        APT_MISSING+=(nvidia-cuda-dev)
    else
        report missing "CUDA nvcc" "needed to build pycuda; install JetPack's CUDA (apt install nvidia-jetpack)"
    fi

    echo "edgert"
    if [ -f "$VENV/pyvenv.cfg" ]; then
        if grep -qs "^include-system-site-packages *= *true" "$VENV/pyvenv.cfg"; then
            report ok "virtualenv $VENV (with system site packages)"
        else
            report missing "system site packages in $VENV" "TensorRT and OpenCV from apt would be invisible"
        fi
    else
        report missing "virtualenv $VENV" "python3 -m venv --system-site-packages $VENV"
    fi
    if [ -x "$VENV/bin/edgert" ] && "$VENV/bin/edgert" --version >/dev/null 2>&1; then
        report ok "$("$VENV/bin/edgert" --version) in $VENV"
        if python_has "$VENV/bin/python" "import tensorrt"; then
            report ok "tensorrt importable in the virtualenv"
        else
            report missing "tensorrt in the virtualenv" "python3-libnvinfer, and a virtualenv with system site packages"
        fi
        if python_has "$VENV/bin/python" "$CV2_GST"; then
            report ok "cv2 with GStreamer in the virtualenv"
        else
            report missing "cv2 with GStreamer in the virtualenv" "remove pip's opencv-python from $VENV; use JetPack's"
        fi
        # Optional: PyPI's onnxruntime-gpu wheels are x86-64 only; Jetson's come from NVIDIA (see jetson/README.md).
        if python_has "$VENV/bin/python" "import onnxruntime as o, sys; sys.exit(0 if 'CUDAExecutionProvider' in o.get_available_providers() else 1)"; then
            report ok "onnxruntime with CUDA in the virtualenv (optional)"
        else
            printf '  note     onnxruntime-gpu (optional, for --backend onnxruntime-cuda): not from PyPI on a Jetson; %s\n' \
                "JetPack 6: $VENV/bin/pip install onnxruntime-gpu 'numpy<2' --index-url https://pypi.jetson-ai-lab.io/jp6/cu126"
        fi
    else
        report missing "edgert in $VENV" "pip install 'edgert[$EXTRAS]' 'numpy<2' into the virtualenv"
    fi
}

survey
if [ "$CHECK" = 1 ]; then
    if [ ${#MISSING[@]} -eq 0 ]; then
        echo "complete: nothing missing"
        exit 0
    fi
    echo "${#MISSING[@]} missing; to install them: sudo $0"
    exit 1
fi

# ---- install -------------------------------------------------------------------------------------
if ! is_jetson && [ "$FORCE" != 1 ]; then
    echo "install.sh: this is not a JetPack system; pass --force to install the generic parts anyway" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "install.sh: installing needs root (apt, $PREFIX): run it with sudo, or use --check" >&2
    exit 1
fi

if [ ${#APT_MISSING[@]} -gt 0 ]; then
    installable=()
    for p in "${APT_MISSING[@]}"; do
        if pkg_available "$p"; then installable+=("$p"); else echo "  skip     $p: no apt candidate here" >&2; fi
    done
    if [ ${#installable[@]} -gt 0 ]; then
        echo "apt-get install ${installable[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${installable[@]}"
    fi
fi

if [ ! -f "$VENV/pyvenv.cfg" ]; then
    echo "creating $VENV"
    mkdir -p "$PREFIX"
    "$PYTHON" -m venv --system-site-packages "$VENV"
elif ! grep -qs "^include-system-site-packages *= *true" "$VENV/pyvenv.cfg"; then
    echo "turning on system site packages in $VENV"
    sed -i 's/^include-system-site-packages *=.*/include-system-site-packages = true/' "$VENV/pyvenv.cfg"
fi

if [ "$UPGRADE" = 1 ] || ! "$VENV/bin/edgert" --version >/dev/null 2>&1; then
    if [ -z "$SPEC" ]; then  # edgert is not on PyPI (yet): install the checkout this script came with
        SPEC="$(cd "$(dirname "$0")/.." && pwd)[$EXTRAS]"
    elif [ -f "$SPEC" ] && [ "${SPEC%.whl}" != "$SPEC" ]; then
        SPEC="$(cd "$(dirname "$SPEC")" && pwd)/$(basename "$SPEC")[$EXTRAS]"
    elif [ -d "$SPEC" ]; then
        SPEC="$(cd "$SPEC" && pwd)[$EXTRAS]"
    fi
    constraints="$(mktemp)"
    trap 'rm -f "$constraints"' EXIT
    echo "numpy<2" >"$constraints"
    pip_flags=(--constraint "$constraints")
    if [ "$UPGRADE" = 1 ]; then pip_flags+=(--upgrade); fi
    # pycuda ([gpu]) is built from source against CUDA: say so in one line before pip's long build log.
    case "$EXTRAS" in *gpu*)
        if ! PATH="/usr/local/cuda/bin:$PATH" command -v nvcc >/dev/null 2>&1 || [ ! -f /usr/local/cuda/include/cuda.h ]; then
            echo "edgert[gpu]: pycuda needs CUDA's nvcc and cuda.h (/usr/local/cuda); install JetPack's CUDA (apt install nvidia-cuda-dev) or pycuda's build will fail"
        fi ;;
    esac
    echo "pip install $SPEC"
    PATH="/usr/local/cuda/bin:$PATH" CUDA_ROOT=/usr/local/cuda "$VENV/bin/pip" install "${pip_flags[@]}" "$SPEC"
fi

echo
survey || true
echo
echo "next: sudo $VENV/bin/edgert service install --config /etc/edgert/NAME.yaml --name NAME"
