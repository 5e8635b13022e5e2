// AVX-VNNI kernels over the nr8_kr4 layout (compiled with -mavx2 -mfma -mf16c -mavxvnni in this
// file only; dispatch calls them only on CPUs that report AVX-VNNI besides AVX2 + FMA + F16C).
// Activation quantization and the float path are the AVX2 level's.
//
// The AVX2 kernels with VPMADDUBSW + VPMADDWD replaced by the VEX-encoded VPDPBUSD, per 32-byte
// chunk of one panel (8 output rows x 4 k per 32-bit lane): the unsigned codes times 4 activation
// bytes broadcast to every lane, the 4 products added to int32 lanes exactly, so no s16 limit:
//   int4: one VPDPBUSD per nibble half (k 0..3 and 4..7 of the chunk's 8-k span);
//   int8: the stored codes 0..255 directly (code_shift 0: shifted_sum = -zero_point * sum).
// Float epilogue per block (8 rows at once), as the AVX2 level:
//   y += (s_x * scale) * (acc + shifted_sum) (+ (s_x * sum_x) * offset).
// GEMV and GEMMs under 12 rows run 4 x 8 row tiles over the packed panels; larger GEMMs 6 x 16
// tiles over blocks of two panels (gemm_tiled below).
#include "x86_simd.h"

#include <algorithm>
#include <cstring>

#include "../kernels.h"
#include "avx2.h"

namespace qlinear {
namespace {

using avx2::bcast4;

// Sum over one block of x * code for MR activation rows and one panel. Two accumulators per row
// (low / high nibbles, or even / odd chunks) halve the VPDPBUSD dependency chains.
template <int BITS, int MR, bool PREFETCH>
inline void block_dot(const uint8_t* w, int64_t block, const int8_t* const* xq, __m256i* acc) {
  __m256i acc2[MR];
  for (int i = 0; i < MR; ++i) acc[i] = acc2[i] = _mm256_setzero_si256();
  if constexpr (BITS == 4) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int64_t kk = 0; kk < block; kk += 8, w += 32) {  // a chunk: 8 k
      if constexpr (PREFETCH) {
        if ((kk & 15) == 0) _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
      }
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
      const __m256i lo = _mm256_and_si256(raw, low4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm256_dpbusd_avx_epi32(acc[i], lo, bcast4(xq[i] + kk));
        acc2[i] = _mm256_dpbusd_avx_epi32(acc2[i], hi, bcast4(xq[i] + kk + 4));
      }
    }
  } else {
    for (int64_t kk = 0; kk < block; kk += 8, w += 64) {  // two chunks: 8 k
      if constexpr (PREFETCH) _mm_prefetch(reinterpret_cast<const char*>(w) + 2048, _MM_HINT_T0);
      const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
      const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32));
      for (int i = 0; i < MR; ++i) {
        acc[i] = _mm256_dpbusd_avx_epi32(acc[i], c0, bcast4(xq[i] + kk));
        acc2[i] = _mm256_dpbusd_avx_epi32(acc2[i], c1, bcast4(xq[i] + kk + 4));
      }
    }
  }
  for (int i = 0; i < MR; ++i) acc[i] = _mm256_add_epi32(acc[i], acc2[i]);
}

template <int BITS, int MR, bool PREFETCH>
void panel_tile(const Int8MatmulArgs& a, int64_t m, int64_t p) {
  const WeightGeometry& g = *a.w;
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  const int8_t* xq[MR];
  const float* sx = a.act.scale + m * g.nblocks;
  const float* sxsum = a.act.scaled_sum + m * g.nblocks;
  const int32_t* zsum = a.act.shifted_sum + m * g.nblocks;
  __m256 y[MR];
  for (int i = 0; i < MR; ++i) {
    xq[i] = a.act.q + (m + i) * a.act.ldq;
    y[i] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    __m256i acc[MR];
    block_dot<BITS, MR, PREFETCH>(block, g.block, xq, acc);
    const __m256 scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes)));
    for (int i = 0; i < MR; ++i) {
      const int64_t at = i * g.nblocks + b;
      const __m256i acc_q = _mm256_add_epi32(acc[i], _mm256_set1_epi32(zsum[at]));
      y[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc_q), _mm256_mul_ps(scale, _mm256_broadcast_ss(sx + at)), y[i]);
      xq[i] += g.block;
    }
    if (!g.symmetric) {
      const __m256 offset = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes + 16)));
      for (int i = 0; i < MR; ++i)
        y[i] = _mm256_fmadd_ps(offset, _mm256_broadcast_ss(sxsum + i * g.nblocks + b), y[i]);
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8, g.n - n0);
  const __m256 bias = a.bias != nullptr && rows == 8 ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
  for (int i = 0; i < MR; ++i) {
    float* out = a.y + (m + i) * a.ldy + n0;
    if (rows == 8) {
      _mm256_storeu_ps(out, _mm256_add_ps(y[i], bias));
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, y[i]);
      for (int64_t r = 0; r < rows; ++r) out[r] = a.bias ? tmp[r] + a.bias[n0 + r] : tmp[r];
    }
  }
}

template <int BITS>
void gemv(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t p = p0; p < p1; ++p) panel_tile<BITS, 1, true>(a, m, p);
}

// As the AVX2 level: rows in chunks whose int8 activations stay in L2 while every panel of the
// range passes over them; a panel stays in L1 across the chunk's row tiles.
template <int BITS>
void gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  constexpr int64_t kRowChunk = 32;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; ++p) {
      int64_t m = mc;
      for (; m + 4 <= mc1; m += 4) panel_tile<BITS, 4, false>(a, m, p);
      switch (mc1 - m) {
        case 3: panel_tile<BITS, 3, false>(a, m, p); break;
        case 2: panel_tile<BITS, 2, false>(a, m, p); break;
        case 1: panel_tile<BITS, 1, false>(a, m, p); break;
        default: break;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM from 12 rows on (prefill): 6-row x 16-output tiles over a block of two panels, one
// VPDPBUSD per 32 multiply-adds and nothing else in the inner loop: an activation broadcast
// feeds both panels, int8 weights are read from the packed chunks as they are, and int4 blocks
// are unpacked once per row chunk into int8 chunks in L1 (as the AVX2 GEMM). The float results
// of the chunk's rows live in an L1 tile updated once per block; the registers hold the 12
// accumulators, two weight chunks and a broadcast.

// acc[i * NP + q] = sum over one block of xq[i][k] * code[q][n][k]: panel q's int8 chunk c
// (8 rows x 4 k) at w[q] + c * stride.
template <int MR, int NP>
inline void tile_block_dot(const uint8_t* const* w, int64_t stride, int64_t block, const int8_t* const* xq,
                           __m256i* acc) {
  for (int i = 0; i < MR * NP; ++i) acc[i] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int64_t kk = 0, off = 0; kk < block; kk += 4, off += stride) {
    __m256i wc[NP];
    for (int q = 0; q < NP; ++q) wc[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[q] + off));
    for (int i = 0; i < MR; ++i) {
      const __m256i x4 = bcast4(xq[i] + kk);
      for (int q = 0; q < NP; ++q) acc[i * NP + q] = _mm256_dpbusd_avx_epi32(acc[i * NP + q], wc[q], x4);
    }
  }
}

struct BlockFactors {
  __m256 scale[2], offset[2];
};

// One block of an MR-row x NP-panel tile: ytile[i][q] += s_x * scale * (acc + shifted_sum)
// (+ s_x * sum_x * offset); ytile rows hold 8 * NP floats.
template <int MR, int NP>
inline void tile_block(const Int8MatmulArgs& a, const uint8_t* const* w, int64_t stride, const BlockFactors& f,
                       int64_t m, int64_t b, float* ytile) {
  const WeightGeometry& g = *a.w;
  const int8_t* xq[MR];
  for (int i = 0; i < MR; ++i) xq[i] = a.act.q + (m + i) * a.act.ldq + b * g.block;
  __m256i acc[MR * NP];
  tile_block_dot<MR, NP>(w, stride, g.block, xq, acc);
  for (int i = 0; i < MR; ++i) {
    const int64_t at = (m + i) * g.nblocks + b;
    const __m256 sx = _mm256_broadcast_ss(a.act.scale + at);
    const __m256i zsum = _mm256_set1_epi32(a.act.shifted_sum[at]);  // -zero_point * sum_x
    const __m256 sxsum = _mm256_broadcast_ss(a.act.scaled_sum + at);
    for (int q = 0; q < NP; ++q) {
      float* yq = ytile + 8 * (i * NP + q);
      const __m256i acc_q = g.symmetric ? _mm256_add_epi32(acc[i * NP + q], zsum) : acc[i * NP + q];
      __m256 y = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc_q), _mm256_mul_ps(f.scale[q], sx), _mm256_load_ps(yq));
      if (!g.symmetric) y = _mm256_fmadd_ps(f.offset[q], sxsum, y);
      _mm256_store_ps(yq, y);
    }
  }
}

// Rows [mc, mc1) x panels [p, p + NP), results in ytile ([rows][8 * NP]).
template <int BITS, int NP>
void tile_panels(const Int8MatmulArgs& a, int64_t mc, int64_t mc1, int64_t p, int8_t* wbuf, float* ytile) {
  const WeightGeometry& g = *a.w;
  constexpr int MR = 6;
  std::fill(ytile, ytile + (mc1 - mc) * 8 * NP, 0.f);
  for (int64_t b = 0; b < g.nblocks; ++b) {
    BlockFactors f;
    const uint8_t* w[NP];
    for (int q = 0; q < NP; ++q) {
      const uint8_t* block = a.packed + (p + q) * g.panel_bytes + b * g.block_bytes;
      if constexpr (BITS == 4) {
        avx2::unpack_int4_block(block, g.code_bytes, wbuf + 32 * q, 32 * NP);
        w[q] = reinterpret_cast<const uint8_t*>(wbuf) + 32 * q;
      } else {
        w[q] = block;
      }
      f.scale[q] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes)));
      f.offset[q] = g.symmetric ? _mm256_setzero_ps()
          : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + g.code_bytes + 16)));
    }
    const int64_t stride = BITS == 4 ? 32 * NP : 32;
    int64_t m = mc;
    float* yt = ytile;
    for (; m + MR <= mc1; m += MR, yt += MR * 8 * NP) tile_block<MR, NP>(a, w, stride, f, m, b, yt);
    switch (mc1 - m) {
      case 5: tile_block<5, NP>(a, w, stride, f, m, b, yt); break;
      case 4: tile_block<4, NP>(a, w, stride, f, m, b, yt); break;
      case 3: tile_block<3, NP>(a, w, stride, f, m, b, yt); break;
      case 2: tile_block<2, NP>(a, w, stride, f, m, b, yt); break;
      case 1: tile_block<1, NP>(a, w, stride, f, m, b, yt); break;
      default: break;
    }
  }
}

template <int BITS>
void gemm_tiled(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  // Rows whose int8 activations stay in about half of L2 while the panels pass over them.
  const int64_t row_chunk = std::clamp<int64_t>((196608 / a.w->padded_k()) / 6 * 6, 24, 96);
  alignas(64) int8_t wbuf[2 * 8 * 256];  // one unpacked int4 block of two panels (block <= 256)
  avx2::gemm_by_panel_pairs(a, m0, m1, p0, p1, row_chunk,
                            [&](int64_t mc, int64_t mc1, int64_t p, int np, float* ytile) {
                              if (np == 2) tile_panels<BITS, 2>(a, mc, mc1, p, wbuf, ytile);
                              else tile_panels<BITS, 1>(a, mc, mc1, p, wbuf, ytile);
                            });
}

// Below a dozen rows the 4 x 8 row tiles over the packed panels (no unpacking to repay).
template <int BITS>
void gemm_any(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  if (m1 - m0 >= 12) gemm_tiled<BITS>(a, m0, m1, p0, p1);
  else gemm<BITS>(a, m0, m1, p0, p1);
}

}  // namespace

const KernelTable& avxvnni_kernels() {
  static const KernelTable table = [] {
    KernelTable t = avx2_kernels();  // activation quantization and the float path
    t.isa = Isa::avxvnni;
    t.gemv[0] = gemv<4>;
    t.gemv[1] = gemv<8>;
    t.gemv_name[0] = "gemv_w4a8_nr8_kr4_avxvnni";
    t.gemv_name[1] = "gemv_w8a8_nr8_kr4_avxvnni";
    t.gemm[0] = gemm_any<4>;
    t.gemm[1] = gemm_any<8>;
    t.gemm_name[0] = "gemm_w4a8_nr8_kr4_6x16_avxvnni";
    t.gemm_name[1] = "gemm_w8a8_nr8_kr4_6x16_avxvnni";
    t.code_shift[0] = t.code_shift[1] = 0;
    return t;
  }();
  return table;
}

}  // namespace qlinear
