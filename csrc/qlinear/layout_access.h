// Element-wise access to the codes of one packed block, for any layout of layout.h. Used by
// unpacking and the scalar kernels (the oracle), never by SIMD kernels.
#pragma once

#include <cstdint>

#include "layout.h"

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

}  // namespace qlinear
