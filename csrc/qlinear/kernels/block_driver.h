// The loop over rows and panels and the table entries that every SIMD family's block-format
// kernels share (x86/x86_blocks.h, arm/neon_blocks.h); a family supplies its row tile.
#pragma once

#include <algorithm>
#include <cstdint>

#include "qlinear/core/block_format.h"
#include "qlinear/core/kernels.h"
#include "qlinear/kernels/block_kernels.h"
#include "qlinear/kernels/block_traits.h"
#include "qlinear/kernels/tiling.h"

namespace qlinear {

// GEMV: one row over the panels. GEMM: chunks of about 32 rows (a multiple of MR); per panel the
// chunk's MR-row tiles, so that a panel stays in L1 across the tiles of a chunk.
// row_tile(Rows<R>{}, m, p0, p1) runs rows [m, m + R) over panels [p0, p1).
template <int MR, class RowTile>
inline void drive_block_gemm(int64_t m0, int64_t m1, int64_t p0, int64_t p1, RowTile&& row_tile) {
  if (m1 - m0 == 1) {
    row_tile(Rows<1>{}, m0, p0, p1);
    return;
  }
  constexpr int64_t kRowChunk = 32 / MR * MR;
  for (int64_t mc = m0; mc < m1; mc += kRowChunk) {
    const int64_t mc1 = std::min(m1, mc + kRowChunk);
    for (int64_t p = p0; p < p1; ++p)
      for_row_tiles<MR>(mc, mc1, [&](auto rows, int64_t m) { row_tile(rows, m, p, p + 1); });
  }
}

// Every format's kernels of a level, replacing the table's: a GEMV (M = 1) and a GEMM of MR-row
// tiles. gemm_of(std::integral_constant<Format, F>{}) gives format F's Int8MatmulFn.
template <int MR, class GemmOf>
void add_level_block_kernels(KernelTable& t, const char* level, GemmOf&& gemm_of) {
  static const char* const kGemmShape[] = {"", "a8_1x8", "a8_2x8", "a8_3x8", "a8_4x8"};
  static_assert(MR >= 1 && MR <= 4, "GEMM tiles of 1..4 rows");
  t.blocks.clear();
  for_each_block_format([&](auto fc) {
    constexpr Format f = decltype(fc)::value;
    Int8Ukernel gemv{};
    gemv.name = block_kernel_name("gemv", f, "a8_1x8", level);
    gemv.fn = gemm_of(fc);
    gemv.bits = format_info(f).code_bits;
    gemv.m_max = 1;
    gemv.format = f;
    Int8Ukernel gemm = gemv;
    gemm.name = block_kernel_name("gemm", f, kGemmShape[MR], level);
    gemm.mr = MR;
    gemm.m_min = 2;
    gemm.m_max = INT64_MAX;
    t.blocks.push_back(gemv);
    t.blocks.push_back(gemm);
  });
}

}  // namespace qlinear
