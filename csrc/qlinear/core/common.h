// Small helpers shared by every translation unit: exact fp16 <-> fp32 conversion (round to
// nearest even, as numpy's astype) and the element types the kernels accept.
#pragma once

#include <cstdint>
#include <cstring>

namespace qlinear {

enum class DType : uint8_t { f32 = 0, f16 = 1 };

inline uint32_t bits_of(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float float_of(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// IEEE binary16 -> binary32, exact (subnormals, inf, nan included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));  // inf / nan
  if (exp != 0) return float_of(sign | ((exp + 112) << 23) | (mant << 13));
  if (mant == 0) return float_of(sign);
  // Subnormal half: value = mant * 2^-24; exact in float.
  const float v = float(mant) * 5.9604644775390625e-08f;
  return sign ? -v : v;
}

// binary32 -> binary16 with round-to-nearest-even (overflow -> inf, as F16C and numpy do).
inline uint16_t float_to_half(float f) {
  const uint32_t u = bits_of(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000);
  const uint32_t absu = u & 0x7FFFFFFFu;
  if (absu >= 0x7F800000u)  // inf or nan (keep nan quiet and non-zero)
    return uint16_t(sign | 0x7C00 | (absu > 0x7F800000u ? 0x200 | ((absu >> 13) & 0x3FF) : 0));
  if (absu >= 0x477FF000u) return uint16_t(sign | 0x7C00);  // rounds to >= 65520: inf
  if (absu < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (absu < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to 0)
    const uint32_t exp = absu >> 23;
    const uint32_t mant = (absu & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24 (value = mant * 2^(exp-150), half ulp 2^-24)
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = ((absu - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rem = absu & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return uint16_t(sign | h);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace qlinear
