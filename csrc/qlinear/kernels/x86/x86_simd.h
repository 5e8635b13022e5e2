// The x86 intrinsics of the levels beyond AVX2 (avxvnni, avx512vnni, amx), for their kernel files.
//
// Normally this is <immintrin.h>: the kernels are compiled with their level's flags and run the
// real instructions. With QLINEAR_EMULATE_X86 defined (CMake option QLINEAR_EMULATE_X86, the
// files then compiled with -mavx2 -mfma -mf16c only), it also provides our own implementations of
// exactly the intrinsics those kernels use, built from AVX2 / FMA / F16C operations and plain C++
// following Intel's documented semantics, so that the kernels run (slowly, but bit-exactly) on
// any AVX2 CPU and the test suite checks them there. The emulated names live in namespace
// qlinear::x86emu, made visible in namespace qlinear: inside qlinear they hide the real
// declarations of <immintrin.h> (which stay uncallable: their types differ from ours, so a
// missing emulation is a compile error, not a SIGILL). GCC defines some of these intrinsics as
// macros (the tile ones always, others without optimization): they are #undef'd here.
#pragma once

#include <immintrin.h>

#ifdef QLINEAR_EMULATE_X86

#include <cstdint>
#include <cstring>

#undef _mm512_srli_epi16
#undef _mm512_inserti64x4
#undef _mm512_dpbusd_epi32
#undef _mm256_dpbusd_avx_epi32
#undef _mm256_dpbusd_epi32
#undef _tile_loadconfig
#undef _tile_release
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbsud

namespace qlinear {
namespace x86emu {

// ---------------------------------------------------------------------------------------------
// VPDPBUSD: per 32-bit lane, acc += u8(a.byte[0]) * s8(b.byte[0]) + ... + u8(a.byte[3]) * s8(b.byte[3]),
// the four products summed in full precision and added to acc with wrap-around (no saturation).
// Here: bytes 0 and 2 (even) and 1 and 3 (odd) widened to 16 bits (u8 zero-extended, s8
// sign-extended); VPMADDWD sums each pair of products exactly (|pair| <= 2 * 255 * 128 < 2^31).
inline __m256i dpbusd_epi32_256(__m256i acc, __m256i a, __m256i b) {
  const __m256i low8 = _mm256_set1_epi16(0x00FF);
  const __m256i a_even = _mm256_and_si256(a, low8), a_odd = _mm256_srli_epi16(a, 8);
  const __m256i b_even = _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8), b_odd = _mm256_srai_epi16(b, 8);
  const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(a_even, b_even), _mm256_madd_epi16(a_odd, b_odd));
  return _mm256_add_epi32(acc, sum);
}

// AVX-VNNI (VEX-encoded VPDPBUSD on ymm).
inline __m256i _mm256_dpbusd_avx_epi32(__m256i acc, __m256i a, __m256i b) { return dpbusd_epi32_256(acc, a, b); }
// AVX512-VNNI + VL (EVEX-encoded VPDPBUSD on ymm): the same operation.
inline __m256i _mm256_dpbusd_epi32(__m256i acc, __m256i a, __m256i b) { return dpbusd_epi32_256(acc, a, b); }

// ---------------------------------------------------------------------------------------------
// AVX-512: a 512-bit register as two 256-bit halves (lo = bits 0..255, elements 0..7 of 32 bits).
struct __m512i { __m256i lo, hi; };
struct __m512 { __m256 lo, hi; };
using __mmask16 = uint16_t;

inline __m512i _mm512_setzero_si512() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline __m512i _mm512_set1_epi32(int v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
inline __m512i _mm512_set1_epi8(char v) { return {_mm256_set1_epi8(v), _mm256_set1_epi8(v)}; }
inline __m512i _mm512_loadu_si512(const void* p) {
  const auto* b = static_cast<const char*>(p);
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32))};
}
inline void _mm512_storeu_si512(void* p, __m512i v) {
  auto* b = static_cast<char*>(p);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b), v.lo);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(b + 32), v.hi);
}
// The upper half of a cast is undefined: zero here.
inline __m512i _mm512_castsi256_si512(__m256i v) { return {v, _mm256_setzero_si256()}; }
inline __m512i _mm512_zextsi256_si512(__m256i v) { return {v, _mm256_setzero_si256()}; }
inline __m512i _mm512_inserti64x4(__m512i a, __m256i b, int imm) {
  if (imm & 1) a.hi = b; else a.lo = b;
  return a;
}
inline __m256i _mm512_castsi512_si256(__m512i v) { return v.lo; }
inline __m256i _mm512_extracti64x4_epi64(__m512i v, int imm) { return (imm & 1) ? v.hi : v.lo; }
inline __m512i _mm512_and_si512(__m512i a, __m512i b) {
  return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)};
}
inline __m512i _mm512_srli_epi16(__m512i a, unsigned int imm) {
  const __m128i n = _mm_cvtsi32_si128(static_cast<int>(imm));  // counts > 15 give zero, as VPSRLW
  return {_mm256_srl_epi16(a.lo, n), _mm256_srl_epi16(a.hi, n)};
}
inline __m512i _mm512_add_epi32(__m512i a, __m512i b) {
  return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)};
}
inline __m512i _mm512_dpbusd_epi32(__m512i acc, __m512i a, __m512i b) {
  return {dpbusd_epi32_256(acc.lo, a.lo, b.lo), dpbusd_epi32_256(acc.hi, a.hi, b.hi)};
}

inline __m512 _mm512_setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline __m512 _mm512_set1_ps(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline __m512 _mm512_loadu_ps(const void* p) {
  const auto* f = static_cast<const float*>(p);
  return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
inline void _mm512_storeu_ps(void* p, __m512 v) {
  auto* f = static_cast<float*>(p);
  _mm256_storeu_ps(f, v.lo);
  _mm256_storeu_ps(f + 8, v.hi);
}
// Masked loads and stores touch only the selected elements (no fault past an array's end).
inline __m512 _mm512_maskz_loadu_ps(__mmask16 k, const void* p) {
  alignas(32) float t[16] = {};
  const auto* f = static_cast<const float*>(p);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) t[i] = f[i];
  return {_mm256_load_ps(t), _mm256_load_ps(t + 8)};
}
inline void _mm512_mask_storeu_ps(void* p, __mmask16 k, __m512 v) {
  alignas(32) float t[16];
  _mm256_store_ps(t, v.lo);
  _mm256_store_ps(t + 8, v.hi);
  auto* f = static_cast<float*>(p);
  for (int i = 0; i < 16; ++i)
    if (k >> i & 1) f[i] = t[i];
}
inline __m512 _mm512_add_ps(__m512 a, __m512 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline __m512 _mm512_mul_ps(__m512 a, __m512 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline __m512 _mm512_cvtepi32_ps(__m512i a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline __m512 _mm512_cvtph_ps(__m256i h) {
  return {_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1))};
}

// ---------------------------------------------------------------------------------------------
// AMX: eight tile registers of up to 16 rows x 64 bytes and the tile configuration, per thread
// (as the architectural state is). Palette 1 only; rows and bytes per row come from the last
// _tile_loadconfig. Loads zero the bytes past a tile's configured width; a tile instruction on
// an unconfigured state is a program error here (it would fault on the hardware): it aborts.
struct TileState {
  bool configured = false;
  uint8_t rows[8] = {};
  uint16_t colsb[8] = {};
  alignas(64) uint8_t data[8][16][64] = {};
};
inline TileState& tile_state() {
  static thread_local TileState s;
  return s;
}
inline TileState& configured_tiles() {
  TileState& s = tile_state();
  if (!s.configured) __builtin_trap();
  return s;
}

// The 64-byte configuration: palette_id, start_row, 14 reserved, colsb[16] (u16), rows[16] (u8).
inline void _tile_loadconfig(const void* config) {
  const auto* c = static_cast<const uint8_t*>(config);
  TileState& s = tile_state();
  // As LDTILECFG's #GP checks: palette 1, start_row 0, reserved bytes zero, tiles 8..15 unused.
  if (c[0] != 1) __builtin_trap();
  for (int i = 1; i < 16; ++i)
    if (c[i] != 0) __builtin_trap();
  for (int i = 16 + 2 * 8; i < 48; ++i)
    if (c[i] != 0) __builtin_trap();
  for (int i = 48 + 8; i < 64; ++i)
    if (c[i] != 0) __builtin_trap();
  for (int t = 0; t < 8; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    s.rows[t] = c[48 + t];
    s.colsb[t] = colsb;
    if (s.rows[t] > 16 || s.colsb[t] > 64 || (s.rows[t] == 0) != (s.colsb[t] == 0)) __builtin_trap();
  }
  std::memset(s.data, 0, sizeof(s.data));
  s.configured = true;
}
inline void _tile_release() {
  TileState& s = tile_state();
  s.configured = false;
  std::memset(s.data, 0, sizeof(s.data));
}
// A tile the configuration leaves empty (0 rows) must not be used.
inline TileState& configured_tile(int t) {
  TileState& s = configured_tiles();
  if (t < 0 || t > 7 || s.rows[t] == 0) __builtin_trap();
  return s;
}
inline void _tile_zero(int t) { std::memset(configured_tile(t).data[t], 0, sizeof(TileState::data[0])); }
inline void _tile_loadd(int t, const void* base, long stride) {
  TileState& s = configured_tile(t);
  std::memset(s.data[t], 0, sizeof(s.data[t]));
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(s.data[t][r], static_cast<const uint8_t*>(base) + r * stride, s.colsb[t]);
}
inline void _tile_stream_loadd(int t, const void* base, long stride) { _tile_loadd(t, base, stride); }
inline void _tile_stored(int t, void* base, long stride) {
  TileState& s = configured_tile(t);
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[t][r], s.colsb[t]);
}
// TDPBSUD: dst[m][n] (int32) += sum over k of s8(a[m][4k + i]) * u8(b[k][4n + i]), i = 0..3;
// rows(dst) = rows(a), colsb(dst) = colsb(b), colsb(a) = 4 * rows(b). Wrap-around int32 adds.
inline void _tile_dpbsud(int dst, int a, int b) {
  TileState& s = configured_tile(dst);
  configured_tile(a);
  configured_tile(b);
  const int m_rows = s.rows[dst], n_cols = s.colsb[dst] / 4, k_quads = s.colsb[a] / 4;
  if (s.rows[a] != m_rows || s.colsb[b] != s.colsb[dst] || s.rows[b] != k_quads) __builtin_trap();
  for (int m = 0; m < m_rows; ++m) {
    for (int n = 0; n < n_cols; ++n) {
      int32_t c;
      std::memcpy(&c, s.data[dst][m] + 4 * n, 4);
      uint32_t acc = static_cast<uint32_t>(c);
      for (int k = 0; k < k_quads; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<uint32_t>(int32_t(static_cast<int8_t>(s.data[a][m][4 * k + i])) *
                                       int32_t(s.data[b][k][4 * n + i]));
      c = static_cast<int32_t>(acc);
      std::memcpy(s.data[dst][m] + 4 * n, &c, 4);
    }
  }
}

}  // namespace x86emu

using namespace x86emu;

}  // namespace qlinear

#endif  // QLINEAR_EMULATE_X86
