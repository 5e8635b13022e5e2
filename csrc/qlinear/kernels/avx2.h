// Functions of the AVX2 level shared between its translation units (all compiled with
// -mavx2 -mfma -mf16c; call them only through the kernel table).
#pragma once

#include "../kernels.h"

namespace qlinear::avx2 {

float prepare_float_acts(const FloatActArgs& a, int64_t m0, int64_t m1);
template <int BITS> void gemv_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
template <int BITS> void gemm_float(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

}  // namespace qlinear::avx2
