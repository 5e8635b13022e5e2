// Functions of the x86 VNNI levels shared between their translation units (each compiled with its
// own level's flags: call them only from a level that implies AVX512-VNNI, or through a table).
#pragma once

#include <cstdint>

#include "../kernels.h"

namespace qlinear::avx512vnni {

// The avx512vnni GEMM kernels (also run by the amx level for rows that do not fill a tile).
void gemm_w4a8(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);
void gemm_w8a8(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1);

}  // namespace qlinear::avx512vnni
