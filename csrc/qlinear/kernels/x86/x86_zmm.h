// Vector traits of the AVX-512 levels (avx512vnni, amx) for x86_common.h's kernel bodies. Zmm: one
// zmm holds the same 32-byte chunk of two consecutive panels (16 output rows x 4 k per 32-bit
// lane: panel p in the low half, p + 1 in the high half; an odd last panel runs with a zero high
// half). YmmEvex: the AVX2 level's one panel per ymm, with AVX512-VL's VPDPBUSD.
// Include only from files compiled with AVX-512F/BW/VL + AVX512-VNNI (or emulated: x86_simd.h).
#pragma once

#include "qlinear/kernels/x86/x86_common.h"

namespace qlinear::x86 {
namespace {

struct Zmm {
  using I = __m512i;
  using F = __m512;
  static constexpr int kPanels = 2;
  // bytes ahead in each of the two panels' streams. Zen 4, a decode step of 8 sequences of a
  // 0.5B model: 2048 -> 4096 10% faster, 4096 -> 8192 7% faster again (13.2 -> 12.2 ms; 6144 to
  // 16384 within 2% of each other)
  static constexpr int64_t kPrefetchAhead = kWeightPrefetchAhead;

  static I zero() { return _mm512_setzero_si512(); }
  static F fzero() { return _mm512_setzero_ps(); }
  static I set1_8(char v) { return _mm512_set1_epi8(v); }
  static I set1_32(int32_t v) { return _mm512_set1_epi32(v); }
  static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  static I and_(I a, I b) { return _mm512_and_si512(a, b); }
  static I high_nibbles(I v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
  static I dpbusd(I acc, I a, I b) { return _mm512_dpbusd_epi32(acc, a, b); }
  static I dpbusd_x(I acc, I codes, const int8_t* x);
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static I bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  // The same 32 bytes of panels p (at w) and p + 1 (at w + panel_bytes), or of p alone (NP == 1).
  template <int NP>
  static I load_codes(const uint8_t* w, int64_t panel_bytes) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    if constexpr (NP == 2) {
      return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + panel_bytes)), 1);
    } else {
      return _mm512_zextsi256_si512(lo);
    }
  }
  template <int NP>
  static void prefetch(const uint8_t* p, int64_t panel_bytes) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
    if constexpr (NP == 2) _mm_prefetch(reinterpret_cast<const char*>(p) + panel_bytes, _MM_HINT_T0);
  }
  // 16 fp16 values: 8 at p (panel p) and 8 at p + panel_bytes (panel p + 1, or zeros).
  template <int NP>
  static F load_halves(const uint8_t* p, int64_t panel_bytes) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = NP == 2 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + panel_bytes))
                               : _mm_setzero_si128();
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static __mmask16 row_mask(int64_t rows) { return static_cast<__mmask16>((1u << rows) - 1); }
  template <int NP>
  static F load_bias(const float* bias, int64_t rows) {
    return bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(row_mask(rows), bias);
  }
  template <int NP>
  static void store_rows(float* out, F y, F vbias, const float*, int64_t rows) {
    _mm512_mask_storeu_ps(out, row_mask(rows), _mm512_add_ps(y, vbias));
  }
};

// ymm with AVX512-VL's VPDPBUSD (EVEX-encoded: its activation operand can be a memory broadcast).
struct YmmEvex : Ymm {
  static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_epi32(acc, a, b); }
  static __m256i dpbusd_x(__m256i acc, __m256i codes, const int8_t* x);
};

// acc += codes x (the 4 activation bytes at x in every 32-bit lane): VPDPBUSD with its broadcast
// memory operand ({1to16} / {1to8}), which compilers do not fold from the intrinsics.
template <class V>
inline typename V::I dpbusd_broadcast(typename V::I acc, typename V::I codes, const int8_t* x) {
#ifdef QLINEAR_EMULATE_X86
  return V::dpbusd(acc, codes, V::bcast4(x));
#else
  const auto& bytes = *reinterpret_cast<const int32_t*>(x);
  if constexpr (std::is_same_v<typename V::I, __m512i>)
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(bytes));
  else
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(codes), "m"(bytes));
  return acc;
#endif
}

inline __m512i Zmm::dpbusd_x(__m512i acc, __m512i codes, const int8_t* x) {
  return dpbusd_broadcast<Zmm>(acc, codes, x);
}
inline __m256i YmmEvex::dpbusd_x(__m256i acc, __m256i codes, const int8_t* x) {
  return dpbusd_broadcast<YmmEvex>(acc, codes, x);
}

}  // namespace
}  // namespace qlinear::x86
