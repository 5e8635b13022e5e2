// The kernel interface. Every ISA level provides stateless micro-kernels over the packed layouts
// of layout.h, each described by a descriptor (Ukernel below: name, tile, the M it serves, the
// activation packing it reads); a KernelTable lists one level's descriptors, and dispatch picks a
// table once (capped by QLINEAR_ISA). Kernels never allocate and never spawn threads: the driver
// (matmul.cc) chooses the kernel for the M at hand, packs the activations, and hands each thread
// a range in the kernel's units.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "qlinear/core/common.h"
#include "qlinear/core/cpu.h"
#include "qlinear/core/layout.h"

namespace qlinear {

// Activations after dynamic quantization (activation packing): int8 codes zero-padded to the
// weight's padded K, and for every (row, storage block) the activation scale, the sum of the codes
// and the two pre-sums the float epilogue needs, so kernels do no per-(row, block) scalar work.
struct QuantizedActs {
  const int8_t* q = nullptr;     // [m, ldq]
  int64_t ldq = 0;
  const float* scale = nullptr;  // [m, nblocks]: s_x of the activation block holding the block
  const int32_t* sum = nullptr;  // [m, nblocks]: sum of q over the storage block
  const float* scaled_sum = nullptr;     // [m, nblocks]: scale * sum (the offset term's factor)
  const int32_t* shifted_sum = nullptr;  // [m, nblocks]: (code_shift - zero_point) * sum
  // block formats (block_format.h): [m, ld16] sums of q over every 16 k (a sub-block's sum)
  const int32_t* sum16 = nullptr;
  int64_t ld16 = 0;
};

// Quantizes rows [m0, m1) of x (row stride ldx elements, K = k) with absmax scales per
// `act_block` consecutive k (act_block >= k: per row; else a multiple of `block`).
// Writes q [.., ldq] (zero past k up to nblocks*block), scale and sum [.., nblocks], and, where
// scaled_sum / shifted_sum are not null, the pre-sums with the factor sum_shift = code_shift -
// zero_point of the micro-kernel that will read them.
struct ActQuantArgs {
  const void* x; DType dtype; int64_t ldx;
  int64_t k, block, nblocks, act_block;
  int8_t* q; int64_t ldq; float* scale; int32_t* sum;
  float* scaled_sum = nullptr; int32_t* shifted_sum = nullptr; int32_t sum_shift = 0;
};
using QuantizeActsFn = void (*)(const ActQuantArgs& a, int64_t m0, int64_t m1);

// An activation block's scale s = absmax / 127 (NaN if the block holds a NaN or an infinity),
// from the absmax and finiteness of its values before i and the values load(i .. end - 1).
template <class Load>
inline float act_scale(float absmax, bool finite, Load&& load, int64_t i, int64_t end) {
  for (; i < end; ++i) {
    const float v = load(i);
    finite &= !std::isnan(v);
    absmax = std::max(absmax, std::fabs(v));
  }
  finite &= !std::isinf(absmax);
  return finite ? absmax / 127.f : NAN;
}

// The activation quantizers' step for one value (docs/semantics.md): q = clamp(rint(x / s),
// -127, 127), rint rounding to nearest even in the default rounding mode.
inline int8_t quantize_one(float x, float s) {
  return static_cast<int8_t>(std::min(127.f, std::max(-127.f, std::nearbyint(x / s))));
}

// The pre-sums of rows [m0, m1), from their scale and sum (shared by every level's quantizer).
inline void write_pre_sums(const ActQuantArgs& a, int64_t m0, int64_t m1) {
  if (a.scaled_sum == nullptr) return;
  for (int64_t i = m0 * a.nblocks; i < m1 * a.nblocks; ++i) {
    a.scaled_sum[i] = a.scale[i] * float(a.sum[i]);
    a.shifted_sum[i] = a.sum_shift * a.sum[i];
  }
}

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

// A micro-kernel descriptor. A kernel computes rows [m0, m1) x panels [p0, p1) of one weight
// (within, it walks its own register tiles: mr rows x np panels); what it serves and how work may
// be split is stated here, and the driver (matmul.cc) chooses by it:
//   - m_min / m_max: the request sizes M it is meant for (GEMV: 1; a tiled GEMM: from the M
//     where its set-up pays);
//   - m_unit: it takes only whole multiples of m_unit rows (AMX: 16-row tiles); the driver gives
//     the rest of the rows to the next kernel that serves them;
//   - code_shift (int8 activations): the constant c it subtracts from the stored codes (int8 codes
//     flipped to c - 128 for VPMADDUBSW); activation packing then writes shifted_sum =
//     (c - zero_point) * sum, and the kernel's integer sums plus shifted_sum are sum(x * (code - zp)).
// Names state scheme x layout x tile x level: gemm_w4a8_nr8_kr4_3x16_avx2 = int4 weights, int8
// activations, nr8_kr4 layout, 3 rows x 16 outputs per register tile, AVX2.
template <class Fn>
struct Ukernel {
  const char* name = nullptr;
  Fn fn = nullptr;
  int bits = 4;          // weight bits it reads
  int mr = 1;            // activation rows per register tile
  int np = 1;            // panels per register tile (outputs per tile: np * nr)
  int64_t m_min = 1, m_max = INT64_MAX;
  int64_t m_unit = 1;
  int32_t code_shift = 0;
  Format format = Format::affine;  // the weight format it reads

  bool serves(int weight_bits, int64_t m) const {
    return bits == weight_bits && m >= m_min && m <= m_max && m >= m_unit;
  }
};
using Int8Ukernel = Ukernel<Int8MatmulFn>;
using FloatUkernel = Ukernel<FloatMatmulFn>;
using HalfUkernel = Ukernel<HalfMatmulFn>;

// One level's kernels: activation packing, then its micro-kernels in order of preference (the
// driver runs the first that serves the request).
struct KernelTable {
  Isa isa;
  LayoutId layout;  // the layout these kernels read
  QuantizeActsFn quantize_acts; const char* quantize_acts_name;
  PrepareFloatActsFn prepare_float_acts;
  std::vector<Int8Ukernel> int8;      // int8 activations (W4A8 / W8A8)
  std::vector<FloatUkernel> float32;  // float activations, fp32 arithmetic
  // fp16 activations in FP16 arithmetic (levels with FEAT_FP16); where empty, fp16 activations
  // are converted and take the float32 kernels.
  std::vector<HalfUkernel> float16;
  // The block formats' kernels (block_format.h): int8 and float activations, each kernel of the
  // one format it names (Ukernel::format); a format without a kernel here runs the scalar ones.
  std::vector<Int8Ukernel> blocks;
  std::vector<FloatUkernel> blocks_float;
  // The same level's kernels for the weights of another layout that it also reads at speed (the
  // i8mm level: the dotprod level's layouts, as files converted on other ARM CPUs have), or null.
  const KernelTable* also = nullptr;
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
// Adds the FP16-arithmetic float kernels (kernels/arm/fp16.cc) to a level that implies FEAT_FP16.
KernelTable with_fp16_float_path(KernelTable table);
const KernelTable& dotprod_kernels();
const KernelTable& i8mm_kernels();
#endif

// Whether a table's kernels read a weight's packed layout.
inline bool table_reads(const KernelTable& t, const WeightGeometry& w) {
  return storage_layout(t.layout, w.bits) == w.layout;
}
// The table of level `t` that reads the weight's layout (t, or t.also), or null: then the scalar
// kernels run it.
inline const KernelTable* table_for(const KernelTable& t, const WeightGeometry& w) {
  if (table_reads(t, w)) return &t;
  return t.also != nullptr && table_reads(*t.also, w) ? t.also : nullptr;
}

// The table in use: the best level of this CPU, capped by QLINEAR_ISA at start-up.
const KernelTable& active_kernels();
// The table of a given level (must be supported: see cpu_supports).
const KernelTable& kernels_for(Isa isa);
// Switches the active level at run time (for tests and A/B benchmarks); false if unsupported.
bool set_active_isa(Isa isa);

}  // namespace qlinear
