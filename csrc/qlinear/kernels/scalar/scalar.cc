// Scalar twins of every kernel: the fallback on CPUs without SIMD support and the oracle the
// SIMD kernels are tested against. They read any layout through layout_access.h and follow
// docs/semantics.md literally.
#include <cmath>

#include "qlinear/core/fp16_path.h"
#include "qlinear/core/kernels.h"
#include "qlinear/core/layout_access.h"
#include "qlinear/kernels/block_kernels.h"

namespace qlinear {
namespace {

inline float load_x(const void* x, DType dt, int64_t i) {
  return dt == DType::f32 ? static_cast<const float*>(x)[i]
                          : half_to_float(static_cast<const uint16_t*>(x)[i]);
}

void quantize_acts(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  const int64_t kpad = a.nblocks * a.block;
  const int64_t act_block = a.act_block >= a.k ? kpad : a.act_block;
  for (int64_t m = m0; m < m1; ++m) {
    const int64_t row = m * a.ldx;
    int8_t* q = a.q + m * a.ldq;
    for (int64_t a0 = 0; a0 < kpad; a0 += act_block) {
      const int64_t a1 = std::min(a0 + act_block, a.k);
      float absmax = 0.f;
      bool finite = true;
      for (int64_t i = a0; i < a1; ++i) {
        const float v = load_x(a.x, a.dtype, row + i);
        finite &= std::isfinite(v);
        absmax = std::max(absmax, std::fabs(v));
      }
      float s = absmax / 127.f;
      if (!finite) s = NAN;  // the block's outputs become NaN
      const bool zero = !finite || s == 0.f;
      for (int64_t i = a0; i < a1; ++i) {
        q[i] = zero ? 0 : quantize_one(load_x(a.x, a.dtype, row + i), s);
      }
      for (int64_t i = std::max(a1, a0); i < std::min(a0 + act_block, kpad); ++i) q[i] = 0;
      for (int64_t b = a0 / a.block; b < std::min(a0 + act_block, kpad) / a.block; ++b)
        a.scale[m * a.nblocks + b] = s;
    }
    for (int64_t b = 0; b < a.nblocks; ++b) {
      int32_t sum = 0;
      for (int64_t i = b * a.block; i < (b + 1) * a.block; ++i) sum += q[i];
      a.sum[m * a.nblocks + b] = sum;
    }
  }
  write_pre_sums(a, m0, m1);
}

// Calls f(m, n, r, panel) for every output of rows [m0, m1) x panels [p0, p1): activation row m,
// weight row n = p * nr + r (r < the panel's real rows), the panel at byte offset `panel`.
template <class F>
void for_each_output(const WeightGeometry& w, int64_t m0, int64_t m1, int64_t p0, int64_t p1, F&& f) {
  for (int64_t p = p0; p < p1; ++p) {
    const int rows = static_cast<int>(std::min<int64_t>(w.nr, w.n - p * w.nr));
    for (int64_t m = m0; m < m1; ++m)
      for (int r = 0; r < rows; ++r) f(m, p * w.nr + r, r, p * w.panel_bytes);
  }
}

// One kernel for int4 and int8 weights and any layout: the integer core per (row, block), then
// the float epilogue of docs/semantics.md, section 3.
void int8_matmul(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& w = *a.w;
  const int zp = w.zero_point();
  for_each_output(w, m0, m1, p0, p1, [&](int64_t m, int64_t n, int r, int64_t panel) {
    const int8_t* xq = a.act.q + m * a.act.ldq;
    float y = 0.f;
    for (int64_t b = 0; b < w.nblocks; ++b) {
      const uint8_t* block = a.packed + panel + b * w.block_bytes;
      int32_t acc = 0;
      for (int64_t kk = 0; kk < w.block; ++kk)
        acc += int32_t(xq[b * w.block + kk]) * read_code(w, block, r, kk);
      const auto* scales = reinterpret_cast<const uint16_t*>(block + w.code_bytes);
      const float sx = a.act.scale[m * w.nblocks + b];
      const int32_t xsum = a.act.sum[m * w.nblocks + b];
      const float scale = half_to_float(scales[r]);
      if (w.symmetric) {
        y += (sx * scale) * float(acc - zp * xsum);
      } else {
        const float offset = half_to_float(scales[w.nr + r]);
        y += (sx * scale) * float(acc) + (sx * float(xsum)) * offset;
      }
    }
    a.y[m * a.ldy + n] = a.bias ? y + a.bias[n] : y;
  });
}

float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1) {
  float absmax = 0.f;
  for (int64_t m = m0; m < m1; ++m) {
    float* out = a.out + m * a.ldo;
    for (int64_t i = 0; i < a.k; ++i) {
      out[i] = load_x(a.x, a.dtype, m * a.ldx + i);
      absmax = std::isnan(out[i]) ? NAN : std::max(absmax, std::fabs(out[i]));  // NaN sticks
    }
    for (int64_t i = a.k; i < a.nblocks * a.block; ++i) out[i] = 0.f;
    for (int64_t b = 0; b < a.nblocks; ++b) {
      float sum = 0.f;
      for (int64_t i = b * a.block; i < (b + 1) * a.block; ++i) sum += out[i];
      a.sum[m * a.nblocks + b] = sum;
    }
  }
  return absmax;
}

// The float path's oracle: every weight dequantized as w' = offset + scale * (code - zp).
void float_matmul(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& w = *a.w;
  const int zp = w.zero_point();
  for_each_output(w, m0, m1, p0, p1, [&](int64_t m, int64_t n, int r, int64_t panel) {
    const float* x = a.x + m * a.ldx;
    float y = 0.f;
    for (int64_t b = 0; b < w.nblocks; ++b) {
      const uint8_t* block = a.packed + panel + b * w.block_bytes;
      const auto* scales = reinterpret_cast<const uint16_t*>(block + w.code_bytes);
      const float scale = half_to_float(scales[r]);
      const float offset = w.symmetric ? 0.f : half_to_float(scales[w.nr + r]);
      float yb = 0.f;  // per block, as the SIMD kernels: error ~ (block + blocks) ulps
      for (int64_t kk = 0; kk < w.block; ++kk) {
        const int q = read_code(w, block, r, kk) - zp;
        yb += x[b * w.block + kk] * (offset + scale * float(q));
      }
      y += yb;
    }
    y *= a.unscale;
    a.y[m * a.ldy + n] = a.bias ? y + a.bias[n] : y;
  });
}

// fp16 rounding for the FP16-arithmetic twin. The double results it is applied to are exact
// (sums of two fp16 values, or of an fp16 value and a product of two, when their exponents are
// close) or so close to an fp16 value that rounding twice cannot matter (when they are far apart),
// so round_half(double op) is the correctly rounded fp16 operation.
inline float round_half(double v) {
  const double av = std::fabs(v);
  if (!(av < 65520.0)) return std::isnan(v) ? float(v) : std::copysign(INFINITY, float(v));
  if (av == 0.0) return float(v);
  int e;
  std::frexp(av, &e);                                  // av in [2^(e-1), 2^e)
  const int ulp_exp = std::max(e - 1, -14) - 10;       // fp16: 11 bits, subnormals below 2^-14
  return float(std::ldexp(std::nearbyint(std::ldexp(v, -ulp_exp)), ulp_exp));  // ties to even
}
inline float fma_half(float a, float b, float c) { return round_half(std::fma(double(a), double(b), double(c))); }
inline float add_half(float a, float b) { return round_half(double(a) + double(b)); }

}  // namespace

// Step for step what kernels/fp16.cc computes (fp16_path.h), one output at a time.
void half_float_matmul_twin(const HalfMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  using namespace fp16_path;
  const WeightGeometry& w = *a.w;
  const int zp = w.zero_point(), qmax = w.bits == 4 ? 15 : 255;
  for_each_output(w, m0, m1, p0, p1, [&](int64_t m, int64_t n, int r, int64_t panel) {
    float y = 0.f;
    for (int64_t b = 0; b < w.nblocks; ++b) {
      const uint8_t* block = a.packed + panel + b * w.block_bytes;
      const auto* scales = reinterpret_cast<const uint16_t*>(block + w.code_bytes);
      const float scale = half_to_float(scales[r]);
      const float offset = w.symmetric ? -float(zp) * scale : half_to_float(scales[w.nr + r]);
      const float norm = pow2_normalizer(weight_bound(offset, scale, qmax), kWeightTop);
      const float sc = half_to_float(float_to_half(scale * norm));
      const float of = half_to_float(float_to_half(offset * norm));
      const uint16_t* x = a.x + m * a.ldx + b * w.block;
      float bsum = 0.f;
      for (int64_t c = 0, len; c < w.block; c += len) {
        len = chunk_length(w.block, c);
        const int chains = int(len / kChain);  // 4 or 2
        float acc[4] = {};
        for (int j = 0; j < len; ++j) {
          const float wq = fma_half(sc, float(read_code(w, block, r, c + j)), of);
          acc[j % chains] = fma_half(half_to_float(x[c + j]), wq, acc[j % chains]);
        }
        bsum += chains == 4 ? add_half(add_half(acc[0], acc[1]), add_half(acc[2], acc[3])) : add_half(acc[0], acc[1]);
      }
      y = std::fma(bsum, (1.f / norm) * a.xunscale[m * w.nblocks + b], y);
    }
    a.y[m * a.ldy + n] = a.bias ? y + a.bias[n] : y;
  });
}

const KernelTable& scalar_kernels() {
  // One function per family serves every M; GEMV (M = 1) and GEMM are listed apart so that
  // kernel_info names what runs as at the other levels.
  static const KernelTable table = [] {
    KernelTable t = {
      Isa::scalar,
      family_layout(),  // reads any layout (read_code); packs for the SIMD family of this build
      quantize_acts, "quantize_acts_absmax_scalar",
      prepare_float_acts,
      {
          {"gemv_w4a8_scalar", int8_matmul, 4, 1, 1, 1, 1},
          {"gemm_w4a8_scalar", int8_matmul, 4, 1, 1, 2},
          {"gemv_w8a8_scalar", int8_matmul, 8, 1, 1, 1, 1},
          {"gemm_w8a8_scalar", int8_matmul, 8, 1, 1, 2},
      },
      {
          {"gemv_w4f32_scalar", float_matmul, 4, 1, 1, 1, 1},
          {"gemm_w4f32_scalar", float_matmul, 4, 1, 1, 2},
          {"gemv_w8f32_scalar", float_matmul, 8, 1, 1, 1, 1},
          {"gemm_w8f32_scalar", float_matmul, 8, 1, 1, 2},
      },
      {},
    };
    add_scalar_block_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace qlinear
