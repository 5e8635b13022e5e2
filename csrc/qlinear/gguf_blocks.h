// GGUF's Q4_0 and Q8_0 blocks dequantized as gguf-py's reference does it: value = float(d) *
// float(q), one float32 product per value, so rows equal gguf.quants.dequantize bit for bit.
// Used for the rows of a quantized token embedding, read from the mapped file at each decode
// step: one call instead of the numpy reference's dozen, whose fixed costs dominate a row.
#pragma once

#include <cstdint>
#include <string>

namespace qlinear {

enum class GgufBlock { q4_0, q8_0 };

struct GgufBlockInfo {
  GgufBlock type;
  int64_t bytes;   // per block of 32 values: fp16 d, then the codes
};

// The block type of a GGUF type name ("Q4_0", "Q8_0"); nullptr for the others.
const GgufBlockInfo* find_gguf_block(const std::string& name);

// One row of `values` (a multiple of 32) from its blocks.
void gguf_dequantize_row(const GgufBlockInfo& t, const uint8_t* row, int64_t values, float* out);

}  // namespace qlinear
