// ARMv8.2 dot-product kernels over the nr8_kr4 (int4) and nr8_kr4_s8 (int8) layouts (compiled with
// -march=armv8.2-a+dotprod in this file only; dispatch calls them only when getauxval reports
// asimddp). Integer core with SDOT by element: a 16-byte half chunk (4 rows x 4 k) against 4
// activation bytes chosen by lane from a 16-byte load, 16 products per instruction into one s32 per
// row. int4 nibbles 0..15 and int8 codes as stored (code - 128) are both valid s8 operands. The
// level implies FP16 arithmetic (cpu.h), so fp16 activations take kernels/fp16.cc's float path.
#define QLINEAR_ARM_LEVEL dotprod
#include "qlinear/kernels/arm/neon_table.h"
#include "qlinear/kernels/block_kernels.h"

namespace qlinear {
namespace arm::dotprod {
namespace {

// The GEMM's main tile: 24 activation rows x one panel (8 outputs), run as two passes of 24 rows x
// 4 outputs (the panel's half chunks). Each weight operand (int4: unpacked by an AND or USHR, int8:
// loaded as stored) then serves 24 SDOTs instead of 8 (the 8x8 tile) or 12 (a 12x8 tile): per 8 k
// 48 SDOTs and, for int4, 2 unpacking instructions (MNN's 12x8 tile: 24 + 2 per 4 k). The 24 accumulators leave
// 8 vector registers, hence inline assembly with the allocation written out (block24). The rows'
// activations are first copied in row-pair order (pack_rows24), so that one pointer with
// immediate offsets reads them: 24 row pointers do not fit in the general registers, and a
// post-indexed load's write-back stalls an in-order core (cortex-a55).
constexpr int kTileRows = 24;
constexpr int64_t kSlabK = 512;  // k per activation copy: 24 x 512 bytes, in L1 across the panels

// The activations of 24 rows over k [k0, k0 + len), 8 k at a time: [len / 8][12 row pairs][16
// bytes], a pair being rows 2j and 2j + 1 (8 k each), so that SDOT lanes 0 / 1 pick row 2j's k 0-3 /
// 4-7 and lanes 2 / 3 row 2j + 1's.
inline void pack_rows24(const Int8MatmulArgs& a, int64_t m, int64_t k0, int64_t len, int8_t* out) {
  for (int j = 0; j < kTileRows / 2; ++j) {
    const int8_t* r0 = a.act.q + (m + 2 * j) * a.act.ldq + k0;
    const int8_t* r1 = r0 + a.act.ldq;
    int8_t* dst = out + 16 * j;
    for (int64_t kk = 0; kk < len; kk += 16, dst += 2 * 192) {  // len: whole blocks, 32 | len
      const int64x2_t v0 = vreinterpretq_s64_s8(vld1q_s8(r0 + kk)), v1 = vreinterpretq_s64_s8(vld1q_s8(r1 + kk));
      vst1q_s8(dst, vreinterpretq_s8_s64(vzip1q_s64(v0, v1)));
      vst1q_s8(dst + 192, vreinterpretq_s8_s64(vzip2q_s64(v0, v1)));
    }
  }
}

// One block of one half panel against 24 packed rows: acc[i] = row i's shifted sum (at zsum +
// i * zstride bytes) + the sum over the block's k of x[i][k] * code (int4) or x * (code - 128)
// (int8), for the 4 outputs of the half. w: the half's first 16 bytes (block + 16 h); x: the
// packed rows at the block's start; iters = block / 8 >= 4. (The accumulators are outputs only,
// their start values loaded inside: asm takes at most 30 operands, an in-out one counts twice.)
//
// Per 8 k: one weight load (int8: two), 12 activation loads (pairs of rows, immediate offsets),
// 48 SDOTs (int4: 2 unpacking instructions). Software-pipelined: the next 8 k's weights and the
// next group of 4 rows' activations are loaded while the current ones are in use (activations
// double-buffered in v3-v4 / v5-v6; int4: raw weights in v7, operands v1 (k 0-3) / v2 (k 4-7);
// int8: the k 0-3 operand alternates between v1 and v7, two 8 k per loop iteration, the k 4-7 one
// in v2 is reloaded after its last SDOT); the last 8 k are a copy of the loop body without those
// loads, so nothing past the block is read.
template <int BITS>
inline void block24(const uint8_t* w, const int8_t* x, int64_t iters, const int32_t* zsum, int64_t zstride,
                    int32x4_t (&acc)[kTileRows]) {
  // acc names: %[cN]; act registers v3-v6; lanes 0 / 2 (k 0-3 of the pair's rows), 1 / 3 (k 4-7)
#define Q24_S(C, OP, A, L) "sdot %[" #C "].4s, " OP ".16b, v" #A ".4b[" #L "]\n\t"
#define Q24_LO(R, C0, C1, C2, C3, A, B) Q24_S(C0, R, A, 0) Q24_S(C1, R, A, 2) Q24_S(C2, R, B, 0) Q24_S(C3, R, B, 2)
#define Q24_HI(C0, C1, C2, C3, A, B) Q24_S(C0, "v2", A, 1) Q24_S(C1, "v2", A, 3) Q24_S(C2, "v2", B, 1) Q24_S(C3, "v2", B, 3)
#define Q24_LD(A, B, OFF) "ldr q" #A ", [x11, #" #OFF "]\n\tldr q" #B ", [x11, #" #OFF "+16]\n\t"
  // The 24 rows in 6 groups of 4, each group's SDOTs with the next group's loads between its k 0-3
  // (operand R) and k 4-7 (v2) halves.
#define Q24_GROUPS(R, LAST)                                                                 \
  Q24_LO(R, c0, c1, c2, c3, 3, 4) Q24_LD(5, 6, 32) Q24_HI(c0, c1, c2, c3, 3, 4)                   \
  Q24_LO(R, c4, c5, c6, c7, 5, 6) Q24_LD(3, 4, 64) Q24_HI(c4, c5, c6, c7, 5, 6)                   \
  Q24_LO(R, c8, c9, c10, c11, 3, 4) Q24_LD(5, 6, 96) Q24_HI(c8, c9, c10, c11, 3, 4)               \
  Q24_LO(R, c12, c13, c14, c15, 5, 6) Q24_LD(3, 4, 128) Q24_HI(c12, c13, c14, c15, 5, 6)         \
  Q24_LO(R, c16, c17, c18, c19, 3, 4) Q24_LD(5, 6, 160) Q24_HI(c16, c17, c18, c19, 3, 4)         \
  LAST(R, c20, c21, c22, c23, 5, 6)
  // int4: raw 16 bytes (k 0-3 low nibbles, k 4-7 high) -> v1, v2. Last group: both halves, the
  // next 8 k's first group loaded in between (pipelined body) or not (last body).
#define Q24_LAST4_P(R, C0, C1, C2, C3, A, B) Q24_LO(R, C0, C1, C2, C3, A, B) Q24_LD(3, 4, 192) Q24_HI(C0, C1, C2, C3, A, B)
#define Q24_LAST_N(R, C0, C1, C2, C3, A, B) Q24_LO(R, C0, C1, C2, C3, A, B) Q24_HI(C0, C1, C2, C3, A, B)
  // int8: v2's next chunk is loaded once its last SDOT has issued (last group: k 4-7 first).
#define Q24_LAST8_P(R, C0, C1, C2, C3, A, B) \
  Q24_HI(C0, C1, C2, C3, A, B) "ldr q2, [x10, #96]\n\t" Q24_LD(3, 4, 192) Q24_LO(R, C0, C1, C2, C3, A, B)
  // int8: 8 k with the k 0-3 operand in R while the next 8 k's goes into register N.
#define Q24_STEP8(R, N) \
  "ldr " N ", [x10, #64]\n\t" Q24_GROUPS(R, Q24_LAST8_P) "add x10, x10, #64\n\tadd x11, x11, #192\n\t"
#define Q24_OPERANDS                                                                              \
  [c0] "=&w"(acc[0]), [c1] "=&w"(acc[1]), [c2] "=&w"(acc[2]), [c3] "=&w"(acc[3]),                  \
      [c4] "=&w"(acc[4]), [c5] "=&w"(acc[5]), [c6] "=&w"(acc[6]), [c7] "=&w"(acc[7]),               \
      [c8] "=&w"(acc[8]), [c9] "=&w"(acc[9]), [c10] "=&w"(acc[10]), [c11] "=&w"(acc[11]),           \
      [c12] "=&w"(acc[12]), [c13] "=&w"(acc[13]), [c14] "=&w"(acc[14]), [c15] "=&w"(acc[15]),       \
      [c16] "=&w"(acc[16]), [c17] "=&w"(acc[17]), [c18] "=&w"(acc[18]), [c19] "=&w"(acc[19]),       \
      [c20] "=&w"(acc[20]), [c21] "=&w"(acc[21]), [c22] "=&w"(acc[22]), [c23] "=&w"(acc[23])
  // The initial values: each row's shifted sum in all four lanes, rows zstride bytes apart.
#define Q24_Z1(C) "ld1r {%[" #C "].4s}, [x9], %[zs]\n\t"
#define Q24_INIT                                                                                  \
  "mov x9, %[z]\n\tmov x10, %[w]\n\tmov x11, %[x]\n\tmov x12, %[n]\n\t"                          \
  Q24_Z1(c0) Q24_Z1(c1) Q24_Z1(c2) Q24_Z1(c3) Q24_Z1(c4) Q24_Z1(c5) Q24_Z1(c6) Q24_Z1(c7)          \
  Q24_Z1(c8) Q24_Z1(c9) Q24_Z1(c10) Q24_Z1(c11) Q24_Z1(c12) Q24_Z1(c13) Q24_Z1(c14) Q24_Z1(c15)    \
  Q24_Z1(c16) Q24_Z1(c17) Q24_Z1(c18) Q24_Z1(c19) Q24_Z1(c20) Q24_Z1(c21) Q24_Z1(c22) Q24_Z1(c23)
#define Q24_INPUTS [w] "r"(w), [x] "r"(x), [n] "r"(iters - 1), [z] "r"(zsum), [zs] "r"(zstride)
#define Q24_CLOBBERS "x9", "x10", "x11", "x12", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "cc", "memory"
  if constexpr (BITS == 4) {
    asm volatile(
        Q24_INIT
        "ldr q7, [x10]\n\t"
        "ldr q3, [x11]\n\t"
        "ldr q4, [x11, #16]\n\t"
        "1:\n\t"
        "and v1.16b, v7.16b, %[m].16b\n\t"
        "ushr v2.16b, v7.16b, #4\n\t"
        "ldr q7, [x10, #32]\n\t"
        Q24_GROUPS("v1", Q24_LAST4_P)
        "add x10, x10, #32\n\t"
        "add x11, x11, #192\n\t"
        "subs x12, x12, #1\n\t"
        "b.ne 1b\n\t"
        "and v1.16b, v7.16b, %[m].16b\n\t"
        "ushr v2.16b, v7.16b, #4\n\t"
        Q24_GROUPS("v1", Q24_LAST_N)
        : Q24_OPERANDS
        : Q24_INPUTS, [m] "w"(vdupq_n_u8(0x0F))
        : Q24_CLOBBERS);
  } else {
    // iters is even (block: a multiple of 32): (iters - 2) / 2 loop iterations of two 8 k, then
    // one pipelined 8 k and the last.
    asm volatile(
        Q24_INIT
        "ldr q1, [x10]\n\t"
        "ldr q2, [x10, #32]\n\t"
        "ldr q3, [x11]\n\t"
        "ldr q4, [x11, #16]\n\t"
        "lsr x12, x12, #1\n\t"
        "cbz x12, 2f\n\t"
        "1:\n\t"
        Q24_STEP8("v1", "q7")
        Q24_STEP8("v7", "q1")
        "subs x12, x12, #1\n\t"
        "b.ne 1b\n\t"
        "2:\n\t"
        Q24_STEP8("v1", "q7")
        Q24_GROUPS("v7", Q24_LAST_N)
        : Q24_OPERANDS
        : Q24_INPUTS
        : Q24_CLOBBERS);
  }
#undef Q24_S
#undef Q24_LO
#undef Q24_HI
#undef Q24_LD
#undef Q24_GROUPS
#undef Q24_LAST4_P
#undef Q24_LAST_N
#undef Q24_LAST8_P
#undef Q24_STEP8
#undef Q24_OPERANDS
#undef Q24_Z1
#undef Q24_INIT
#undef Q24_INPUTS
#undef Q24_CLOBBERS
}

// Rows [m, m + 24) x panels [p0, p1): per slab of k, the rows are packed once and every panel
// passes over them; y is carried from slab to slab in the output (fp32, exact). The float
// operations per output are panel_tile's, in its order (y = 0; per block: fma with the scale
// term, then with the offset term; + bias at the end), so results are the same to the bit.
template <int BITS>
void tile24(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  const int64_t nb = g.nblocks, slab_blocks = std::max<int64_t>(1, kSlabK / g.block);
  alignas(16) int8_t xp[kTileRows * kSlabK];
  for (int64_t b0 = 0; b0 < nb; b0 += slab_blocks) {
    const int64_t b1 = std::min(nb, b0 + slab_blocks);
    pack_rows24(a, m, b0 * g.block, (b1 - b0) * g.block, xp);
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = a.packed + p * g.panel_bytes;
      const int64_t n0 = p * 8, cols = std::min<int64_t>(8, g.n - n0);
      for (int h = 0; h < 2; ++h) {
        const int64_t hcols = std::clamp<int64_t>(cols - 4 * h, 0, 4);
        float32x4_t y[kTileRows];
        for (int i = 0; i < kTileRows; ++i) {
          y[i] = vdupq_n_f32(0.f);
          if (b0 > 0) {  // the sums of the earlier slabs
            float t[4] = {};
            std::copy_n(a.y + (m + i) * a.ldy + n0 + 4 * h, hcols, t);
            y[i] = vld1q_f32(t);
          }
        }
        for (int64_t b = b0; b < b1; ++b) {
          const uint8_t* block = panel + b * g.block_bytes;
          int32x4_t acc[kTileRows];
          block24<BITS>(block + 16 * h, xp + (b - b0) * g.block * kTileRows, g.block / 8,
                        a.act.shifted_sum + m * nb + b, nb * 4, acc);
          const float32x4_t scale = load_half4(block + g.code_bytes + 8 * h);
          for (int i = 0; i < kTileRows; ++i)
            y[i] = vfmaq_f32(y[i], vcvtq_f32_s32(acc[i]), vmulq_n_f32(scale, a.act.scale[(m + i) * nb + b]));
          if (!g.symmetric) {
            const float32x4_t offset = load_half4(block + g.code_bytes + 16 + 8 * h);
            for (int i = 0; i < kTileRows; ++i) y[i] = vfmaq_n_f32(y[i], offset, a.act.scaled_sum[(m + i) * nb + b]);
          }
        }
        const bool last = b1 == nb;
        for (int i = 0; i < kTileRows; ++i) {
          float t[4];
          vst1q_f32(t, y[i]);
          float* out = a.y + (m + i) * a.ldy + n0 + 4 * h;
          for (int64_t r = 0; r < hcols; ++r) out[r] = last && a.bias ? t[r] + a.bias[n0 + 4 * h + r] : t[r];
        }
      }
    }
  }
}

// The GEMM: 24-row tiles, the rows left over by the 8-row tiles (and smaller) of gemm().
template <int BITS>
void sdot_gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  int64_t m = m0;
  for (; m + kTileRows <= m1; m += kTileRows) tile24<BITS>(a, m, p0, p1);
  if (m < m1) gemm<SdotBlockDot, BITS, 8>(a, m, m1, p0, p1);
}

}  // namespace
}  // namespace arm::dotprod

const KernelTable& dotprod_kernels() {
  static const KernelTable table = [] {
    KernelTable t = with_fp16_float_path(arm::make_table<arm::SdotBlockDot, arm::SdotBlockDot, 8>(
        Isa::dotprod, "gemv_w4a8_nr8_kr4_1x8_dotprod", "gemv_w8a8_nr8_kr4_s8_1x8_dotprod",
        "gemm_w4a8_nr8_kr4_24x8_dotprod", "gemm_w8a8_nr8_kr4_s8_24x8_dotprod"));
    for (Int8Ukernel& k : t.int8)  // the GEMMs: sdot_gemm's 24-row tiles
      if (k.mr > 1) {
        k.fn = k.bits == 4 ? arm::dotprod::sdot_gemm<4> : arm::dotprod::sdot_gemm<8>;
        k.mr = arm::dotprod::kTileRows;
      }
    add_dotprod_block_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace qlinear
