// Weight quantization (docs/semantics.md, section 1) and packing into / out of the layouts of layout.h.
// Quantizing and packing are separate steps, so a weight that is already quantized (a saved file
// of another layout, an MNN export) is packed without a second rounding.
#pragma once

#include <cstdint>

#include "layout.h"

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

}  // namespace qlinear
