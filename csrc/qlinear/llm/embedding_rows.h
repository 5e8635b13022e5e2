// Rows of a token embedding as a decode step reads them: one row per token, so the fixed costs
// of the numpy reference (a dozen calls, each slow on caches just emptied by the step's weight
// stream) dominate; these do a row in one call.
//
// GGUF's Q4_0 and Q8_0 blocks are dequantized as gguf-py's reference does it: value = float(d) *
// float(q), one float32 product per value, so rows equal gguf.quants.dequantize bit for bit.
// Rows of a file (bfloat16 / float16 / float32) are read with pread and widened exactly.
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

enum class RowDtype { bfloat16, float16, float32 };

// The row dtype of a name ("bfloat16", "float16", "float32"); false for the others.
bool parse_row_dtype(const std::string& name, RowDtype* out);

// Rows ids[0..n) of a [rows, values] table of `dtype` at byte `offset` of the open file `fd`, as
// float32 into out[n, values]. Throws std::invalid_argument on a short read (a truncated file)
// and std::runtime_error on a failed one.
void read_file_rows(int fd, int64_t offset, RowDtype dtype, int64_t values, const int64_t* ids, int64_t n,
                    float* out);

}  // namespace qlinear
