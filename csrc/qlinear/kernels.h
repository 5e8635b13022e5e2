// The kernel interface. Every ISA level provides the same small set of stateless functions over
// the packed layouts of layout.h; a KernelTable collects one level's functions, and dispatch
// picks a table once (capped by QLINEAR_ISA). Kernels never allocate and never spawn threads:
// the driver (matmul.cc) tiles the work and hands each thread a range.
#pragma once

#include <cstdint>

#include "common.h"
#include "cpu.h"
#include "layout.h"

namespace qlinear {

// Activations after dynamic quantization: int8 codes zero-padded to the weight's padded K,
// and for every (row, storage block) the activation scale and the sum of the codes.
struct QuantizedActs {
  const int8_t* q = nullptr;     // [m, ldq]
  int64_t ldq = 0;
  const float* scale = nullptr;  // [m, nblocks]: s_x of the activation block holding the block
  const int32_t* sum = nullptr;  // [m, nblocks]: sum of q over the storage block
  // Filled by the driver for the weight at hand, so kernels do no per-panel scalar work:
  const float* scaled_sum = nullptr;   // [m, nblocks]: scale * sum (the offset term's factor)
  const int32_t* shifted_sum = nullptr;  // [m, nblocks]: (code_shift - zero_point) * sum
};

// Quantizes rows [m0, m1) of x (row stride ldx elements, K = k) with absmax scales per
// `act_block` consecutive k (act_block >= k: per row; else a multiple of `block`).
// Writes q [.., ldq] (zero past k up to nblocks*block), scale and sum [.., nblocks].
struct ActQuantArgs {
  const void* x; DType dtype; int64_t ldx;
  int64_t k, block, nblocks, act_block;
  int8_t* q; int64_t ldq; float* scale; int32_t* sum;
};
using QuantizeActsFn = void (*)(const ActQuantArgs& a, int64_t m0, int64_t m1);

// y[m, n] = sum_blocks s_x * scale * (acc - zp * sum) (+ s_x * offset * sum) + bias[n]
// for rows [m0, m1) of the activations and panels [p0, p1) of the weight.
struct Int8MatmulArgs {
  const WeightGeometry* w; const uint8_t* packed;
  QuantizedActs act;
  const float* bias;             // [N] or nullptr
  float* y; int64_t ldy;         // [m, ldy]
};
using Int8MatmulFn = void (*)(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

// Float activations, weights dequantized in registers (the low-memory float path):
// y[m, n] = unscale * sum_k x[m, k] * w'[n, k] + bias[n], accumulated in fp32.
struct FloatMatmulArgs {
  const WeightGeometry* w; const uint8_t* packed;
  const float* x; int64_t ldx;   // [m, ldx] float32, zero past K up to the padded K
  const float* xsum;             // [m, nblocks]: sum of x over each storage block
  float unscale;                 // x was scaled by 1 / unscale (a power of two) to stay finite
  const float* bias;             // [N] or nullptr
  float* y; int64_t ldy;
};
using FloatMatmulFn = void (*)(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

// Copies rows [m0, m1) of x (float32 or float16) into a float32 buffer zero-padded to
// nblocks * block, with the sum of every block; returns the largest |x| seen (NaN if any).
struct FloatActArgs {
  const void* x; DType dtype; int64_t ldx; int64_t k, block, nblocks;
  float* out; int64_t ldo; float* sum;
};
using PrepareFloatActsFn = float (*)(const FloatActArgs& a, int64_t m0, int64_t m1);

// fp16 activations with FP16 arithmetic (fp16_path.h): x normalized per (row, block) by the
// driver, y[m, n] = sum_blocks 2^-ex[m,b] * 2^-ew[n,b] * (fp32 sum of fp16 chunk sums) + bias[n].
struct HalfMatmulArgs {
  const WeightGeometry* w; const uint8_t* packed;
  const uint16_t* x; int64_t ldx;  // [m, ldx] fp16 bits, normalized, zero past K up to the padded K
  const float* xunscale;           // [m, nblocks]: 2^-ex, undoes the normalization
  const float* bias;               // [N] or nullptr
  float* y; int64_t ldy;
};
using HalfMatmulFn = void (*)(const HalfMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

struct KernelTable {
  Isa isa;
  QuantizeActsFn quantize_acts; const char* quantize_acts_name;
  // Indexed by bits == 8: [0] int4 weights, [1] int8 weights. GEMV runs M == 1, GEMM M > 1;
  // each level picks them independently.
  Int8MatmulFn gemv[2]; const char* gemv_name[2];
  Int8MatmulFn gemm[2]; const char* gemm_name[2];
  // Per bits: the constant c a kernel subtracts from the stored codes (e.g. int8 codes flipped to
  // code - 128 for VPMADDUBSW). Its integer sums plus shifted_sum are sum(x * (code - zp)).
  int code_shift[2];
  PrepareFloatActsFn prepare_float_acts;
  FloatMatmulFn gemv_float[2]; const char* gemv_float_name[2];
  FloatMatmulFn gemm_float[2]; const char* gemm_float_name[2];
  LayoutId layout;  // the layout these kernels read
  // fp16 activations in FP16 arithmetic (levels with FEAT_FP16); where null, fp16 activations
  // are converted and take the float32 kernels above.
  HalfMatmulFn gemv_half[2] = {nullptr, nullptr}; const char* gemv_half_name[2] = {nullptr, nullptr};
  HalfMatmulFn gemm_half[2] = {nullptr, nullptr}; const char* gemm_half_name[2] = {nullptr, nullptr};
};

// The scalar twin of the FP16-arithmetic kernels (bit-identical results, any layout, any CPU):
// the oracle they are tested against.
void half_float_matmul_twin(const HalfMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

// One table per level, defined in kernels/<level>.cc.
const KernelTable& scalar_kernels();
#if defined(__x86_64__) || defined(_M_X64)
const KernelTable& avx2_kernels();
// Levels beyond AVX2 (each built only if the compiler takes its flags, or emulated: x86_simd.h).
// Their activation quantization and float path are the AVX2 level's.
const KernelTable& avxvnni_kernels();
const KernelTable& avx512vnni_kernels();
const KernelTable& amx_kernels();
#endif
#if defined(__aarch64__)
const KernelTable& neon_kernels();
const KernelTable& fp16_kernels();
// Adds the FP16-arithmetic float kernels (kernels/fp16.cc) to a level that implies FEAT_FP16.
KernelTable with_fp16_float_path(KernelTable table);
const KernelTable& dotprod_kernels();
const KernelTable& i8mm_kernels();
#endif

// The table in use: the best level of this CPU, capped by QLINEAR_ISA at start-up.
const KernelTable& active_kernels();
// The table of a given level (must be supported: see cpu_supports).
const KernelTable& kernels_for(Isa isa);
// Switches the active level at run time (for tests and A/B benchmarks); false if unsupported.
bool set_active_isa(Isa isa);

}  // namespace qlinear
