// AMX-INT8 GEMM over the nr8_kr4 layout (compiled with the avx512vnni flags plus -mamx-tile
// -mamx-int8 in this file only; dispatch calls it only on CPUs that report AMX-TILE + AMX-INT8,
// the OS's tile state in XCR0, and after Linux granted this process the tile data state). GEMV
// (M = 1), rows that do not fill a 16-row tile (the driver gives them to the next kernel that
// serves them), activation quantization and the float path are the avx512vnni / AVX2 levels'.
//
// TDPBSUD multiplies a signed A tile (activations: 16 rows x up to 64 k of int8) by an unsigned
// B tile in VNNI form (one B row per k-quad, 4 bytes per output column) into int32 C tiles
// (16 rows x 8 columns here). A block's int8 chunks of one panel (8 rows x 4 k per 32-byte chunk,
// layout.h) are exactly such B rows: a B tile is 16 (or 8) consecutive chunks, stride 32 bytes,
// read straight from the packed weight. int4 blocks are first unpacked to int8 codes 0..15 in the
// same chunk order into an L1 buffer (an int4 chunk's low nibbles are k 0..3 of its 8-k span,
// its high nibbles k 4..7: int8 chunks 2c and 2c + 1). Codes are used unsigned (code_shift 0).
//
// Tiles: 0, 1 = A (rows m..m+15, m+16..m+31), 2, 3 = B (panels p, p + 1), 4..7 = C
// (4 + 2 * row tile + panel). Per block, the C tiles are stored to a buffer and the float epilogue
// runs on zmm registers exactly as the avx512vnni kernels' (same operations, same order).
#include "qlinear/kernels/x86/x86_zmm.h"

#include <algorithm>
#include <cstring>

namespace qlinear {
namespace {

// GCC's tile intrinsics are asm statements that do not tell the compiler which memory they read
// (_tile_loadconfig even claims to read only 8 bytes): without this barrier before them, stores
// that fill the configuration or the unpacked int4 buffer may be dropped or moved past them.
inline void compiler_barrier() { __asm__ volatile("" ::: "memory"); }

struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "the tile configuration is 64 bytes");

// kstep = k per tile step: 64 (A row = 64 bytes, B = 16 chunks) or 32 for blocks of 32 + 64j.
void configure_tiles(int kstep) {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 2; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = static_cast<uint16_t>(kstep); }       // A
  for (int t = 2; t < 4; ++t) { cfg.rows[t] = static_cast<uint8_t>(kstep / 4); cfg.colsb[t] = 32; }  // B
  for (int t = 4; t < 8; ++t) { cfg.rows[t] = 16; cfg.colsb[t] = 32; }                               // C
  compiler_barrier();
  _tile_loadconfig(&cfg);
}

// The int32 sums of one block for MT x 16 activation rows (at x, row stride ldq) and NP panels
// (int8 codes at w0, w1), stored to c: row i at c + 16 * i, panel j in columns 8j..8j+7.
template <int MT, int NP>
inline void block_tiles(const int8_t* x, int64_t ldq, const uint8_t* w0, const uint8_t* w1,
                        int64_t block, int kstep, int32_t* c) {
  _tile_zero(4);
  if constexpr (NP == 2) _tile_zero(5);
  if constexpr (MT == 2) {
    _tile_zero(6);
    if constexpr (NP == 2) _tile_zero(7);
  }
  compiler_barrier();
  for (int64_t ks = 0; ks < block; ks += kstep) {
    _tile_loadd(2, w0 + 8 * ks, 32);  // chunk ks / 4 onwards: k ks..ks+kstep-1, 32 bytes each
    if constexpr (NP == 2) _tile_loadd(3, w1 + 8 * ks, 32);
    _tile_loadd(0, x + ks, ldq);
    _tile_dpbsud(4, 0, 2);
    if constexpr (NP == 2) _tile_dpbsud(5, 0, 3);
    if constexpr (MT == 2) {
      _tile_loadd(1, x + 16 * ldq + ks, ldq);
      _tile_dpbsud(6, 1, 2);
      if constexpr (NP == 2) _tile_dpbsud(7, 1, 3);
    }
  }
  _tile_stored(4, c, 64);
  if constexpr (NP == 2) _tile_stored(5, c + 8, 64);
  if constexpr (MT == 2) {
    _tile_stored(6, c + 256, 64);
    if constexpr (NP == 2) _tile_stored(7, c + 256 + 8, 64);
  }
}

constexpr int64_t kRowChunk = 128;  // rows whose float sums stay in a buffer across a panel pair

// Rows [m0, m1) (m1 - m0 a multiple of 16, at most kRowChunk) x panels [p, p + NP).
template <int BITS, int NP>
void panel_rows(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p, int kstep) {
  const WeightGeometry& g = *a.w;
  alignas(64) float ybuf[kRowChunk * 16];
  alignas(64) int32_t cbuf[32 * 16];
  alignas(64) uint8_t wbuf[2][256 * 8];
  std::memset(ybuf, 0, sizeof(float) * 16 * (m1 - m0));
  std::memset(cbuf, 0, sizeof(cbuf));  // columns 8..15 stay zero for a single panel
  const uint8_t* panel = a.packed + p * g.panel_bytes;
  for (int64_t b = 0; b < g.nblocks; ++b) {
    const uint8_t* block = panel + b * g.block_bytes;
    const uint8_t* w0 = block;
    const uint8_t* w1 = NP == 2 ? block + g.panel_bytes : block;
    if constexpr (BITS == 4) {
      // int8 chunks 2c (low nibbles) and 2c + 1 (high): the int8 layout of the block
      x86::unpack_int4_block(w0, g.code_bytes, reinterpret_cast<int8_t*>(wbuf[0]), 32);
      if constexpr (NP == 2) x86::unpack_int4_block(w1, g.code_bytes, reinterpret_cast<int8_t*>(wbuf[1]), 32);
      w0 = wbuf[0];
      w1 = wbuf[1];
      compiler_barrier();  // the tile loads read wbuf
    }
    const __m512 scale = x86::Zmm::load_halves<NP>(block + g.code_bytes, g.panel_bytes);
    const __m512 offset = g.symmetric ? _mm512_setzero_ps() : x86::Zmm::load_halves<NP>(block + g.code_bytes + 16, g.panel_bytes);
    for (int64_t m = m0; m < m1;) {
      const int mt = m1 - m >= 32 ? 2 : 1;
      const int8_t* x = a.act.q + m * a.act.ldq + b * g.block;
      if (mt == 2) block_tiles<2, NP>(x, a.act.ldq, w0, w1, g.block, kstep, cbuf);
      else block_tiles<1, NP>(x, a.act.ldq, w0, w1, g.block, kstep, cbuf);
      for (int i = 0; i < 16 * mt; ++i) {
        const int64_t at = (m + i) * g.nblocks + b;
        float* yr = ybuf + 16 * (m + i - m0);
        const __m512i acc_q = _mm512_add_epi32(_mm512_loadu_si512(cbuf + 16 * i), _mm512_set1_epi32(a.act.shifted_sum[at]));
        __m512 y = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc_q), _mm512_mul_ps(scale, _mm512_set1_ps(a.act.scale[at])),
                                   _mm512_loadu_ps(yr));
        if (!g.symmetric) y = _mm512_fmadd_ps(offset, _mm512_set1_ps(a.act.scaled_sum[at]), y);
        _mm512_storeu_ps(yr, y);
      }
      m += 16 * mt;
    }
  }
  const int64_t n0 = p * 8, rows = std::min<int64_t>(8 * NP, g.n - n0);
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 bias = a.bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, a.bias + n0);
  for (int64_t m = m0; m < m1; ++m)
    _mm512_mask_storeu_ps(a.y + m * a.ldy + n0, mask, _mm512_add_ps(_mm512_loadu_ps(ybuf + 16 * (m - m0)), bias));
}

// Rows [m0, m1), a multiple of 16 (the descriptor's m_unit).
template <int BITS>
void gemm(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& g = *a.w;
  const int kstep = g.block % 64 == 0 ? 64 : 32;
  configure_tiles(kstep);
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    int64_t p = p0;
    for (; p + 2 <= p1; p += 2) panel_rows<BITS, 2>(a, mc, mc1, p, kstep);
    if (p < p1) panel_rows<BITS, 1>(a, mc, mc1, p, kstep);
  }
  _tile_release();
}

}  // namespace

const KernelTable& amx_kernels() {
  using x86::ukernel;
  using Dot = x86::DpbusdDot<x86::Zmm>;  // TDPBSUD reads the codes as stored, as VPDPBUSD
  static const KernelTable table = [] {
    KernelTable t = avx512vnni_kernels();  // GEMV, row tails, activation quantization, float path
    t.isa = Isa::amx;
    t.int8.insert(t.int8.begin(), {
        ukernel<Dot>("gemm_w4a8_nr8_kr4_32x16_amx", gemm<4>, 4, 32, 2, 16, INT64_MAX, 16),
        ukernel<Dot>("gemm_w8a8_nr8_kr4_32x16_amx", gemm<8>, 8, 32, 2, 16, INT64_MAX, 16),
    });
    return t;
  }();
  return table;
}

}  // namespace qlinear
