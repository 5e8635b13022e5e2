// The float path for fp16 activations with FP16 arithmetic (the ARM `fp16` level and above):
// the contract between the NEON kernel (kernels/arm/fp16.cc) and its scalar twin (kernels/scalar/scalar.cc),
// which compute bit-identical results.
//
// fp16 has 11 significant bits and a range of 2^-24 .. 65504: products of real activations and
// weights overflow it (|x| 300 times |w| 300), an fp16 running sum overflows long before that, and
// small products underflow to subnormals. So fp16 is used only where it is safe:
//
//   1. Normalization by powers of two (exact). Per activation row m and storage block b, x is
//      scaled by 2^ex[m,b] so that its block absmax lies in [8, 16) (kActTop = 4: below 2^4);
//      per weight row r and block b, the dequantization constants are scaled by 2^ew[r,b] so that
//      W = max over codes of |w'| = max(|offset'|, |offset' + qmax * scale|) lies in [16, 32)
//      (kWeightTop = 5). Every normalized product is then below 2^9 (x (1 + 2^-11)^2) and a sum
//      of 32 of them below 2^14 + slack: no overflow whatever the inputs' scale. Values, products
//      or sums that still fall below 2^-14 (fp16 subnormals) round with an absolute error of at
//      most 2^-25, negligible next to the block's largest |x~| times largest |w~| (>= 2^7).
//   2. Dequantization in fp16: w~ = fp16(offset~ + scale~ * q), one rounding (FMA), where
//      offset~, scale~ are the normalized fp32 constants rounded to fp16 (offset' = -zp * scale
//      for symmetric weights, so that w~ = fp16(scale~ * (q - zp))).
//   3. Accumulation in fp16 over one chunk of consecutive k only: a block is cut into chunks of
//      kChunk = 64 k, the last one kShortChunk = 32 when the block is an odd multiple of 32 (a
//      block of 32: one chunk of 32). A chunk of len k is summed by len / kChain FMA chains of
//      kChain = 16 (k mod 4 for 64 k, k mod 2 for 32), then (a0 + a1) + (a2 + a3), or a0 + a1, in
//      fp16. A normalized sum of 64 products stays below 2^15.
//   4. Flush: the chunk sum is converted (exactly) to fp32 and added to the block's fp32 sum; at
//      the end of the block y = fma(block sum, 2^-ex[m,b] * 2^-ew[r,b], y) in fp32; finally
//      y + bias.
//
// Worst-case error per output (first order, u = 2^-11): the dequantization rounding (1 u), an FMA
// chain of 16 (16 u) and at most two additions (2 u), each relative to sum |x| |w'| of the chunk,
// i.e. <= 19 u * sum_k |x| (|offset'| + |scale q|), 20 u with the second-order terms (plus the
// fp32 terms of the float32 path and absolute terms of order 2^-25 per operation in normalized
// units for fp16 subnormals). Chunks of 64 (and 2 chains in a chunk of 32) keep the flush's
// instructions per FMA low: they, not the FMAs, had bounded the GEMM with chunks of 32 in 4 chains.
#pragma once

#include <cmath>
#include <cstdint>

#include "qlinear/core/common.h"

namespace qlinear::fp16_path {

constexpr int kChunk = 64;       // k per fp16 partial sum
constexpr int kShortChunk = 32;  // the last chunk of a block of an odd multiple of 32 k
constexpr int kChain = 16;       // k per fp16 FMA chain: a chunk of len k has len / kChain chains
constexpr int kActTop = 4;       // normalized activation absmax in [2^3, 2^4)
constexpr int kWeightTop = 5;    // normalized weight bound in [2^4, 2^5)

// 2^(top - 1 - e) for v in [2^e, 2^(e + 1)), so that v * result lies in [2^(top-1), 2^top);
// 1 for v == 0, inf or nan. v must be >= 0 and not a float32 subnormal (fp16 data never gives one).
inline float pow2_normalizer(float v, int top) {
  const uint32_t biased = (bits_of(v) >> 23) & 0xFF;  // e + 127
  if (biased == 0 || biased == 0xFF) return 1.f;
  int out = 127 + top - 1 - (int(biased) - 127);
  out = out < 1 ? 1 : out > 254 ? 254 : out;  // unreachable from fp16 data; keeps it a normal float
  return float_of(uint32_t(out) << 23);
}

// The length of the chunk of a block (a multiple of 32 k) that starts at k = c.
inline int64_t chunk_length(int64_t block, int64_t c) { return block - c >= kChunk ? kChunk : kShortChunk; }

// The bound W of a weight row's dequantized values over a block (step 1), in fp32.
inline float weight_bound(float offset, float scale, int qmax) {
  return std::fmax(std::fabs(offset), std::fabs(offset + float(qmax) * scale));
}

}  // namespace qlinear::fp16_path
