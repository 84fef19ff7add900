# Sourced by the device scripts (scripts/gpu_pipeline.sh, scripts/gpu_many_streams.sh) from the repo root, after
# `source .gpu/kit/device-setup.sh`:  gpu_ready NAME
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
