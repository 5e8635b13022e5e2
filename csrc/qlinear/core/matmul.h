// The matmul driver: packs the activations (int8 quantization and its pre-sums, or float copies),
// chooses the active level's micro-kernels for the M at hand by their descriptors (kernels.h),
// and splits the work over the thread pool in the units the descriptors give.
#pragma once

#include <cstdint>
#include <vector>

#include "qlinear/core/kernels.h"

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

enum class Family { int8, float32, float16 };

// What a request of m rows would run: the kernel per row range, with its register tile.
struct PlannedKernel {
  const char* name;
  int mr, nr;       // rows x outputs per register tile
  int64_t m0, m1;   // the rows it computes
};
// float16: fp16 activations through the float path (FP16 arithmetic where the level has it).
std::vector<PlannedKernel> planned_kernels(const WeightGeometry& w, int64_t m, Family family);

// Runs descriptor `index` of the family in table kt on the whole request, on the calling thread,
// after that table's activation packing: the per-kernel tests' entry (throws
// std::invalid_argument if the kernel does not serve the request).
void run_ukernel(const KernelTable& kt, Family family, size_t index, const MatmulRequest& r);

// Quantizes activations only (qlinear.quantize_activation): q [m, ldq], scale/sum [m, nblocks].
void quantize_activations(const void* x, DType dtype, int64_t m, int64_t ldx, int64_t k,
                          int64_t block, int64_t act_block, int8_t* q, int64_t ldq, float* scale,
                          int32_t* sum);

}  // namespace qlinear
