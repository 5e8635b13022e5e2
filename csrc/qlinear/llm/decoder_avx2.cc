// The decoder operations compiled for AVX2 + FMA + F16C (this file's flags only; decoder.cc
// calls them only on CPUs running an AVX2 level).
#define QLINEAR_DECODER_IMPL avx2
#include "qlinear/llm/decoder_impl.h"
