// edgert GPU decoding: the confidence filter, so only candidate boxes come back to the host.
//
// Each thread looks at one anchor. An anchor that passes the threshold takes a row with atomicAdd on
// a device counter and writes one row of EDGERT_CAND_COLS floats:
//   cx, cy, w, h, score, class id, anchor index, 0
// Rows arrive in any order; the host sorts them by anchor index, so the result is the same set, in
// the same order, as the numpy decoders in edgert.vision.decoders. When more anchors pass than there
// are rows, the counter still counts them all (edgert_take_counts hands it to the host) and the host
// falls back to decoding that sample from the whole output.
// NMS stays on the host (the candidate count is small after the filter).
//
// Semantics are those of the CPU decoders, operation for operation:
//   yolov8 [1, 4+C, N]: score = max over classes (first maximum wins), keep score > conf
//   yolov5 [1, N, 5+C]: keep objectness > conf, score = max over classes of cls * obj (float32
//                       product, __fmul_rn so nothing is fused), keep score > conf

#define EDGERT_CAND_COLS 8

__device__ __forceinline__ void edgert_anchor_yolov8(const float* __restrict__ out, int i, int num_classes, int n,
                                                     float conf, int capacity, int* __restrict__ counter,
                                                     float* __restrict__ rows) {
    const float* s = out + (size_t)4 * n + i;
    float best = s[0];
    int cls = 0;
    for (int c = 1; c < num_classes; ++c) {
        const float v = s[(size_t)c * n];
        if (v > best) { best = v; cls = c; }
    }
    if (!(best > conf)) return;
    const int k = atomicAdd(counter, 1);
    if (k >= capacity) return;
    float* r = rows + (size_t)k * EDGERT_CAND_COLS;
    r[0] = out[i];
    r[1] = out[(size_t)n + i];
    r[2] = out[(size_t)2 * n + i];
    r[3] = out[(size_t)3 * n + i];
    r[4] = best;
    r[5] = (float)cls;
    r[6] = (float)i;
    r[7] = 0.0f;
}

__device__ __forceinline__ void edgert_anchor_yolov5(const float* __restrict__ out, int i, int num_classes, int n,
                                                     float conf, int capacity, int* __restrict__ counter,
                                                     float* __restrict__ rows) {
    const float* a = out + (size_t)i * (5 + num_classes);
    const float obj = a[4];
    if (!(obj > conf)) return;
    float best = __fmul_rn(a[5], obj);
    int cls = 0;
    for (int c = 1; c < num_classes; ++c) {
        const float v = __fmul_rn(a[5 + c], obj);
        if (v > best) { best = v; cls = c; }
    }
    if (!(best > conf)) return;
    const int k = atomicAdd(counter, 1);
    if (k >= capacity) return;
    float* r = rows + (size_t)k * EDGERT_CAND_COLS;
    r[0] = a[0];
    r[1] = a[1];
    r[2] = a[2];
    r[3] = a[3];
    r[4] = best;
    r[5] = (float)cls;
    r[6] = (float)i;
    r[7] = 0.0f;
}

// The filter kernels: a whole batch in one launch (one sample is a batch of one); blockIdx.y is the sample.
// Sample b reads out + b * out_stride floats, counts on counters[b] and writes its rows after its own
// header row: region b starts at buf + b * (EDGERT_HEADER_ROWS + capacity) * EDGERT_CAND_COLS floats.
#define EDGERT_HEADER_ROWS 1
extern "C" __global__ void edgert_filter_yolov8_batch(const float* __restrict__ out, long long out_stride,
                                                      int num_classes, int n, float conf, int capacity,
                                                      int* __restrict__ counters, float* __restrict__ buf) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int b = blockIdx.y;
    float* region = buf + (size_t)b * (EDGERT_HEADER_ROWS + capacity) * EDGERT_CAND_COLS;
    edgert_anchor_yolov8(out + (size_t)b * out_stride, i, num_classes, n, conf, capacity, counters + b,
                         region + EDGERT_HEADER_ROWS * EDGERT_CAND_COLS);
}

extern "C" __global__ void edgert_filter_yolov5_batch(const float* __restrict__ out, long long out_stride,
                                                      int num_classes, int n, float conf, int capacity,
                                                      int* __restrict__ counters, float* __restrict__ buf) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int b = blockIdx.y;
    float* region = buf + (size_t)b * (EDGERT_HEADER_ROWS + capacity) * EDGERT_CAND_COLS;
    edgert_anchor_yolov5(out + (size_t)b * out_stride, i, num_classes, n, conf, capacity, counters + b,
                         region + EDGERT_HEADER_ROWS * EDGERT_CAND_COLS);
}

// After a filter: hand each sample's count to its region's host-visible header and reset the device counter
// for the next call (so no memset is needed, and no atomic ever touches host memory, which matters for
// zero-copy buffers on discrete GPUs where atomics over PCIe are not guaranteed). One thread per sample.
extern "C" __global__ void edgert_take_counts(int* __restrict__ counters, float* __restrict__ buf, int batch,
                                              int capacity) {
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    int* header = (int*)(buf + (size_t)b * (EDGERT_HEADER_ROWS + capacity) * EDGERT_CAND_COLS);
    header[0] = counters[b];
    counters[b] = 0;
}
