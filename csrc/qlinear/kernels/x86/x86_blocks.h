// The block formats' int8-activation kernels on x86 (block_format.h), shared by the levels like
// x86_common.h: a level's file includes this header under its own flags and supplies the dot
// product of 32 code bytes (8 rows x 4 k) with 4 activation bytes (BlockDot below). One register
// holds the 8 rows of a panel (ymm).
//
// Per super-block of a panel: the sub-scales and constants of the 8 rows are unpacked into vectors
// (8 int32 / float lanes), then per sub-block the codes are unpacked chunk by chunk in registers
// (nibble or two-bit plane AND / shift, the high plane's bits shifted above them, IQ4 / MXFP4 through a
// 16-byte table lookup) and dotted with the activations; the sub-block's int32 sums are scaled by
// its sub-scale (VPMULLD) into the super-block's sum, the minimums' term likewise from the
// activations' sums of 16. The float epilogue is the scalar kernel's, operation for operation
// (two FMAs per super-block), so every level gives the scalar level's bits.
#pragma once

#include "qlinear/kernels/x86/x86_common.h"

#include <algorithm>
#include <cstring>

#include "qlinear/core/block_format.h"
#include "qlinear/core/kernels.h"
#include "qlinear/kernels/block_driver.h"

namespace qlinear::x86 {
namespace {

// The 8 rows' constants of one super-block.
template <Format F>
struct PanelMeta {
  __m256 d, m;                                    // m: the minimums' float factor (formats with minimums)
  alignas(32) uint8_t sc6[128], mn6[128];         // the sub-scales / minimums as bytes, [sub-block][row]

  // 64 six-bit entries (block_format.cc get6) unpacked to bytes.
  static void unpack6(const uint8_t* p, uint8_t* out) {
    const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
    const __m256i h01 = _mm256_set_m128i(_mm_srli_epi16(h, 2), h);
    const __m256i h23 = _mm256_set_m128i(_mm_srli_epi16(h, 6), _mm_srli_epi16(h, 4));
    const __m256i e0 = _mm256_or_si256(_mm256_and_si256(lo, low4), _mm256_slli_epi16(_mm256_and_si256(h01, two), 4));
    const __m256i e1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), low4),
                                       _mm256_slli_epi16(_mm256_and_si256(h23, two), 4));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), e0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32), e1);
  }

  explicit PanelMeta(const uint8_t* meta) {
    using T = BlockTraits<F>;
    if constexpr (F == Format::mxfp4) {
      // 2^(e - 128): (e - 1) << 23 for e >= 2, the subnormals 2^-127 / 2^-128 below
      const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta)));
      const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
      const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
      d = _mm256_castsi256_ps(_mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
    } else {
      d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
    }
    if constexpr (T::kHasMin) {
      m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 16)));
      if constexpr (T::k_quant) m = _mm256_xor_ps(m, _mm256_set1_ps(-0.f));  // m = -dmin
    } else {
      m = _mm256_setzero_ps();
    }
    if constexpr (F == Format::q4_k || F == Format::q5_k) {
      unpack6(meta + 32, sc6);
      unpack6(meta + 80, mn6);
    } else if constexpr (F == Format::iq4_xs) {
      unpack6(meta + 16, sc6);
    } else if constexpr (F == Format::q3_k) {
      unpack6(meta + 16, sc6);
      unpack6(meta + 64, sc6 + 64);
    } else if constexpr (F == Format::q2_k) {  // the file's bytes: sub-scale | minimum << 4
      const __m256i low4 = _mm256_set1_epi8(0x0F);
      for (int i = 0; i < 4; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(meta + 32 + 32 * i));
        _mm256_store_si256(reinterpret_cast<__m256i*>(sc6 + 32 * i), _mm256_and_si256(v, low4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(mn6 + 32 * i), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
      }
    }
  }

  // Sub-block j's sub-scales and minimums of the 8 rows (int32).
  static __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  __m256i sc(const uint8_t* meta, int j) const {
    if constexpr (F == Format::q6_k)
      return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(meta + 16 + 8 * j)));
    else if constexpr (F == Format::iq4_xs || F == Format::q3_k)
      return _mm256_sub_epi32(u8x8(sc6 + 8 * j), _mm256_set1_epi32(32));
    else
      return u8x8(sc6 + 8 * j);
  }
  __m256i mn(int j) const { return u8x8(mn6 + 8 * j); }
};

// The 32-byte int8 chunk pair 2Q, 2Q + 1 of a super-block (8 rows x k 8Q .. 8Q + 3 and
// 8Q + 4 .. 8Q + 7) as codes 0..63 (lookup formats: the table's indices). Q is a constant, so the
// planes' shifts are immediates.
template <Format F, int Q>
inline void chunk_pair(const uint8_t* block, __m256i* c0, __m256i* c1) {
  using T = BlockTraits<F>;
  // bit S of each byte moved to bit D: 16-bit shifts, whose bits crossing into the other byte are
  // masked off by the caller
  const auto move = [](__m256i h, auto s, auto d) {
    constexpr int kS = decltype(s)::value, kD = decltype(d)::value;
    if constexpr (kS <= kD) return _mm256_slli_epi16(h, kD - kS);
    else return _mm256_srli_epi16(h, kS - kD);
  };
  using Zero = std::integral_constant<int, 0>;
  if constexpr (T::kLowBits == 4) {  // nibbles: int4 chunk Q
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * Q));
    *c0 = _mm256_and_si256(raw, low4);
    *c1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  } else {  // two-bit codes: chunk 4 (Q / 2) + t at bits 2t of group Q / 2
    const __m256i three = _mm256_set1_epi8(0x03);
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * (Q / 2)));
    *c0 = _mm256_and_si256(move(raw, std::integral_constant<int, 4 * (Q % 2)>{}, Zero{}), three);
    *c1 = _mm256_and_si256(move(raw, std::integral_constant<int, 4 * (Q % 2) + 2>{}, Zero{}), three);
  }
  constexpr int kL = T::kLowBits;
  const uint8_t* high = block + T::kLowBytes;
  if constexpr (T::kHighBits == 1) {  // bit t of byte i of group Q / 4: chunk 8 (Q / 4) + t, to bit kL
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + 32 * (Q / 4)));
    const __m256i bit = _mm256_set1_epi8(1 << kL);
    *c0 = _mm256_or_si256(*c0, _mm256_and_si256(move(h, std::integral_constant<int, 2 * (Q % 4)>{}, std::integral_constant<int, kL>{}), bit));
    *c1 = _mm256_or_si256(*c1, _mm256_and_si256(move(h, std::integral_constant<int, 2 * (Q % 4) + 1>{}, std::integral_constant<int, kL>{}), bit));
  } else if constexpr (T::kHighBits == 2) {  // bits 2t, 2t + 1 of byte i of group Q / 2: chunk 4 (Q / 2) + t, to bits 4..5
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(high + 32 * (Q / 2)));
    const __m256i two = _mm256_set1_epi8(0x30);
    *c0 = _mm256_or_si256(*c0, _mm256_and_si256(move(h, std::integral_constant<int, 4 * (Q % 2)>{}, std::integral_constant<int, 4>{}), two));
    *c1 = _mm256_or_si256(*c1, _mm256_and_si256(move(h, std::integral_constant<int, 4 * (Q % 2) + 2>{}, std::integral_constant<int, 4>{}), two));
  }
}

// The dot product of code chunks with 4 activation bytes broadcast, by level:
//   VNNI (V::dpbusd): unsigned codes; lookup formats' values + 128 (zero 128);
//   AVX2 (VPMADDUBSW + VPMADDWD): codes 0..63 (|pair sum| <= 2 * 63 * 127, no saturation);
//     lookup formats' signed values through the sign trick (|v| x sign(x, v)).
template <class V, bool VNNI>
struct BlockDot {
  static constexpr bool kVnni = VNNI;
  template <Format F>
  static constexpr int zero() { return BlockTraits<F>::kLookup ? (VNNI ? 128 : 0) : BlockTraits<F>::kZero; }

  // The register a lookup format's codes go through (VNNI: values + 128; AVX2: signed values).
  template <Format F>
  static __m256i table() {
    const int8_t* t = format_table(F);
    alignas(16) int8_t v[16];
    for (int i = 0; i < 16; ++i) v[i] = static_cast<int8_t>(VNNI ? t[i] + 128 : t[i]);
    const __m128i x = _mm_load_si128(reinterpret_cast<const __m128i*>(v));
    return _mm256_set_m128i(x, x);
  }

  template <Format F>
  static __m256i dot(__m256i acc, __m256i codes, __m256i tbl, const int8_t* x) {
    __m256i xb;
    int32_t v;
    std::memcpy(&v, x, 4);
    xb = _mm256_set1_epi32(v);
    if constexpr (BlockTraits<F>::kLookup) codes = _mm256_shuffle_epi8(tbl, codes);
    if constexpr (VNNI) {
      return V::dpbusd(acc, codes, xb);
    } else {
      const __m256i ones = _mm256_set1_epi16(1);
      if constexpr (BlockTraits<F>::kLookup) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(xb, codes));
        return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
      } else {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, xb), ones));
      }
    }
  }
};

// MR activation rows [m, m + MR) x panel p, all super-blocks.
template <class D, Format F, int MR, bool PREFETCH>
void block_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  using T = BlockTraits<F>;
  constexpr int kZero = D::template zero<F>();
  const WeightGeometry& g = *a.w;
  const __m256i tbl = T::kLookup ? D::template table<F>() : _mm256_setzero_si256();
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  __m256 y[MR];
  for (int i = 0; i < MR; ++i) y[i] = _mm256_setzero_ps();
  const int64_t stride = g.block_bytes / (T::kSuper / 8);  // bytes per chunk of 8 k, < 64
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    const uint8_t* meta = block + g.code_bytes;
    const PanelMeta<F> pm(meta);
    __m256i A[MR], B[MR];
    for (int i = 0; i < MR; ++i) A[i] = B[i] = _mm256_setzero_si256();
    static_for<0, T::kNsub>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      __m256i acc[MR], acc2[MR];  // two chains per row (low / high nibbles' chunks), joined below
      int32_t xs[MR];
      for (int i = 0; i < MR; ++i) {
        const int32_t* s16 = a.act.sum16 + (m + i) * a.act.ld16 + (b * T::kSuper + j * T::kSub) / 16;
        xs[i] = T::kSub == 32 ? s16[0] + s16[1] : s16[0];
        acc[i] = _mm256_set1_epi32(-kZero * xs[i]);
        acc2[i] = _mm256_setzero_si256();
      }
      static_for<0, T::kSub / 8>([&](auto tc) {
        constexpr int q = j * (T::kSub / 8) + decltype(tc)::value;
        __m256i c0, c1;
        if constexpr (PREFETCH) {  // one line ahead per chunk, spread over the block (a burst stalls)
          _mm_prefetch(reinterpret_cast<const char*>(block + kWeightPrefetchAhead + q * stride), _MM_HINT_T0);
        }
        chunk_pair<F, q>(block, &c0, &c1);
        for (int i = 0; i < MR; ++i) {
          const int8_t* x = a.act.q + (m + i) * a.act.ldq + b * T::kSuper + 8 * q;
          acc[i] = D::template dot<F>(acc[i], c0, tbl, x);
          acc2[i] = D::template dot<F>(acc2[i], c1, tbl, x + 4);
        }
      });
      for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_epi32(acc[i], acc2[i]);
      if constexpr (T::kNsub > 1) {
        const __m256i sc = pm.sc(meta, j);
        for (int i = 0; i < MR; ++i) A[i] = _mm256_add_epi32(A[i], _mm256_mullo_epi32(acc[i], sc));
      } else {
        for (int i = 0; i < MR; ++i) A[i] = acc[i];
      }
      if constexpr (T::kHasMin) {
        if constexpr (T::kNsub > 1) {
          const __m256i mn = pm.mn(j);
          for (int i = 0; i < MR; ++i) B[i] = _mm256_add_epi32(B[i], _mm256_mullo_epi32(mn, _mm256_set1_epi32(xs[i])));
        } else {
          for (int i = 0; i < MR; ++i) B[i] = _mm256_set1_epi32(xs[i]);
        }
      }
    });
    for (int i = 0; i < MR; ++i) {
      const __m256 sx = _mm256_broadcast_ss(a.act.scale + (m + i) * g.nblocks + b);
      y[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[i]), _mm256_mul_ps(pm.d, sx), y[i]);
      if constexpr (T::kHasMin) y[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(B[i]), _mm256_mul_ps(pm.m, sx), y[i]);
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
  const float* bias = a.bias ? a.bias + n0 : nullptr;
  const __m256 vbias = Ymm::load_bias<1>(bias, rows);
  for (int i = 0; i < MR; ++i) Ymm::store_rows<1>(a.y + (m + i) * a.ldy + n0, y[i], vbias, bias, rows);
}

template <class D, Format F, int MR>
[[gnu::noinline]] void block_row_tile(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  for (int64_t p = p0; p < p1; ++p) block_tile<D, F, MR, MR == 1>(a, m, p);
}

template <class D, Format F>
void block_gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  drive_block_gemm<4>(m0, m1, p0, p1, [&](auto rows, int64_t m, int64_t q0, int64_t q1) {
    block_row_tile<D, F, decltype(rows)::value>(a, m, q0, q1);
  });
}

// Every format's kernels of a level: a GEMV (M = 1) and a GEMM of 4-row tiles.
template <class D>
void add_block_kernels(KernelTable& t, const char* level) {
  add_level_block_kernels<4>(t, level, [](auto fc) { return &block_gemm<D, decltype(fc)::value>; });
}

}  // namespace
}  // namespace qlinear::x86
