// The bodies of the x86 int8-activation kernels, shared by the levels (avx2, avxvnni, avx512vnni,
// amx). A level's file includes this header under its own target flags and supplies what differs:
// the vector width (vector traits: Ymm here, Zmm in x86_zmm.h) and the block dot product (Dot:
// VPMADDUBSW + VPMADDWD for AVX2, VPDPBUSD for the VNNI levels). Everything here sits in an
// anonymous namespace: each level's file gets its own copy, compiled with its own instructions,
// and no copy compiled for a wider level can be linked into a narrower one.
//
// Layout (layout.h): a panel = 8 output rows; a 32-byte chunk = 8 rows x 4 k (int8) or 8 k (int4,
// nibble halves k 0..3 / 4..7); a block = the chunks of `block` k, then the fp16 scales (and
// offsets). Float epilogue per block, the same operations in the same order at every level
// (results are bit-identical across levels and tiles; docs/semantics.md):
//   y += (s_x * scale) * float(acc + shifted_sum)   (+ (s_x * sum_x) * offset, asymmetric)
#pragma once

#include "qlinear/kernels/x86/x86_simd.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "qlinear/core/kernels.h"
#include "qlinear/kernels/tiling.h"

namespace qlinear::x86 {
namespace {

// A descriptor (kernels.h) whose activation packing follows the dot product's code_shift.
template <class Dot>
Int8Ukernel ukernel(const char* name, Int8MatmulFn fn, int bits, int mr, int np, int64_t m_min,
                    int64_t m_max = INT64_MAX, int64_t m_unit = 1) {
  return {name, fn, bits, mr, np, m_min, m_max, m_unit, Dot::code_shift(bits)};
}

// Bytes ahead of the read position that the GEMVs prefetch their weight stream (one panel after
// another: one sequential stream). Zen 5, one thread, a 72 MB int4 weight: 2048 -> 8192 bytes
// 29.5 -> 37.7 GB/s (a plain streaming read: 36.7), 12288 39.4, 16384-32768 no further; the
// MoE bench model's decode at 1 thread 1.18x faster, at 2 threads 1.07x (docs/benchmarks.md).
inline constexpr int64_t kWeightPrefetchAhead = 8192;

// ---------------------------------------------------------------------------------------------
// Vector traits: one register holds the 8 rows of one panel (Ymm) or of two (Zmm).

struct Ymm {
  using I = __m256i;
  using F = __m256;
  static constexpr int kPanels = 1;
  static constexpr int64_t kPrefetchAhead = kWeightPrefetchAhead;

  static I zero() { return _mm256_setzero_si256(); }
  static F fzero() { return _mm256_setzero_ps(); }
  static I set1_8(char v) { return _mm256_set1_epi8(v); }
  static I set1_32(int32_t v) { return _mm256_set1_epi32(v); }
  static I add32(I a, I b) { return _mm256_add_epi32(a, b); }
  static I and_(I a, I b) { return _mm256_and_si256(a, b); }
  static I high_nibbles(I v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)); }
  static F cvt(I v) { return _mm256_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  // 4 activation bytes broadcast to every 32-bit lane.
  static I bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
  }
  template <int NP>
  static I load_codes(const uint8_t* w, int64_t) {
    static_assert(NP == 1, "a ymm holds one panel");
    return _mm256_loadu_si256(reinterpret_cast<const I*>(w));
  }
  template <int NP>
  static void prefetch(const uint8_t* p, int64_t) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  // 8 fp16 values (scales or offsets of one panel's block).
  template <int NP = 1>
  static F load_halves(const uint8_t* p, int64_t = 0) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <int NP>
  static F load_bias(const float* bias, int64_t rows) {
    return bias != nullptr && rows == 8 ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
  }
  // out[r] = y[r] + bias[r] for the `rows` real rows of the panel (bias: the vector of load_bias
  // and its source, or nullptr).
  template <int NP>
  static void store_rows(float* out, F y, F vbias, const float* bias, int64_t rows) {
    if (rows == 8) {
      _mm256_storeu_ps(out, _mm256_add_ps(y, vbias));
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, y);
      for (int64_t r = 0; r < rows; ++r) out[r] = bias ? tmp[r] + bias[r] : tmp[r];
    }
  }
};

// ---------------------------------------------------------------------------------------------
// Int4 codes unpacked once into int8 chunks: int4 chunk c (8 rows x 8 k) -> int8 chunks 2c (k 0..3,
// low nibbles) and 2c + 1 (k 4..7, high nibbles), 0..15 each, chunk j at out + j * stride
// (32-byte aligned). With stride 32 the result is the int8 layout of the same block.
inline void unpack_int4_block(const uint8_t* codes, int64_t code_bytes, int8_t* out, int64_t stride) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < code_bytes; i += 32, out += 2 * stride) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + i));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_and_si256(raw, low4));
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + stride), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4));
  }
}

// ---------------------------------------------------------------------------------------------
// Block dot product with VPDPBUSD (the VNNI levels; V supplies dpbusd): unsigned codes times 4
// activation bytes broadcast to every lane, 4 products added to int32 lanes exactly. Tiles of
// fewer than 4 rows keep two accumulators per row (low / high nibbles, or even / odd chunks) to
// halve the dependency chains; int4 tiles of 4+ rows one (V::dpbusd_x: dpbusd with the 4
// activation bytes at x broadcast). Codes are used as stored (code_shift 0).
template <class V>
struct DpbusdDot {
  static constexpr int32_t code_shift(int /*bits*/) { return 0; }

  template <int BITS, int MR, int NP, bool PREFETCH>
  static void block_dot(const uint8_t* w, int64_t panel_bytes, int64_t block, const int8_t* const* xq,
                        typename V::I* acc) {
    using I = typename V::I;
    I acc2[MR];
    for (int i = 0; i < MR; ++i) acc2[i] = V::zero();
    if constexpr (BITS == 4 && MR >= 4) {
      // Rows enough for independent chains: one accumulator per row; the activations as the
      // instruction's broadcast operand where the level has one (V::dpbusd_x).
      const I low4 = V::set1_8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 8, w += 32) {
        if constexpr (PREFETCH) {
          if ((kk & 15) == 0) V::template prefetch<NP>(w + V::kPrefetchAhead, panel_bytes);
        }
        const I raw = V::template load_codes<NP>(w, panel_bytes);
        const I lo = V::and_(raw, low4), hi = V::high_nibbles(raw);
        for (int i = 0; i < MR; ++i) acc[i] = V::dpbusd_x(acc[i], lo, xq[i] + kk);
        for (int i = 0; i < MR; ++i) acc[i] = V::dpbusd_x(acc[i], hi, xq[i] + kk + 4);
      }
      return;
    } else if constexpr (BITS == 4) {
      const I low4 = V::set1_8(0x0F);
      for (int64_t kk = 0; kk < block; kk += 8, w += 32) {  // a chunk: 8 k
        if constexpr (PREFETCH) {
          if ((kk & 15) == 0) V::template prefetch<NP>(w + V::kPrefetchAhead, panel_bytes);
        }
        const I raw = V::template load_codes<NP>(w, panel_bytes);
        const I lo = V::and_(raw, low4), hi = V::high_nibbles(raw);
        for (int i = 0; i < MR; ++i) {
          acc[i] = V::dpbusd(acc[i], lo, V::bcast4(xq[i] + kk));
          acc2[i] = V::dpbusd(acc2[i], hi, V::bcast4(xq[i] + kk + 4));
        }
      }
    } else {
      for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // two chunks: 8 k
        if constexpr (PREFETCH) V::template prefetch<NP>(w + V::kPrefetchAhead, panel_bytes);
        const I c0 = V::template load_codes<NP>(w, panel_bytes), c1 = V::template load_codes<NP>(w + 32, panel_bytes);
        for (int i = 0; i < MR; ++i) {
          acc[i] = V::dpbusd(acc[i], c0, V::bcast4(xq[i] + kk));
          acc2[i] = V::dpbusd(acc2[i], c1, V::bcast4(xq[i] + kk + 4));
        }
      }
    }
    for (int i = 0; i < MR; ++i) acc[i] = V::add32(acc[i], acc2[i]);
  }
};

// ---------------------------------------------------------------------------------------------
// Row tiles over the packed panels: MR activation rows x NP panels (one register of V per row),
// all blocks. Dot::block_dot adds the block's integer sums of x * (code - code_shift) to acc.

template <class V, class Dot, int BITS, int MR, int NP, bool PREFETCH>
void panel_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  using F = typename V::F;
  const WeightGeometry& g = *a.w;
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  const int8_t* xq[MR];
  const float* sx = a.act.scale + m * g.nblocks;
  const float* sxsum = a.act.scaled_sum + m * g.nblocks;
  const int32_t* zsum = a.act.shifted_sum + m * g.nblocks;
  F y[MR];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.act.q + (m + i) * a.act.ldq;
    y[i] = V::fzero();
  }
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    typename V::I acc[MR];  // from the row's shifted sum: acc + shifted_sum without an addition
    for (int i = 0; i < MR; ++i) acc[i] = V::set1_32(zsum[i * g.nblocks + b]);
    Dot::template block_dot<BITS, MR, NP, PREFETCH>(block, g.panel_bytes, g.block, xq, acc);
    const F scale = V::template load_halves<NP>(block + g.code_bytes, g.panel_bytes);
    // per row: y += (s_x * scale) * float(acc + shifted_sum), then (asymmetric) y += offset * scaled_sum
    const auto scaled = [&](int i) {
      const int64_t at = i * g.nblocks + b;
      y[i] = V::fmadd(V::cvt(acc[i]), V::mul(scale, V::bcast(sx + at)), y[i]);
      xq[i] += g.block;
    };
    if (g.symmetric) {
      for (int i = 0; i < MR; ++i) scaled(i);
    } else {
      const F offset = V::template load_halves<NP>(block + g.code_bytes + 16, g.panel_bytes);
      for (int i = 0; i < MR; ++i) {
        scaled(i);
        y[i] = V::fmadd(offset, V::bcast(sxsum + i * g.nblocks + b), y[i]);
      }
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8 * NP, g.n - n0);
  const float* bias = a.bias ? a.bias + n0 : nullptr;
  const F vbias = V::template load_bias<NP>(bias, rows);
  for (int i = 0; i < MR; ++i) V::template store_rows<NP>(a.y + (m + i) * a.ldy + n0, y[i], vbias, bias, rows);
}

// Rows [m, m + MR) x panels [p0, p1), V::kPanels panels per register (a last odd one alone).
template <class V, class Dot, int BITS, int MR, bool PREFETCH>
inline void panel_row(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  int64_t p = p0;
  if constexpr (V::kPanels == 2)
    for (; p + 2 <= p1; p += 2) panel_tile<V, Dot, BITS, MR, 2, PREFETCH>(a, m, p);
  for (; p < p1; ++p) panel_tile<V, Dot, BITS, MR, 1, PREFETCH>(a, m, p);
}

// GEMV: one row at a time over the panels, weights streamed with prefetch.
template <class V, class Dot, int BITS>
void gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t m = m0; m < m1; ++m) panel_row<V, Dot, BITS, 1, true>(a, m, p0, p1);
}

// A GEMM row tile out of line: inlined into the row loop with its siblings of other heights, its
// registers are allocated worse (the int4 4x8 tile measured 17% slower).
template <class V, class Dot, int BITS, int MR>
[[gnu::noinline]] void panel_row_tile(const Int8MatmulArgs& a, int64_t m, int64_t p0, int64_t p1) {
  panel_row<V, Dot, BITS, MR, true>(a, m, p0, p1);
}

// Small GEMM: rows in chunks whose int8 activations stay in L2 (32 x K bytes) while the panels
// of the range pass over them; a panel (pair) stays in L1 across the chunk's MR-row tiles.
template <class V, class Dot, int BITS, int MR>
void gemm_rows(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t kRowChunk = 32;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; p += V::kPanels) {
      const int64_t pe = std::min(p1, p + V::kPanels);
      for_row_tiles<MR>(mc, mc1, [&](auto rows, int64_t m) { panel_row_tile<V, Dot, BITS, decltype(rows)::value>(a, m, p, pe); });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tiled GEMM (prefill, from a dozen rows): bound by vector ALU operations, not by memory. Each
// block of two panels is prepared once in an L1 buffer (int4 unpacked to int8 chunks, chunk j of
// both panels side by side; int8 read as packed) and every MR-row tile of a row chunk reuses it:
// one activation broadcast feeds 16 outputs. The float results of the chunk's rows live in an
// L1 tile updated once per block, leaving the registers to the integer sums. TileDot supplies
// mr<NP>() and run<MR, NP, STRIDE>(w[NP], block, xq, acc) over int8 chunks at w[q] + c * STRIDE.

struct BlockFactors {
  __m256 scale[2], offset[2];
};

template <class TileDot, int MR, int NP, int STRIDE>
inline void tiled_block(const Int8MatmulArgs& a, const uint8_t* const* w, const BlockFactors& f,
                        bool add_zsum, int64_t m, int64_t b, float* ytile) {
  const WeightGeometry& g = *a.w;
  const int8_t* xq[MR];
  for (int i = 0; i < MR; ++i) xq[i] = a.act.q + (m + i) * a.act.ldq + b * g.block;
  __m256i acc[MR * NP];
  TileDot::template run<MR, NP, STRIDE>(w, g.block, xq, acc);
  for (int i = 0; i < MR; ++i) {
    const int64_t at = (m + i) * g.nblocks + b;
    const __m256 sx = _mm256_broadcast_ss(a.act.scale + at);
    const __m256i zsum = _mm256_set1_epi32(a.act.shifted_sum[at]);
    const __m256 sxsum = _mm256_broadcast_ss(a.act.scaled_sum + at);
    for (int q = 0; q < NP; ++q) {
      float* yq = ytile + 8 * (i * NP + q);
      const __m256i acc_q = add_zsum ? _mm256_add_epi32(acc[i * NP + q], zsum) : acc[i * NP + q];
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc_q), _mm256_mul_ps(f.scale[q], sx), _mm256_load_ps(yq));
      if (!g.symmetric) y = _mm256_fmadd_ps(f.offset[q], sxsum, y);
      _mm256_store_ps(yq, y);
    }
  }
}

// Rows [mc, mc1) x panels [p, p + NP): the results in ytile ([rows][8 * NP]).
template <class TileDot, int BITS, int NP>
void tiled_panels(const Int8MatmulArgs& a, int64_t mc, int64_t mc1, int64_t p, int8_t* wbuf, float* ytile) {
  const WeightGeometry& g = *a.w;
  constexpr int MR = TileDot::template mr<NP>();
  constexpr int STRIDE = BITS == 4 ? 32 * NP : 32;  // unpacked chunks interleave the panels
  // shifted_sum is zero for asymmetric weights whose codes are used as stored
  const bool add_zsum = g.symmetric || TileDot::code_shift(BITS) != 0;
  std::fill(ytile, ytile + (mc1 - mc) * 8 * NP, 0.f);
  for (int64_t b = 0; b < g.nblocks; ++b) {
    BlockFactors f;
    const uint8_t* w[NP];
    for (int q = 0; q < NP; ++q) {
      const uint8_t* block = a.packed + (p + q) * g.panel_bytes + b * g.block_bytes;
      if constexpr (BITS == 4) {
        unpack_int4_block(block, g.code_bytes, wbuf + 32 * q, 32 * NP);
        w[q] = reinterpret_cast<const uint8_t*>(wbuf) + 32 * q;
      } else {
        w[q] = block;
      }
      f.scale[q] = Ymm::load_halves(block + g.code_bytes);
      f.offset[q] = g.symmetric ? _mm256_setzero_ps() : Ymm::load_halves(block + g.code_bytes + 16);
    }
    for_row_tiles<MR>(mc, mc1, [&](auto rows, int64_t m) {
      tiled_block<TileDot, decltype(rows)::value, NP, STRIDE>(a, w, f, add_zsum, m, b, ytile + (m - mc) * 8 * NP);
    });
  }
}

// Rows in chunks of `row_chunk` (<= 96) whose int8 activations stay in L2, panels two at a time
// (an odd last one alone); each chunk x panels result goes from the L1 tile to y, with the bias.
template <class TileDot, int BITS>
void gemm_tiled(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  constexpr int64_t kMr = TileDot::template mr<2>(), kMaxRowChunk = 96;
  // rows x K bytes of activations in about half of L2, a multiple of the tile height
  const int64_t row_chunk = std::clamp<int64_t>((196608 / g.padded_k()) / kMr * kMr, 24, kMaxRowChunk);
  alignas(64) float ytile[kMaxRowChunk * 16];
  alignas(64) int8_t wbuf[2 * 8 * 256];  // one prepared block of two panels (block <= 256)
  for (int64_t mc = m0; mc < m1; mc += row_chunk) {
    const int64_t mc1 = std::min(m1, mc + row_chunk);
    for (int64_t p = p0; p < p1;) {
      const int np = p + 2 <= p1 ? 2 : 1;
      if (np == 2) tiled_panels<TileDot, BITS, 2>(a, mc, mc1, p, wbuf, ytile);
      else tiled_panels<TileDot, BITS, 1>(a, mc, mc1, p, wbuf, ytile);
      for (int q = 0; q < np; ++q, ++p) {
        const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
        const float* bias = a.bias ? a.bias + n0 : nullptr;
        const __m256 vbias = Ymm::load_bias<1>(bias, rows);
        for (int64_t m = mc; m < mc1; ++m)
          Ymm::store_rows<1>(a.y + m * a.ldy + n0, _mm256_load_ps(ytile + (m - mc) * 8 * np + 8 * q), vbias, bias, rows);
      }
    }
  }
}

// VPDPBUSD tile dot product (ymm): one VPDPBUSD per 32 multiply-adds and nothing else in the
// inner loop; V supplies dpbusd.
template <class V, int MR_ONE_PANEL, int MR_TWO_PANELS>
struct DpbusdTileDot {
  template <int NP>
  static constexpr int mr() { return NP == 2 ? MR_TWO_PANELS : MR_ONE_PANEL; }
  static constexpr int32_t code_shift(int /*bits*/) { return 0; }

  template <int MR, int NP, int STRIDE>
  static void run(const uint8_t* const* w, int64_t block, const int8_t* const* xq, __m256i* acc) {
    for (int i = 0; i < MR * NP; ++i) acc[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int64_t kk = 0, off = 0; kk < block; kk += 4, off += STRIDE) {
      __m256i wc[NP];
      for (int q = 0; q < NP; ++q) wc[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[q] + off));
      for (int i = 0; i < MR; ++i) {
        const __m256i x4 = Ymm::bcast4(xq[i] + kk);
        for (int q = 0; q < NP; ++q) acc[i * NP + q] = V::dpbusd(acc[i * NP + q], wc[q], x4);
      }
    }
  }
};

}  // namespace
}  // namespace qlinear::x86
