// Element-wise access to the codes of one packed block, for any layout of layout.h. Used by
// unpacking and the scalar kernels (the oracle); SIMD kernels take only kKr8Gather from here.
#pragma once

#include <cstdint>

#include "qlinear/core/layout.h"

namespace qlinear {

struct CodeAddress { int64_t byte; int shift; };  // shift 0: low nibble / whole byte, 4: high

inline CodeAddress code_address(int bits, int nr, int kr, int r, int64_t kk) {
  if (bits == 8) return {(kk / kr) * nr * kr + r * kr + kk % kr, 0};
  const int64_t chunk = kk / (2 * kr), within = kk % (2 * kr);
  return {chunk * nr * kr + r * kr + within % kr, within < kr ? 0 : 4};
}

// The code (0..15 / 0..255: q, or q + zero_point for symmetric weights) of row r, k = kk of a
// block of g, whatever the layout stores (nr8_kr4_s8: int8 codes flipped).
inline int read_code(const WeightGeometry& g, const uint8_t* codes, int r, int64_t kk) {
  const CodeAddress a = code_address(g.bits, g.nr, g.kr, r, kk);
  return g.bits == 8 ? codes[a.byte] ^ g.code_xor : (codes[a.byte] >> a.shift) & 0xF;
}

// Table-lookup indices (TBL over a 64-byte chunk of an int8 nr8_kr8_s8 block: 8 rows x 8 k, row r's
// k at byte 16 (r / 2) + 8 (r % 2) + k) gathering k = 2t and 2t + 1 of rows 0..7 in order.
alignas(16) inline constexpr uint8_t kKr8Gather[4][16] = {
    {0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57},
    {2, 10, 18, 26, 34, 42, 50, 58, 3, 11, 19, 27, 35, 43, 51, 59},
    {4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29, 37, 45, 53, 61},
    {6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63}};

}  // namespace qlinear
