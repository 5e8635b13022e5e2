// AVX2 + FMA + F16C kernels over the nr8_kr4 layout (compiled with -mavx2 -mfma -mf16c in
// this file only; dispatch calls them only on CPUs that report all three). The kernel bodies are
// x86_common.h's; this level supplies its block dot products and activation quantization.
//
// Integer core, per 32-byte chunk of one panel (8 output rows x 4 k per 32-bit lane):
//   int4: the chunk splits into low / high nibbles, two u8 x 8 x 4 operands (0..15); each is
//         multiplied by 4 activation bytes broadcast to every lane with VPMADDUBSW (u8 x s8,
//         pairs summed in s16: |pair| <= 2 * 15 * 127). Four chunks (32 k) add up in s16
//         (|sum| <= 16 * 15 * 127 = 30480 < 32767) before VPMADDWD widens them to int32: exact.
//   int8: codes 0..255 are flipped to c - 128 (-128..127, code_shift 128); VPMADDUBSW(|c - 128|,
//         sign(x, c - 128)) keeps |pair| <= 2 * 128 * 127 < 32767, widened to int32 per chunk:
//         exact. shifted_sum = (128 - zero_point) * sum(x) restores sum(x * (code - zero_point)).
// Kernels: GEMV 1x8 (prefetching), GEMM 4x8 row tiles over the packed panels, and from 12 rows
// the int4 GEMM on 3-row x 16-output tiles over blocks of two panels unpacked once in L1.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "qlinear/kernels/x86/avx2.h"
#include "qlinear/kernels/block_kernels.h"
#include "qlinear/kernels/x86/x86_common.h"

namespace qlinear {
namespace {

using avx2::hmax;

// ---------------------------------------------------------------------------------------------
// Dynamic activation quantization: absmax per block, q = rint(x / s), s = absmax / 127.

template <DType DT>
inline __m256 load8(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i)));
}

template <DType DT>
inline float load1(const void* x, int64_t i) {
  if constexpr (DT == DType::f32) return static_cast<const float*>(x)[i];
  else return _cvtsh_ss(static_cast<const uint16_t*>(x)[i]);
}

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

template <DType DT>
void quantize_acts_impl(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  const int64_t kpad = a.nblocks * a.block;
  const int64_t act_block = a.act_block >= a.k ? kpad : a.act_block;
  const __m256 sign_mask = _mm256_set1_ps(-0.f);
  const __m256i qmax = _mm256_set1_epi32(127), qmin = _mm256_set1_epi32(-127);
  for (int64_t m = m0; m < m1; ++m) {
    const void* x = DT == DType::f32 ? static_cast<const void*>(static_cast<const float*>(a.x) + m * a.ldx)
                                     : static_cast<const void*>(static_cast<const uint16_t*>(a.x) + m * a.ldx);
    int8_t* q = a.q + m * a.ldq;
    for (int64_t a0 = 0; a0 < kpad; a0 += act_block) {
      const int64_t a1 = std::min(a0 + act_block, a.k);  // real activations of this block
      // absmax, with NaN / Inf detection (VMAXPS drops NaNs, so track them apart).
      __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
      int64_t i = a0;
      for (; i + 8 <= a1; i += 8) {
        const __m256 v = load8<DT>(x, i);
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, v));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      }
      const float absmax = hmax(vmax);
      const bool finite = _mm256_movemask_ps(vnan) == 0;
      const float s = act_scale(absmax, finite, [&](int64_t j) { return load1<DT>(x, j); }, i, a1);
      const bool zero = !(s > 0.f);  // all-zero, underflowing or non-finite block: q = 0
      const __m256 vs = _mm256_set1_ps(s);
      const int64_t block_end = std::min(a0 + act_block, kpad);
      for (int64_t b = a0 / a.block; b < block_end / a.block; ++b) {
        const int64_t b0 = b * a.block, b1 = b0 + a.block, real_end = std::max(b0, std::min(b1, a1));
        __m256i vsum = _mm256_setzero_si256();
        int32_t sum = 0;
        int64_t j = b0;
        if (!zero) {
          for (; j + 8 <= real_end; j += 8) {
            __m256i v = _mm256_cvtps_epi32(_mm256_div_ps(load8<DT>(x, j), vs));  // rounds to nearest even
            v = _mm256_max_epi32(qmin, _mm256_min_epi32(qmax, v));
            vsum = _mm256_add_epi32(vsum, v);
            const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(q + j), _mm_packs_epi16(w16, w16));
          }
          for (; j < real_end; ++j) sum += q[j] = quantize_one(load1<DT>(x, j), s);
        }
        for (; j < b1; ++j) q[j] = 0;
        a.sum[m * a.nblocks + b] = sum + hsum_epi32(vsum);
        a.scale[m * a.nblocks + b] = s;
      }
    }
  }
}

void quantize_acts(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  if (a.dtype == DType::f32) quantize_acts_impl<DType::f32>(a, m0, m1);
  else quantize_acts_impl<DType::f16>(a, m0, m1);
  write_pre_sums(a, m0, m1);
}

// ---------------------------------------------------------------------------------------------
// Block dot products.

using x86::Ymm;

// Row tiles over the packed panels: sums over one block of x * code (int4) or x * (code - 128)
// (int8) for MR rows and one panel.
struct MaddubsDot {
  static constexpr int32_t code_shift(int bits) { return bits == 8 ? 128 : 0; }

  template <int BITS, int MR, int NP, bool PREFETCH>
  static void block_dot(const uint8_t* w, int64_t, int64_t block, const int8_t* const* xq, __m256i* acc) {
    static_assert(NP == 1, "one panel per ymm");
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (BITS == 4) {
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 32, w += 128) {  // 4 chunks of 8 k
        if constexpr (PREFETCH) {
          _mm_prefetch(reinterpret_cast<const char*>(w) + x86::kWeightPrefetchAhead, _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(w) + x86::kWeightPrefetchAhead + 64, _MM_HINT_T0);
        }
        __m256i s16[MR];
        for (int i = 0; i < MR; ++i) s16[i] = _mm256_setzero_si256();
        const auto chunk = [&](int c) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c));
          const __m256i lo = _mm256_and_si256(raw, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          for (int i = 0; i < MR; ++i) {
            const int8_t* x = xq[i] + kk + 8 * c;
            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, Ymm::bcast4(x)),
                                               _mm256_maddubs_epi16(hi, Ymm::bcast4(x + 4)));
            s16[i] = _mm256_add_epi16(s16[i], p);
          }
        };
        if constexpr (MR == 1) {
          for (int c = 0; c < 4; ++c) chunk(c);
        } else {
          // Kept rolled: unrolled, GCC hoists all four chunks' products and spills them.
#pragma GCC unroll 1
          for (int c = 0; c < 4; ++c) chunk(c);
        }
        for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(s16[i], ones));
      }
    } else {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
      for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // 2 chunks of 4 k
        if constexpr (PREFETCH) _mm_prefetch(reinterpret_cast<const char*>(w) + x86::kWeightPrefetchAhead, _MM_HINT_T0);
        for (int c = 0; c < 2; ++c) {
          const __m256i sw = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * c)), flip);
          const __m256i aw = _mm256_abs_epi8(sw);
          for (int i = 0; i < MR; ++i) {
            const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Ymm::bcast4(xq[i] + kk + 4 * c), sw));
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
          }
        }
      }
    }
  }
};

// Tiled int4 GEMM over unpacked int8 chunks (0..15): the u8 x s8 pair sums of 8 chunks (32 k)
// add up in s16 (|sum| <= 8 * 2 * 15 * 127 = 30480) before VPMADDWD widens them: exact. 3 rows
// x 2 panels: 6 s16 + 6 s32 sums in registers.
struct MaddubsTileDot {
  template <int NP>
  static constexpr int mr() { return NP == 2 ? 3 : 4; }
  static constexpr int32_t code_shift(int /*bits*/) { return 0; }

  template <int MR, int NP, int STRIDE>
  static void run(const uint8_t* const* w, int64_t block, const int8_t* const* xq, __m256i* acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    // 32 k: the first chunk's products start the s16 sums, the first step's widened sums the
    // accumulators (no additions to zero).
    const auto step32 = [&](int64_t kk, auto first_step) {
      const int64_t off = kk / 4 * STRIDE;
      __m256i s16[MR * NP];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        // Ordered barriers: chunk c's sums are complete before chunk c + 1's weights are read.
        // Without them GCC hoists all products above the sums and spills them.
        if (c > 0)
          for (int i = 0; i < MR * NP; ++i) __asm__ volatile("" : "+x"(s16[i]));
        __m256i wc[NP];
        for (int p = 0; p < NP; ++p) {
          wc[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w[p] + off + c * STRIDE));
          __asm__ volatile("" : "+x"(wc[p]));
        }
        for (int i = 0; i < MR; ++i) {
          const __m256i x4 = Ymm::bcast4(xq[i] + kk + 4 * c);
          for (int p = 0; p < NP; ++p) {
            const __m256i prod = _mm256_maddubs_epi16(wc[p], x4);
            s16[i * NP + p] = c == 0 ? prod : _mm256_add_epi16(s16[i * NP + p], prod);
          }
        }
      }
      for (int i = 0; i < MR * NP; ++i) {
        const __m256i wide = _mm256_madd_epi16(s16[i], ones);
        acc[i] = decltype(first_step)::value ? wide : _mm256_add_epi32(acc[i], wide);
      }
    };
    step32(0, std::true_type{});
    for (int64_t kk = 32; kk < block; kk += 32) step32(kk, std::false_type{});
  }
};

}  // namespace

const KernelTable& avx2_kernels() {
  using namespace x86;
  static const KernelTable table = [] {
    KernelTable t = {
      Isa::avx2, LayoutId::nr8_kr4,
      quantize_acts, "quantize_acts_absmax_avx2",
      avx2::prepare_float_acts,
      {
          ukernel<MaddubsDot>("gemv_w4a8_nr8_kr4_1x8_avx2", gemv<Ymm, MaddubsDot, 4>, 4, 1, 1, 1, 1),
          ukernel<MaddubsTileDot>("gemm_w4a8_nr8_kr4_3x16_avx2", gemm_tiled<MaddubsTileDot, 4>, 4, 3, 2, 12),
          ukernel<MaddubsDot>("gemm_w4a8_nr8_kr4_4x8_avx2", gemm_rows<Ymm, MaddubsDot, 4, 4>, 4, 4, 1, 2),
          ukernel<MaddubsDot>("gemv_w8a8_nr8_kr4_1x8_avx2", gemv<Ymm, MaddubsDot, 8>, 8, 1, 1, 1, 1),
          ukernel<MaddubsDot>("gemm_w8a8_nr8_kr4_4x8_avx2", gemm_rows<Ymm, MaddubsDot, 8, 4>, 8, 4, 1, 2),
      },
      avx2::float_ukernels(),
      {},
    };
    add_scalar_block_kernels(t);  // the float path of the block formats
    add_avx2_block_kernels(t);
    return t;
  }();
  return table;
}

}  // namespace qlinear
