// The decoder operations' code, compiled once per instruction set: decoder.cc includes it for
// the baseline target (NEON intrinsics on aarch64), decoder_avx2.cc for AVX2 (same source, same
// order of float operations and no contraction, so all give identical results; the intrinsics
// only compute the same sums faster). The AVX2 copy also serves the AVX-512 levels.
// QLINEAR_DECODER_IMPL names the namespace of each copy.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "qlinear/core/common.h"
#include "qlinear/llm/decoder.h"

#if defined(__AVX2__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

// The parts, in this order (each uses the ones before it):
#include "qlinear/llm/decoder_impl_rowwise.h"    // rms_norm, silu_mul, gelu_tanh_mul, softcap
#include "qlinear/llm/decoder_impl_vector.h"     // dot, dot8, add_rows, max_of, sum_of, floats_to_halves
#include "qlinear/llm/decoder_impl_attention.h"  // RoPE, decode and prefill attention
#include "qlinear/llm/decoder_impl_delta.h"      // Gated DeltaNet tokens, the attention's output gate
