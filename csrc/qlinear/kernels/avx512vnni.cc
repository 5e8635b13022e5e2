// AVX-512 (F, BW, VL) + AVX512-VNNI kernels over the nr8_kr4 layout (compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c in this file only; dispatch calls
// them only on CPUs that report these features and the OS's ZMM state). Activation quantization
// and the float path are the AVX2 level's (every AVX-512 CPU has AVX2 + FMA + F16C).
//
// Integer core: one zmm holds the same 32-byte chunk of two consecutive panels (16 output rows x
// 4 k per 32-bit lane: panel p in the low half, p + 1 in the high half; an odd last panel runs
// with a zero high half). VPDPBUSD multiplies the unsigned codes by 4 activation bytes broadcast
// to every lane and adds the 4 products to int32 lanes, exactly (|sum| <= 256 * 255 * 127 < 2^31
// per block):
//   int4: the chunk splits into low / high nibbles (k 0..3 and 4..7 of its 8-k span), one VPDPBUSD each;
//   int8: the stored codes 0..255 directly (code_shift 0: shifted_sum = -zero_point * sum).
// Float epilogue per block (16 rows at once): y += (s_x * scale) * (acc + shifted_sum)
// (+ (s_x * sum_x) * offset), the same operations in the same order as the AVX2 level.
#include "x86_simd.h"

#include <algorithm>
#include <cstring>

#include "../kernels.h"
#include "x86_vnni.h"

namespace qlinear {
namespace {

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The same 32 bytes of panels p (at w) and p + 1 (at w + panel_bytes), or of p alone (NP == 1).
template <int NP>
inline __m512i load_pair(const uint8_t* w, int64_t panel_bytes) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  if constexpr (NP == 2) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + panel_bytes)), 1);
  } else {
    (void)panel_bytes;
    return _mm512_zextsi256_si512(lo);
  }
}

// 16 fp16 values: 8 at p (panel p) and 8 at p + panel_bytes (panel p + 1, or zeros).
template <int NP>
inline __m512 load_half16(const uint8_t* p, int64_t panel_bytes) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i hi = NP == 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + panel_bytes))
                             : _mm_setzero_si128();
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// Sum over one block of x * code for MR activation rows and NP panels. Two accumulators per row
// (low / high nibbles, or even / odd chunks) halve the VPDPBUSD dependency chains.
template <int BITS, int MR, int NP, bool PREFETCH>
inline void block_dot(const uint8_t* w, int64_t panel_bytes, int64_t block, const int8_t* const* xq,
                      __m512i* acc) {
  __m512i acc2[MR];
  for (int i = 0; i < MR; ++i) acc[i] = acc2[i] = _mm512_setzero_si512();
  if constexpr (BITS == 4) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int64_t kk = 0; kk < block; kk += 8, w += 32) {  // a chunk: 8 k
      if constexpr (PREFETCH) {
        if ((kk & 15) == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
          if constexpr (NP == 2) _mm_prefetch(reinterpret_cast<const char*>(w) + panel_bytes + 2048, _MM_HINT_T0);
        }
      }
      const __m512i raw = load_pair<NP>(w, panel_bytes);
      const __m512i lo = _mm512_and_si512(raw, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm512_dpbusd_epi32(acc[i], lo, bcast4(xq[i] + kk));
        acc2[i] = _mm512_dpbusd_epi32(acc2[i], hi, bcast4(xq[i] + kk + 4));
      }
    }
  } else {
    for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // two chunks: 8 k
      if constexpr (PREFETCH) {
        _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
        if constexpr (NP == 2) _mm_prefetch(reinterpret_cast<const char*>(w) + panel_bytes + 2048, _MM_HINT_T0);
      }
      const __m512i c0 = load_pair<NP>(w, panel_bytes), c1 = load_pair<NP>(w + 32, panel_bytes);
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm512_dpbusd_epi32(acc[i], c0, bcast4(xq[i] + kk));
        acc2[i] = _mm512_dpbusd_epi32(acc2[i], c1, bcast4(xq[i] + kk + 4));
      }
    }
  }
  for (int i = 0; i < MR; ++i) acc[i] = _mm512_add_epi32(acc[i], acc2[i]);
}

// Rows [m, m + MR) x panels [p, p + NP), over all blocks.
template <int BITS, int MR, int NP, bool PREFETCH>
void panel_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  const WeightGeometry& g = *a.w;
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  const int8_t* xq[MR];
  const float* sx = a.act.scale + m * g.nblocks;
  const float* sxsum = a.act.scaled_sum + m * g.nblocks;
  const int32_t* zsum = a.act.shifted_sum + m * g.nblocks;
  __m512 y[MR];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.act.q + (m + i) * a.act.ldq;
    y[i] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    __m512i acc[MR];
    block_dot<BITS, MR, NP, PREFETCH>(block, g.panel_bytes, g.block, xq, acc);
    const __m512 scale = load_half16<NP>(block + g.code_bytes, g.panel_bytes);
    for (int i = 0; i < MR; ++i) {
      const int64_t at = i * g.nblocks + b;
      const __m512i acc_q = _mm512_add_epi32(acc[i], _mm512_set1_epi32(zsum[at]));
      y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc_q), _mm512_mul_ps(scale, _mm512_set1_ps(sx[at])), y[i]);
      xq[i] += g.block;
    }
    if (!g.symmetric) {
      const __m512 offset = load_half16<NP>(block + g.code_bytes + 16, g.panel_bytes);
      for (int i = 0; i < MR; ++i)
        y[i] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sxsum[i * g.nblocks + b]), y[i]);
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8 * NP, g.n - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 bias = a.bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, a.bias + n0);
  for (int i = 0; i < MR; ++i)
    _mm512_mask_storeu_ps(a.y + (m + i) * a.ldy + n0, mask, _mm512_add_ps(y[i], bias));
}

template <int BITS, int MR, bool PREFETCH>
inline void panels(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  int64_t p = p0;
  for (; p + 2 <= p1; p += 2) panel_tile<BITS, MR, 2, PREFETCH>(a, m, p);
  if (p < p1) panel_tile<BITS, MR, 1, PREFETCH>(a, m, p);
}

template <int BITS>
void gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t m = m0; m < m1; ++m) panels<BITS, 1, true>(a, m, p0, p1);
}

// As the AVX2 level: rows in chunks whose int8 activations stay in L2 while every panel pair of
// the range passes over them; a panel pair stays in L1 across the chunk's row tiles.
template <int BITS>
void gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t kRowChunk = 32;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; p += 2) {
      const int64_t pe = std::min(p1, p + 2);
      int64_t m = mc;
      for (; m + 4 <= mc1; m += 4) panels<BITS, 4, false>(a, m, p, pe);
      switch (mc1 - m) {
        case 3: panels<BITS, 3, false>(a, m, p, pe); break;
        case 2: panels<BITS, 2, false>(a, m, p, pe); break;
        case 1: panels<BITS, 1, false>(a, m, p, pe); break;
        default: break;
      }
    }
  }
}

}  // namespace

namespace avx512vnni {
void gemm_w4a8(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) { gemm<4>(a, m0, m1, p0, p1); }
void gemm_w8a8(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) { gemm<8>(a, m0, m1, p0, p1); }
}  // namespace avx512vnni

const KernelTable& avx512vnni_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx2_kernels();  // activation quantization and the float path
    t.isa = Isa::avx512vnni;
    t.gemv[0] = gemv<4>;
    t.gemv[1] = gemv<8>;
    t.gemv_name[0] = "gemv_w4a8_nr8_kr4_x2_avx512vnni";
    t.gemv_name[1] = "gemv_w8a8_nr8_kr4_x2_avx512vnni";
    t.gemm[0] = gemm<4>;
    t.gemm[1] = gemm<8>;
    t.gemm_name[0] = "gemm_w4a8_nr8_kr4_4x16_avx512vnni";
    t.gemm_name[1] = "gemm_w8a8_nr8_kr4_4x16_avx512vnni";
    t.code_shift[0] = t.code_shift[1] = 0;
    return t;
  }();
  return table;
}

}  // namespace qlinear
