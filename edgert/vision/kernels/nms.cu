// edgert GPU NMS: the host's finishing step (class filter, class-aware greedy NMS, max_det, the mapping back to
// the frame) for every sample of a batch, after the confidence filter of decode.cu, so that the host gets the
// final boxes of the whole batch in one small copy.
//
// Semantics are those of DecoderBase._finish_batch with OpenCV's NMSBoxes (edgert.vision.nms), step for step:
//   xyxy:    x1 = cx - w * 0.5, y1 = cy - h * 0.5, x2 = cx + w * 0.5, y2 = cy + h * 0.5 in float32 (cxcywh_to_xyxy)
//   filter:  rows whose class is not allowed are dropped first (decode.classes)
//   order:   score descending, ties by anchor index ascending (the host's stable sort of anchor-ordered rows)
//   greedy:  a box is kept unless a kept box of its class (any class when agnostic) overlaps it by more than
//            iou, with OpenCV's overlap: 1 - float(1 - inter / union), union and inter in double; boxes whose
//            areas sum to ~0 count as overlapping fully (OpenCV's jaccardDistance)
//   max_det: at most max_det kept per sample, best first
//   mapping: x = clip((x - pad_x) / scale_x, 0, src_width), y likewise, float32 (LetterboxTransform.to_original)
// Every float32 step uses the _rn intrinsics, so nothing is fused and the bits are the host's.
//
// edgert_nms_batch: one block per sample; the sample's candidate rows (at most `capacity`) sit in shared memory.
// It takes each sample's count from the filter's device counter and resets it (so the filter's edgert_take_counts
// launch is not needed), and the last block to finish packs every sample's kept boxes one after another (sample
// order) with the per-sample counts in front (-n: the sample's n candidates overflowed the filter's buffer; the
// host decodes that sample from the whole output). One launch per batch: each launch is a driver call made while
// the slot's thread holds the interpreter lock.

#define EDGERT_CAND_COLS 8
#define EDGERT_HEADER_ROWS 1
#define EDGERT_KEPT_COLS 6  // x1, y1, x2, y2, score, class (int bits)
#define EDGERT_TABLE_COLS 6  // pad_x, scale_x, pad_y, scale_y, src_width, src_height

__device__ __forceinline__ bool edgert_overlaps(const float4 a, const float4 b, float iou) {
    const double ax1 = a.x, ay1 = a.y, ax2 = a.z, ay2 = a.w;
    const double bx1 = b.x, by1 = b.y, bx2 = b.z, by2 = b.w;
    const double area_a = (ax2 - ax1) * (ay2 - ay1);
    const double area_b = (bx2 - bx1) * (by2 - by1);
    float overlap;
    if (area_a + area_b <= 2.220446049250313e-16) {
        overlap = 1.0f;  // jaccardDistance's "both empty": distance 0
    } else {
        const double iw = fmin(ax2, bx2) - fmax(ax1, bx1);
        const double ih = fmin(ay2, by2) - fmax(ay1, by1);
        const double inter = (iw > 0.0 && ih > 0.0) ? iw * ih : 0.0;
        overlap = 1.0f - (float)(1.0 - inter / (area_a + area_b - inter));
    }
    return overlap > iou;
}

__device__ __forceinline__ int edgert_align16(int bytes) { return (bytes + 15) & ~15; }

// Output layout (32-bit words): counts[batch_pad], then xyxy[cap][4], conf[cap], cls[cap], cap = batch * max_det.
__device__ void edgert_nms_pack(const float* __restrict__ kept, const int* __restrict__ kept_count, int batch,
                                int batch_pad, int max_det, int* __restrict__ out, int* __restrict__ start) {
    const int tid = threadIdx.x, nt = blockDim.x;
    if (tid == 0) {
        int s = 0;
        for (int b = 0; b < batch; ++b) {
            start[b] = s;
            const int c = __ldcg(kept_count + b);  // written by other blocks: read past L1
            out[b] = c;
            if (c > 0) s += c;
        }
        start[batch] = s;
    }
    __syncthreads();
    const size_t cap = (size_t)batch * max_det;
    float* xyxy = (float*)(out + batch_pad);
    float* conf = xyxy + cap * 4;
    int* cls = (int*)(conf + cap);
    for (int b = 0; b < batch; ++b) {
        const int c = start[b + 1] - start[b];
        const float* src = kept + (size_t)b * max_det * EDGERT_KEPT_COLS;
        for (int k = tid; k < c; k += nt) {
            const float* r = src + (size_t)k * EDGERT_KEPT_COLS;
            const size_t d = (size_t)start[b] + k;
            xyxy[d * 4 + 0] = __ldcg(r + 0);
            xyxy[d * 4 + 1] = __ldcg(r + 1);
            xyxy[d * 4 + 2] = __ldcg(r + 2);
            xyxy[d * 4 + 3] = __ldcg(r + 3);
            conf[d] = __ldcg(r + 4);
            cls[d] = __float_as_int(__ldcg(r + 5));
        }
    }
}

extern "C" __global__ void edgert_nms_batch(int* __restrict__ counters, const float* __restrict__ buf, int capacity,
                                            const float* __restrict__ table,
                                            const unsigned char* __restrict__ allowed, int num_allowed,
                                            float iou, int agnostic, int max_det,
                                            float* __restrict__ kept, int* __restrict__ kept_count,
                                            unsigned int* __restrict__ finished, int batch_pad,
                                            int* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int b = blockIdx.x, batch = gridDim.x;
    const int tid = threadIdx.x, nt = blockDim.x;
    int* start = (int*)smem;  // batch + 1, for the packing
    float4* box = (float4*)(smem + edgert_align16(4 * (batch + 1)));  // capacity
    float* score = (float*)(box + capacity);              // capacity
    int* cls = (int*)(score + capacity);                  // capacity
    int* anchor = cls + capacity;                         // capacity
    int* order = anchor + capacity;                       // capacity: rank -> row
    unsigned char* valid = (unsigned char*)(order + capacity);  // capacity
    unsigned char* alive = valid + capacity;              // capacity, by rank
    __shared__ int n_shared, valid_count;
    __shared__ bool last;
    if (tid == 0) {
        n_shared = counters[b];
        counters[b] = 0;  // ready for the next batch's filter
        valid_count = 0;
    }
    __syncthreads();
    const int n = n_shared;
    int done = 0;  // the same in every thread: alive[] only changes between barriers
    if (n <= capacity) {
        const float* rows = buf + ((size_t)b * (EDGERT_HEADER_ROWS + capacity) + EDGERT_HEADER_ROWS) * EDGERT_CAND_COLS;
        for (int i = tid; i < n; i += nt) {
            const float* r = rows + (size_t)i * EDGERT_CAND_COLS;
            const float hw = __fmul_rn(r[2], 0.5f), hh = __fmul_rn(r[3], 0.5f);
            box[i] = make_float4(__fsub_rn(r[0], hw), __fsub_rn(r[1], hh), __fadd_rn(r[0], hw),
                                 __fadd_rn(r[1], hh));
            score[i] = r[4];
            const int c = (int)r[5];
            cls[i] = c;
            anchor[i] = (int)r[6];
            valid[i] = (allowed == nullptr || (c >= 0 && c < num_allowed && allowed[c])) ? 1 : 0;
        }
        __syncthreads();
        // Rank of each valid row among the valid rows: the position a stable sort by -score would give it.
        for (int i = tid; i < n; i += nt) {
            if (!valid[i]) continue;
            const float s = score[i];
            const int a = anchor[i];
            int rank = 0;
            for (int j = 0; j < n; ++j) {
                if (valid[j] && (score[j] > s || (score[j] == s && anchor[j] < a))) ++rank;
            }
            order[rank] = i;
            atomicAdd(&valid_count, 1);
        }
        __syncthreads();
        const int m = valid_count;
        for (int q = tid; q < m; q += nt) alive[q] = 1;
        __syncthreads();
        const float* t = table + (size_t)b * EDGERT_TABLE_COLS;
        float* dst = kept + (size_t)b * max_det * EDGERT_KEPT_COLS;
        for (int r = 0; r < m && done < max_det; ++r) {
            if (!alive[r]) continue;
            const int i = order[r];
            const float4 a = box[i];
            const int ca = cls[i];
            if (tid == 0) {
                float* o = dst + (size_t)done * EDGERT_KEPT_COLS;
                o[0] = fminf(fmaxf(__fdiv_rn(__fsub_rn(a.x, t[0]), t[1]), 0.0f), t[4]);
                o[1] = fminf(fmaxf(__fdiv_rn(__fsub_rn(a.y, t[2]), t[3]), 0.0f), t[5]);
                o[2] = fminf(fmaxf(__fdiv_rn(__fsub_rn(a.z, t[0]), t[1]), 0.0f), t[4]);
                o[3] = fminf(fmaxf(__fdiv_rn(__fsub_rn(a.w, t[2]), t[3]), 0.0f), t[5]);
                o[4] = score[i];
                o[5] = __int_as_float(ca);
            }
            ++done;
            if (done >= max_det) break;
            for (int q = r + 1 + tid; q < m; q += nt) {
                if (!alive[q]) continue;
                const int j = order[q];
                if (!agnostic && cls[j] != ca) continue;
                if (edgert_overlaps(a, box[j], iou)) alive[q] = 0;
            }
            __syncthreads();
        }
    }
    // The last block to get here packs every sample (the threadFenceReduction pattern: thread 0 wrote this
    // block's rows and count, fences them, then takes a ticket).
    if (tid == 0) {
        kept_count[b] = n <= capacity ? done : -n;
        __threadfence();
        last = atomicAdd(finished, 1u) == (unsigned int)(batch - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    edgert_nms_pack(kept, kept_count, batch, batch_pad, max_det, out, start);
    if (tid == 0) *finished = 0u;
}
