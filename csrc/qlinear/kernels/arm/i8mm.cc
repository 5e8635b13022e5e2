// ARMv8.6 int8 matrix-multiply kernels (compiled with -march=armv8.2-a+dotprod+i8mm in this file
// only; dispatch calls them only when getauxval reports i8mm and asimddp). The level packs weights
// with kr = 8 (layout.h), SMMLA's operand shape: int8 as nr8_kr8_s8 (per 8 k, rows (0,1) (2,3)
// (4,5) (6,7) x 8 k, codes - 128: the operands as stored, code_shift 128), int4 as nr8_kr8 (per
// 16 k the same, low nibbles k 0-7, high nibbles k 8-15: one AND or shift per operand; nibbles
// 0..15 are s8 operands, code_shift 0). It also reads the dotprod level's layouts (files converted
// on other ARM CPUs, which flash reads as they are): the dotprod level's kernels, its int4 GEMM on
// SMMLA (nr8_kr4: a ZIP per operand besides).
//
// GEMM: SMMLA multiplies an 8 x 2 block of weights (two rows of W, 8 k) by a 2 x 8 block of
// activations (two rows of x, the same 8 k) into a 2 x 2 int32 tile; a tile of 12 rows x 8 outputs
// is 24 SMMLAs per 8 k. The activations of a tile's row pairs are interleaved once per block into
// the operand order (8 k of row 2i, then of row 2i + 1: one load per operand) and serve a group of
// panels. int8: the loop is loads and SMMLAs only. int4: the loop unpacks the weight operands
// (nr8_kr8: AND / shift; nr8_kr4: and ZIP); when a call has enough row tiles its panels are first
// staged, a few at a time, into the operand order (stage_panels), so that every tile's loop is
// loads and SMMLAs only.
//
// GEMV (mmla_gemv): one SMMLA per 16 weight bytes of int8 (per 8 int4 ones, after the AND or
// shift) against the activations as loaded (k 8s .. 8s + 7 in the operand's first row, the next 8
// in its second), so that lanes 0-1 of each accumulator are the rows' sums. fp16 activations take
// kernels/fp16.cc's float path, as on the dotprod level.
#define QLINEAR_ARM_LEVEL i8mm
#include "qlinear/kernels/arm/neon_table.h"
#include "qlinear/kernels/arm/i8mm_gemm.h"
#include "qlinear/kernels/block_kernels.h"

namespace qlinear {
namespace {

// The GEMV on nr8_kr8_s8 / nr8_kr8: per 8-k step, 4 SMMLAs (one per row pair) against 16
// activation bytes whose first 8 are the step's k; lanes 0, 1 of each tile hold the rows' sums,
// lanes 2, 3 products with the following k, dropped. Two panels at a time where the block is a
// multiple of 64 k. The float operations are panel_tile's, in its order (bit-identical).
// 64 k of one row (the pointers advanced) into e[j] (lanes 0, 1: rows 2j, 2j + 1). The activation
// operand of 8-k step s is x[8s .. 8s + 15] (its first row the step's k; an EXT of two 16-byte
// loads for odd s), so that every step's sums land in the same lanes: one accumulator per row
// pair, no second set to zero and combine per block. Per 16 k (a chunk: steps XE, XO), int8: 128
// weight bytes, the operands as loaded; int4: 64 bytes, their low nibbles the even step's
// operands (v16-v19), their high nibbles the odd step's (v20-v23). E names the accumulators, W
// the weight pointer; QLINEAR_BLOCK64: the 4 chunks of 64 k, the activation operands shared by
// the chunks CHUNK runs (one panel's or two).
#define QLINEAR_STEP_INTO(E, X, A, B, C, D)                                                     \
    "smmla %[" E "0].4s, " X ".16b, " A ".16b\n\t"                                              \
    "smmla %[" E "1].4s, " X ".16b, " B ".16b\n\t"                                              \
    "smmla %[" E "2].4s, " X ".16b, " C ".16b\n\t"                                              \
    "smmla %[" E "3].4s, " X ".16b, " D ".16b\n\t"
#define QLINEAR_INT8_CHUNK(E, W, XE, XO)                                                        \
    "ld1 {v16.16b-v19.16b}, [%[" W "]], #64\n\t" "ld1 {v20.16b-v23.16b}, [%[" W "]], #64\n\t"      \
    QLINEAR_STEP_INTO(E, XE, "v16", "v17", "v18", "v19") QLINEAR_STEP_INTO(E, XO, "v20", "v21", "v22", "v23")
#define QLINEAR_INT4_CHUNK(E, W, XE, XO)                                                        \
    "ld1 {v16.16b-v19.16b}, [%[" W "]], #64\n\t"                                               \
    "ushr v20.16b, v16.16b, #4\n\t" "ushr v21.16b, v17.16b, #4\n\t"                             \
    "ushr v22.16b, v18.16b, #4\n\t" "ushr v23.16b, v19.16b, #4\n\t"                             \
    "and v16.16b, v16.16b, %[m].16b\n\t" "and v17.16b, v17.16b, %[m].16b\n\t"                     \
    "and v18.16b, v18.16b, %[m].16b\n\t" "and v19.16b, v19.16b, %[m].16b\n\t"                     \
    QLINEAR_STEP_INTO(E, XE, "v16", "v17", "v18", "v19") QLINEAR_STEP_INTO(E, XO, "v20", "v21", "v22", "v23")
#define QLINEAR_BLOCK64(CHUNK)                                                                  \
    "ld1 {v24.16b-v27.16b}, [%[x]], #64\n\t"                                                    \
    "ext v28.16b, v24.16b, v25.16b, #8\n\t" CHUNK("v24", "v28")                                  \
    "ext v29.16b, v25.16b, v26.16b, #8\n\t" CHUNK("v25", "v29")                                  \
    "ext v28.16b, v26.16b, v27.16b, #8\n\t" CHUNK("v26", "v28")                                  \
    "ext v29.16b, v27.16b, v27.16b, #8\n\t" CHUNK("v27", "v29")
#define QLINEAR_GEMV_CLOBBERS                                                                   \
    "v16", "v17", "v18", "v19", "v20", "v21", "v22", "v23", "v24", "v25", "v26", "v27", "v28", "v29"

// One panel (w) or two (w, w2), 64 k; low4: the nibble mask (int4).
template <int BITS>
inline void mmla_step64(const uint8_t*& w, const int8_t*& x, int32x4_t (&e)[4], uint8x16_t low4) {
  constexpr int kBytes = 64 * BITS;  // weight bytes of 64 k
  if constexpr (BITS == 8) {
#define QLINEAR_CHUNK(XE, XO) QLINEAR_INT8_CHUNK("e", "w", XE, XO)
    asm(QLINEAR_BLOCK64(QLINEAR_CHUNK)
        : [w] "+r"(w), [x] "+r"(x), [e0] "+w"(e[0]), [e1] "+w"(e[1]), [e2] "+w"(e[2]), [e3] "+w"(e[3])
        : "m"(*reinterpret_cast<const uint8_t(*)[kBytes]>(w)), "m"(*reinterpret_cast<const int8_t(*)[64]>(x))
        : QLINEAR_GEMV_CLOBBERS);
#undef QLINEAR_CHUNK
  } else {
#define QLINEAR_CHUNK(XE, XO) QLINEAR_INT4_CHUNK("e", "w", XE, XO)
    asm(QLINEAR_BLOCK64(QLINEAR_CHUNK)
        : [w] "+r"(w), [x] "+r"(x), [e0] "+w"(e[0]), [e1] "+w"(e[1]), [e2] "+w"(e[2]), [e3] "+w"(e[3])
        : [m] "w"(low4), "m"(*reinterpret_cast<const uint8_t(*)[kBytes]>(w)),
          "m"(*reinterpret_cast<const int8_t(*)[64]>(x))
        : QLINEAR_GEMV_CLOBBERS);
#undef QLINEAR_CHUNK
  }
}

template <int BITS>
inline void mmla_step64x2(const uint8_t*& w, const uint8_t*& w2, const int8_t*& x, int32x4_t (&e)[4],
                          int32x4_t (&e2)[4], uint8x16_t low4) {
  constexpr int kBytes = 64 * BITS;
#define QLINEAR_X2_OPERANDS                                                                     \
    : [w] "+r"(w), [w2] "+r"(w2), [x] "+r"(x), [e0] "+w"(e[0]), [e1] "+w"(e[1]), [e2] "+w"(e[2]),  \
      [e3] "+w"(e[3]), [f0] "+w"(e2[0]), [f1] "+w"(e2[1]), [f2] "+w"(e2[2]), [f3] "+w"(e2[3])
#define QLINEAR_X2_MEMORY                                                                       \
    "m"(*reinterpret_cast<const uint8_t(*)[kBytes]>(w)), "m"(*reinterpret_cast<const uint8_t(*)[kBytes]>(w2)), \
    "m"(*reinterpret_cast<const int8_t(*)[64]>(x))
  if constexpr (BITS == 8) {
#define QLINEAR_CHUNK(XE, XO) QLINEAR_INT8_CHUNK("e", "w", XE, XO) QLINEAR_INT8_CHUNK("f", "w2", XE, XO)
    asm(QLINEAR_BLOCK64(QLINEAR_CHUNK) QLINEAR_X2_OPERANDS : QLINEAR_X2_MEMORY : QLINEAR_GEMV_CLOBBERS);
#undef QLINEAR_CHUNK
  } else {
#define QLINEAR_CHUNK(XE, XO) QLINEAR_INT4_CHUNK("e", "w", XE, XO) QLINEAR_INT4_CHUNK("f", "w2", XE, XO)
    asm(QLINEAR_BLOCK64(QLINEAR_CHUNK) QLINEAR_X2_OPERANDS : [m] "w"(low4), QLINEAR_X2_MEMORY : QLINEAR_GEMV_CLOBBERS);
#undef QLINEAR_CHUNK
  }
#undef QLINEAR_X2_MEMORY
#undef QLINEAR_X2_OPERANDS
}
#undef QLINEAR_GEMV_CLOBBERS
#undef QLINEAR_BLOCK64
#undef QLINEAR_INT4_CHUNK
#undef QLINEAR_INT8_CHUNK
#undef QLINEAR_STEP_INTO

// A block's int32 tiles e (lanes 0, 1: rows 2j, 2j + 1) into the panel's outputs y (rows 0-3,
// 4-7), w at the block's scales, advanced past them (and the offsets).
template <bool ASYM>
inline void block_epilogue(const Int8MatmulArgs& a, int64_t at, float s_x, const int32x4_t (&e)[4], const uint8_t*& w,
                           float32x4_t (&y)[2]) {
  const auto pairs = [](int32x4_t e0, int32x4_t e1) {
    return vreinterpretq_s32_s64(vzip1q_s64(vreinterpretq_s64_s32(e0), vreinterpretq_s64_s32(e1)));
  };
  const int32x4_t s0 = pairs(e[0], e[1]), s1 = pairs(e[2], e[3]);
  const float16x8_t sc = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(w)));
  y[0] = vfmaq_f32(y[0], vcvtq_f32_s32(s0), vmulq_n_f32(vcvt_f32_f16(vget_low_f16(sc)), s_x));
  y[1] = vfmaq_f32(y[1], vcvtq_f32_s32(s1), vmulq_n_f32(vcvt_high_f32_f16(sc), s_x));
  if constexpr (ASYM) {
    const float xs = a.act.scaled_sum[at];
    const float16x8_t off = vreinterpretq_f16_u16(vld1q_u16(reinterpret_cast<const uint16_t*>(w + 16)));
    y[0] = vfmaq_n_f32(y[0], vcvt_f32_f16(vget_low_f16(off)), xs);
    y[1] = vfmaq_n_f32(y[1], vcvt_high_f32_f16(off), xs);
  }
  w += ASYM ? 32 : 16;
}

inline void store_panel(const Int8MatmulArgs& a, int64_t m, int64_t p, const float32x4_t (&y)[2]) {
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, a.w->n - n0);
  float tmp[8];
  vst1q_f32(tmp, y[0]);
  vst1q_f32(tmp + 4, y[1]);
  float* out = a.y + m * a.ldy;
  for (int64_t r = 0; r < rows; ++r) out[n0 + r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
}

// NP panels from panel p for row m (NP 2: at a block of a multiple of 64 k, the panels sharing
// the activation operands).
template <int BITS, int KB, bool ASYM, int NP>
inline void mmla_gemv_panels(const Int8MatmulArgs& a, int64_t m, int64_t p, uint8x16_t low4) {
  static_assert(NP == 1 || (KB != 0 && KB % 64 == 0), "two panels at a time: 64-k steps");
  const WeightGeometry& g = *a.w;
  const int64_t block = KB ? KB : g.block, nb = g.nblocks;
  // the shifted sum (code_shift - zero_point) * sum is not zero for asymmetric int8 (128) and
  // symmetric int4 (-8)
  constexpr bool kShifted = (BITS == 8) == ASYM;
  // per panel: its weights, its outputs (rows 0-3, 4-7), its block's tiles; distinct variables,
  // not arrays indexed by panel (GCC keeps those in memory around the asm)
  const uint8_t* w0 = a.packed + p * g.panel_bytes;
  const uint8_t* w1 = w0 + (NP - 1) * g.panel_bytes;
  float32x4_t y0[2] = {vdupq_n_f32(0.f), vdupq_n_f32(0.f)}, y1[2] = {y0[0], y0[1]};
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t at = m * nb + b;
    const float s_x = a.act.scale[at];
    const int8_t* x = a.act.q + m * a.act.ldq + b * block;
    const int32x4_t init = kShifted ? vdupq_n_s32(a.act.shifted_sum[at]) : vdupq_n_s32(0);
    int32x4_t e0[4] = {init, init, init, init}, e1[4] = {init, init, init, init};
    const auto step16 = [&] {  // 16 k: steps 2s (x[0..15]) and 2s + 1 (x[8..15], then anything)
      const int8x16_t x0 = vld1q_s8(x), x1 = vextq_s8(x0, x0, 8);
      int8x16_t we[4], wo[4];
      if constexpr (BITS == 8) {
        const int8x16x4_t v0 = vld1q_s8_x4(reinterpret_cast<const int8_t*>(w0));
        const int8x16x4_t v1 = vld1q_s8_x4(reinterpret_cast<const int8_t*>(w0) + 64);
        for (int j = 0; j < 4; ++j) we[j] = v0.val[j], wo[j] = v1.val[j];
      } else {
        const uint8x16x4_t v = vld1q_u8_x4(w0);
        for (int j = 0; j < 4; ++j)
          we[j] = vreinterpretq_s8_u8(vandq_u8(v.val[j], low4)), wo[j] = vreinterpretq_s8_u8(vshrq_n_u8(v.val[j], 4));
      }
      for (int j = 0; j < 4; ++j) e0[j] = vmmlaq_s32(vmmlaq_s32(e0[j], x0, we[j]), x1, wo[j]);
      x += 16, w0 += 16 * BITS;
    };
    if constexpr (KB != 0 && KB % 64 == 0) {
      for (int kk = 0; kk < KB; kk += 64) {
        if constexpr (NP == 2) mmla_step64x2<BITS>(w0, w1, x, e0, e1, low4);
        else mmla_step64<BITS>(w0, x, e0, low4);
      }
    } else if constexpr (KB != 0) {
#pragma GCC unroll 8
      for (int kk = 0; kk < KB; kk += 16) step16();
    } else {
      for (int64_t kk = 0; kk < block; kk += 16) step16();
    }
    block_epilogue<ASYM>(a, at, s_x, e0, w0, y0);
    if constexpr (NP == 2) block_epilogue<ASYM>(a, at, s_x, e1, w1, y1);
  }
  store_panel(a, m, p, y0);
  if constexpr (NP == 2) store_panel(a, m, p + 1, y1);
}

template <int BITS, int KB, bool ASYM>
void mmla_gemv_impl(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr bool kPairs = KB != 0 && KB % 64 == 0;
  const uint8x16_t low4 = vdupq_n_u8(0x0F);
  for (int64_t m = m0; m < m1; ++m) {
    int64_t p = p0;
    if constexpr (kPairs)
      for (; p + 2 <= p1; p += 2) mmla_gemv_panels<BITS, KB, ASYM, 2>(a, m, p, low4);
    for (; p < p1; ++p) mmla_gemv_panels<BITS, KB, ASYM, 1>(a, m, p, low4);
  }
}

template <int BITS>
void mmla_gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  arm::with_block_and_symmetry(*a.w, [&](auto kb, auto asym) {
    mmla_gemv_impl<BITS, decltype(kb)::value, decltype(asym)::value>(a, m0, m1, p0, p1);
  });
}

// The kernels for the dotprod level's layouts (int4 nr8_kr4, int8 nr8_kr4_s8: files converted on
// other ARM CPUs, which flash hands to the kernels as they are): the dotprod level's, its int4
// GEMM on SMMLA.
KernelTable make_i8mm_kr4_table() {
  KernelTable t = dotprod_kernels();
  t.isa = Isa::i8mm;
  for (Int8Ukernel& k : t.int8)
    if (k.bits == 4 && k.mr > 1) k = {"gemm_w4a8_nr8_kr4_12x8_i8mm", mmla_gemm_int4<4>, 4, kTileRows, 1, 2};
  return t;
}

KernelTable make_i8mm_table() {
  KernelTable t{Isa::i8mm, LayoutId::nr8_kr8_s8, arm::quantize_acts, "quantize_acts_absmax_neon", arm::prepare_float_acts,
                {}, {}, {}};
  // int8 codes as stored, code - 128 (code_shift 128); int4 nibbles as they are (code_shift 0).
  constexpr int32_t kShift8 = 128;
  t.int8 = {
      {"gemv_w4a8_nr8_kr8_1x8_i8mm", mmla_gemv<4>, 4, 1, 1, 1, 1},
      {"gemm_w4a8_nr8_kr8_12x8_i8mm", mmla_gemm_int4<8>, 4, kTileRows, 1, 2},
      {"gemv_w8a8_nr8_kr8_s8_1x8_i8mm", mmla_gemv<8>, 8, 1, 1, 1, 1, 1, kShift8},
      {"gemm_w8a8_nr8_kr8_s8_12x8_i8mm", mmla_gemm_int8, 8, kTileRows, 1, 2, INT64_MAX, 1, kShift8},
  };
  t.float32 = {  // as every ARM level (make_table), on kr 8
      {"gemv_w4f32_nr8_kr8_1x8_neon", arm::float_matmul<4>, 4, 1, 1, 1, 1},
      {"gemm_w4f32_nr8_kr8_1x8_neon", arm::float_matmul<4>, 4, 1, 1, 2},
      {"gemv_w8f32_nr8_kr8_s8_1x8_neon", arm::float_matmul<8>, 8, 1, 1, 1, 1},
      {"gemm_w8f32_nr8_kr8_s8_1x8_neon", arm::float_matmul<8>, 8, 1, 1, 2},
  };
  static const KernelTable kr4 = make_i8mm_kr4_table();
  add_dotprod_block_kernels(t);  // the block formats: SDOT over the file's chunks
  t.also = &kr4;
  return with_fp16_float_path(t);
}

}  // namespace

const KernelTable& i8mm_kernels() {
  static const KernelTable table = make_i8mm_table();
  return table;
}

}  // namespace qlinear
