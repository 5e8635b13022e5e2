// AVX-VNNI kernels over the nr8_kr4 layout (compiled with -mavx2 -mfma -mf16c -mavxvnni in this
// file only; dispatch calls them only on CPUs that report AVX-VNNI besides AVX2 + FMA + F16C).
// The AVX2 level's kernel bodies (x86_common.h) with the block dot product on the VEX-encoded
// VPDPBUSD: unsigned codes times 4 activation bytes broadcast to every lane, the 4 products
// added to int32 lanes exactly, so no s16 limit:
//   int4: one VPDPBUSD per nibble half (k 0..3 and 4..7 of the chunk's 8-k span);
//   int8: the stored codes 0..255 directly (code_shift 0: shifted_sum = -zero_point * sum).
// Kernels: GEMV 1x8, GEMM 4x8 row tiles over the packed panels, and from 12 rows 6-row x
// 16-output tiles over blocks of two panels (int4 unpacked once in L1, int8 read as packed).
// Activation quantization and the float path are the AVX2 level's.
#include "qlinear/kernels/block_kernels.h"
#include "qlinear/kernels/x86/x86_common.h"

#include "qlinear/kernels/x86/avx2.h"

namespace qlinear {
namespace {

using x86::Ymm;

struct YmmVnni : Ymm {
  static __m256i dpbusd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
  static __m256i dpbusd_x(__m256i acc, __m256i a, const int8_t* x) { return dpbusd(acc, a, bcast4(x)); }
};

using Dot = x86::DpbusdDot<YmmVnni>;
using TileDot = x86::DpbusdTileDot<YmmVnni, 6, 6>;

}  // namespace

const KernelTable& avxvnni_kernels() {
  using namespace x86;
  static const KernelTable table = [] {
    KernelTable t = avx2_kernels();  // activation quantization and the float path
    t.isa = Isa::avxvnni;
    add_avxvnni_block_kernels(t);
    t.int8 = {
        ukernel<Dot>("gemv_w4a8_nr8_kr4_1x8_avxvnni", gemv<YmmVnni, Dot, 4>, 4, 1, 1, 1, 1),
        ukernel<TileDot>("gemm_w4a8_nr8_kr4_6x16_avxvnni", gemm_tiled<TileDot, 4>, 4, 6, 2, 12),
        ukernel<Dot>("gemm_w4a8_nr8_kr4_4x8_avxvnni", gemm_rows<YmmVnni, Dot, 4, 4>, 4, 4, 1, 2),
        ukernel<Dot>("gemv_w8a8_nr8_kr4_1x8_avxvnni", gemv<YmmVnni, Dot, 8>, 8, 1, 1, 1, 1),
        ukernel<TileDot>("gemm_w8a8_nr8_kr4_6x16_avxvnni", gemm_tiled<TileDot, 8>, 8, 6, 2, 12),
        ukernel<Dot>("gemm_w8a8_nr8_kr4_4x8_avxvnni", gemm_rows<YmmVnni, Dot, 8, 4>, 8, 4, 1, 2),
    };
    return t;
  }();
  return table;
}

}  // namespace qlinear
