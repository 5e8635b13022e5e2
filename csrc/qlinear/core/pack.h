// Weight quantization (docs/semantics.md, section 1) and packing into / out of the layouts of layout.h.
// Quantizing and packing are separate steps, so a weight that is already quantized (a saved file
// of another layout, an MNN export) is packed without a second rounding.
#pragma once

#include <cstdint>

#include "qlinear/core/layout.h"

namespace qlinear {

// The unpacked form of a quantized weight, row-major, as the numpy reference produces it:
// codes [n, k] are the stored unsigned codes (symmetric: q + zero_point), scale and offset
// [n, ngroups] are fp16 bit patterns (offset is unused for symmetric weights).
struct QuantizedWeight {
  uint8_t* codes;
  uint16_t* scale;
  uint16_t* offset;
};

// Quantizes w [n, k] (row stride ldw) group-wise; throws std::invalid_argument for NaN/Inf
// weights or ranges beyond float16 scales.
void quantize_weight(const WeightGeometry& g, const float* w, int64_t ldw, QuantizedWeight out);

// Writes the packed buffer (g.total_bytes) from codes/scales/offsets.
void pack_weight(const WeightGeometry& g, const QuantizedWeight& in, uint8_t* packed);

// The inverse of pack_weight.
void unpack_weight(const WeightGeometry& g, const uint8_t* packed, QuantizedWeight out);

struct GgufBlockInfo;  // embedding_rows.h

// Rows [row0, row0 + rows) of the packed weight g (symmetric, group 32, int4 for Q4_0 / int8 for
// Q8_0) from `rows` rows of GGUF blocks at src (g.k / 32 blocks a row): the codes moved as
// docs/llm.md's GGUF section describes (Q4_0's nibble q is our code q, Q8_0's q our q + 128; the
// float16 d our scale), so the packed rows equal pack_weight's of the same codes. Other rows are
// left as they are (a weight fused from several tensors is packed by one call per tensor). The
// caller checks the geometry (pack_gguf_rows_check; layouts of kr 4).
void pack_gguf_rows(const WeightGeometry& g, const GgufBlockInfo& type, const uint8_t* src, int64_t rows,
                    int64_t row0, uint8_t* packed);
// Throws std::invalid_argument naming what does not fit: bits, group, symmetry, rows, k.
void pack_gguf_rows_check(const WeightGeometry& g, const GgufBlockInfo& type, int64_t rows, int64_t row0,
                          int64_t row_bytes);

}  // namespace qlinear
