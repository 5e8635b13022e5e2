// The driver of the int8-activation matmuls (W4A8 / W8A8): quantizes the activations, then tiles
// the weight panels (and, for tall inputs, the rows) over the thread pool and runs the active
// level's GEMV (M == 1) or GEMM (M > 1) kernel on each tile.
#pragma once

#include <cstdint>

#include "kernels.h"

namespace qlinear {

struct MatmulRequest {
  const WeightGeometry* w; const uint8_t* packed;
  const void* x; DType dtype; int64_t m; int64_t ldx;  // x [m, K], row stride ldx elements
  int64_t act_block;                                   // >= K: one activation scale per row
  const float* bias;                                   // [N] or nullptr
  float* y; int64_t ldy;                               // y [m, N], row stride ldy
};

// The kernels a request would run (the active table, or the scalar oracle when the weight's
// layout is not the active table's).
const KernelTable& kernels_for_weight(const WeightGeometry& w);

// act="int8": activations quantized per row / block, int8 x int8 products (W4A8 / W8A8).
void matmul_int8(const MatmulRequest& r);
// act="float": float activations, weights dequantized in the kernel (act_block is unused).
void matmul_float(const MatmulRequest& r);

// The float path for float16 activations through the scalar twin of the FP16-arithmetic
// kernels (fp16_path.h), on any CPU: the oracle of those kernels, for tests.
void matmul_float16_twin(const MatmulRequest& r);

// Quantizes activations only (qlinear.quantize_activation): q [m, ldq], scale/sum [m, nblocks].
void quantize_activations(const void* x, DType dtype, int64_t m, int64_t ldx, int64_t k,
                          int64_t block, int64_t act_block, int8_t* q, int64_t ldq, float* scale,
                          int32_t* sum);

}  // namespace qlinear
