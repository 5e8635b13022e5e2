// AVX-512 (F, BW, VL) + AVX512-VNNI kernels over the nr8_kr4 layout (compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mfma -mf16c in this file only; dispatch calls
// them only on CPUs that report these features and the OS's ZMM state). The kernel bodies of
// x86_common.h with the VPDPBUSD block dot product (|sum| <= 256 * 255 * 127 < 2^31 per block:
// exact), on zmm registers (x86_zmm.h: two panels, 16 output rows, per register) or on ymm
// (EVEX-encoded, one panel per register):
//   int4: the chunk splits into low / high nibbles (k 0..3 and 4..7 of its 8-k span), one VPDPBUSD each;
//   int8: the stored codes 0..255 directly (code_shift 0: shifted_sum = -zero_point * sum).
// Activation quantization and the float path are the AVX2 level's (every AVX-512 CPU has AVX2 +
// FMA + F16C).
#include "qlinear/kernels/block_kernels.h"
#include "qlinear/kernels/x86/x86_zmm.h"

namespace qlinear {

const KernelTable& avx512vnni_kernels() {
  using namespace x86;
  using Dot = DpbusdDot<Zmm>;
  using YDot = DpbusdDot<YmmEvex>;
  static const KernelTable table = [] {
    KernelTable t = avx2_kernels();  // activation quantization and the float path
    t.isa = Isa::avx512vnni;
    add_avx512vnni_block_kernels(t);
    t.int8.clear();
    // GEMV (decode): one panel per register, one stream of weights per thread, VPDPBUSD on ymm.
    // Measured on a Zen 5 CPU in one run, the AVX2 level's single-stream GEMVs streamed a
    // Qwen2.5-0.5B model's weights at 98% of a plain streaming read against 65% for the zmm GEMV,
    // which reads two panels' streams at once (decode 130 against 90 tokens/s). On an Intel
    // Sapphire Rapids-class Xeon (1 thread, Qwen2.5-0.5B shapes from DRAM) the same single
    // stream with VPDPBUSD instead of VPMADDUBSW + VPMADDWD: int8 15.8-16.1 against 13.1-13.5
    // GB/s (a streaming read 18.4), int4 14.5-15.0 against 14.2-14.7. The AVX2 and zmm GEMVs
    // stay listed after them, never chosen by the driver, for the per-kernel tests and A/B runs.
    t.int8.push_back(ukernel<YDot>("gemv_w4a8_nr8_kr4_1x8_avx512vnni", gemv<YmmEvex, YDot, 4>, 4, 1, 1, 1, 1));
    t.int8.push_back(ukernel<YDot>("gemv_w8a8_nr8_kr4_1x8_avx512vnni", gemv<YmmEvex, YDot, 8>, 8, 1, 1, 1, 1));
    for (const Int8Ukernel& k : avx2_kernels().int8)
      if (k.m_max == 1) t.int8.push_back(k);
    // A few rows (batched decode of 2..4 sequences: still bound by the weights' stream): ymm
    // tiles, one stream of weights per thread like the GEMV. Measured on Zen 4 (Qwen2.5-0.5B
    // shapes, 2 threads, weights from DRAM): a step of 2 sequences 1.05x the time of one,
    // against 1.35x with the zmm tiles, which read two panels' streams at once. From 5 rows the
    // zmm tiles' 16 outputs per activation broadcast win (compute-bound).
    t.int8.push_back(ukernel<YDot>("gemm_w4a8_nr8_kr4_4x8_avx512vnni", gemm_rows<YmmEvex, YDot, 4, 4>, 4, 4, 1, 2, 4));
    for (const Int8Ukernel& k : {
             ukernel<Dot>("gemv_w4a8_nr8_kr4_1x16_avx512vnni", gemv<Zmm, Dot, 4>, 4, 1, 2, 1, 1),
             ukernel<Dot>("gemm_w4a8_nr8_kr4_8x16_avx512vnni", gemm_rows<Zmm, Dot, 4, 8>, 4, 8, 2, 2),
             ukernel<Dot>("gemv_w8a8_nr8_kr4_1x16_avx512vnni", gemv<Zmm, Dot, 8>, 8, 1, 2, 1, 1),
             ukernel<Dot>("gemm_w8a8_nr8_kr4_4x16_avx512vnni", gemm_rows<Zmm, Dot, 8, 4>, 8, 4, 2, 2),
         })
      t.int8.push_back(k);
    return t;
  }();
  return table;
}

}  // namespace qlinear
