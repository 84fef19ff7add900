// edgert GPU preprocessing: one pass from a decoded BGR uint8 frame to the model's input tensor.
//
// Each thread makes one output pixel: letterbox placement (pad outside the resized region), bilinear
// resize, channel order, out = pixel * alpha[c] + beta[c], layout (NCHW or NHWC) and dtype.
//
// The resize reproduces OpenCV's cv::resize(INTER_LINEAR) for 8-bit images bit for bit: the source
// offsets and the 11-bit fixed-point weights come from tables that the host builds with OpenCV's own
// formulas (edgert.vision.gpu_preprocess.linear_tables), and the arithmetic below is OpenCV's
// HResizeLinear (int sums of weight * pixel) followed by VResizeLinear's
//   (((b0 * (h0 >> 4)) >> 16) + ((b1 * (h1 >> 4)) >> 16) + 2) >> 2
// The numpy emulation in edgert.vision.gpu_preprocess.emulate_letterbox is the documented reference.
//
// The multiply and add use __fmul_rn / __fadd_rn so nvcc does not contract them into one FMA: numpy
// rounds after the multiply, and so must we, to give the same float32 values as the CPU path.

#include <cuda_fp16.h>

// Output layouts and dtypes (kept in step with gpu_preprocess.py).
#define EDGERT_NCHW 0
#define EDGERT_NHWC 1
#define EDGERT_F32 0
#define EDGERT_F16 1
#define EDGERT_U8 2

__device__ __forceinline__ int edgert_lerp_u8(const unsigned char* __restrict__ r0,
                                              const unsigned char* __restrict__ r1,
                                              int4 xt, int4 yt, int c) {
    // xt = (x0 * 3, x1 * 3, a0, a1), yt = (y0, y1, b0, b1): OpenCV's xofs/alpha and yofs/beta
    int h0 = (int)r0[xt.x + c] * xt.z + (int)r0[xt.y + c] * xt.w;
    int h1 = (int)r1[xt.x + c] * xt.z + (int)r1[xt.y + c] * xt.w;
    int v = (((yt.z * (h0 >> 4)) >> 16) + ((yt.w * (h1 >> 4)) >> 16) + 2) >> 2;
    return min(max(v, 0), 255);
}

__device__ __forceinline__ void edgert_store(void* __restrict__ out, size_t index, int pixel, float alpha,
                                             float beta, int dtype, int has_beta) {
    if (dtype == EDGERT_U8) {
        ((unsigned char*)out)[index] = (unsigned char)pixel;
        return;
    }
    float v = __fmul_rn((float)pixel, alpha);
    if (dtype == EDGERT_F32) {
        if (has_beta) v = __fadd_rn(v, beta);
        ((float*)out)[index] = v;
    } else {
        // numpy: multiply in float32, round to half; then add beta in float32 and round to half again
        // (the host passes beta already rounded to half where the CPU path adds it in half precision)
        __half h = __float2half_rn(v);
        if (has_beta) h = __float2half_rn(__fadd_rn(__half2float(h), beta));
        ((__half*)out)[index] = h;
    }
}

// One output pixel (x, y) of one sample: the body both kernels share.
__device__ __forceinline__ void edgert_letterbox_pixel(const unsigned char* __restrict__ src,
                                                       const int4* __restrict__ xtab,
                                                       const int4* __restrict__ ytab,
                                                       void* __restrict__ out, int x, int y,
                                                       int src_pitch, int dst_h, int dst_w,
                                                       int top, int left, int new_h, int new_w, int pad,
                                                       int ch0, int ch1, int ch2, int layout, int dtype,
                                                       int has_beta, float alpha0, float alpha1, float alpha2,
                                                       float beta0, float beta1, float beta2) {
    int bgr[3] = {pad, pad, pad};
    const int rx = x - left, ry = y - top;
    if (rx >= 0 && rx < new_w && ry >= 0 && ry < new_h) {
        const int4 xt = xtab[rx];
        const int4 yt = ytab[ry];
        const unsigned char* r0 = src + (size_t)yt.x * src_pitch;
        const unsigned char* r1 = src + (size_t)yt.y * src_pitch;
        bgr[0] = edgert_lerp_u8(r0, r1, xt, yt, 0);
        bgr[1] = edgert_lerp_u8(r0, r1, xt, yt, 1);
        bgr[2] = edgert_lerp_u8(r0, r1, xt, yt, 2);
    }
    const size_t plane = (size_t)dst_h * dst_w;
    const size_t pix = (size_t)y * dst_w + x;
    // bgr[] indexed by a runtime value would spill to local memory; pick with selects instead
    const int p0 = ch0 == 0 ? bgr[0] : (ch0 == 1 ? bgr[1] : bgr[2]);
    const int p1 = ch1 == 0 ? bgr[0] : (ch1 == 1 ? bgr[1] : bgr[2]);
    const int p2 = ch2 == 0 ? bgr[0] : (ch2 == 1 ? bgr[1] : bgr[2]);
    if (layout == EDGERT_NCHW) {
        edgert_store(out, pix, p0, alpha0, beta0, dtype, has_beta);
        edgert_store(out, plane + pix, p1, alpha1, beta1, dtype, has_beta);
        edgert_store(out, 2 * plane + pix, p2, alpha2, beta2, dtype, has_beta);
    } else {
        edgert_store(out, 3 * pix, p0, alpha0, beta0, dtype, has_beta);
        edgert_store(out, 3 * pix + 1, p1, alpha1, beta1, dtype, has_beta);
        edgert_store(out, 3 * pix + 2, p2, alpha2, beta2, dtype, has_beta);
    }
}

// Scalar parameters rather than a struct: their layout in the launch buffer is then unambiguous.
//   src_pitch: bytes per source row (3 * src_w when packed)
//   top, left, new_h, new_w: where the resized frame sits inside the dst_h x dst_w input
//   ch0..ch2: output channel c reads source (BGR) channel ch<c>
//   alpha/beta: out = pixel * alpha + beta per output channel (scale / std, -mean / std)
extern "C" __global__ void edgert_letterbox(const unsigned char* __restrict__ src,
                                            const int4* __restrict__ xtab,
                                            const int4* __restrict__ ytab,
                                            void* __restrict__ out,
                                            int src_pitch, int dst_h, int dst_w,
                                            int top, int left, int new_h, int new_w, int pad,
                                            int ch0, int ch1, int ch2, int layout, int dtype, int has_beta,
                                            float alpha0, float alpha1, float alpha2,
                                            float beta0, float beta1, float beta2) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= dst_w || y >= dst_h) return;
    edgert_letterbox_pixel(src, xtab, ytab, out, x, y, src_pitch, dst_h, dst_w, top, left, new_h, new_w, pad,
                           ch0, ch1, ch2, layout, dtype, has_beta, alpha0, alpha1, alpha2, beta0, beta1, beta2);
}

// A whole batch in one launch: blockIdx.z is the sample. Each sample's frame may have its own size, so its
// geometry comes from a table of EDGERT_BATCH_COLS long longs per sample, uploaded with the frames:
//   src offset (bytes from src_base), x table address, y table address, src_pitch, top, left, new_h, new_w
// Sample k is written at out_base + k * out_stride bytes (the batched input, sample after sample).
#define EDGERT_BATCH_COLS 8
extern "C" __global__ void edgert_letterbox_batch(const unsigned char* __restrict__ src_base,
                                                  const long long* __restrict__ params,
                                                  unsigned char* __restrict__ out_base, long long out_stride,
                                                  int dst_h, int dst_w, int pad,
                                                  int ch0, int ch1, int ch2, int layout, int dtype, int has_beta,
                                                  float alpha0, float alpha1, float alpha2,
                                                  float beta0, float beta1, float beta2) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= dst_w || y >= dst_h) return;
    const long long* p = params + (size_t)blockIdx.z * EDGERT_BATCH_COLS;
    edgert_letterbox_pixel(src_base + p[0], (const int4*)p[1], (const int4*)p[2],
                           out_base + (size_t)blockIdx.z * out_stride, x, y,
                           (int)p[3], dst_h, dst_w, (int)p[4], (int)p[5], (int)p[6], (int)p[7], pad,
                           ch0, ch1, ch2, layout, dtype, has_beta, alpha0, alpha1, alpha2, beta0, beta1, beta2);
}
