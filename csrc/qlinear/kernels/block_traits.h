// A block format's constants at compile time (the same values as block_format.cc's table), for the
// SIMD kernels of every family (x86/x86_blocks.h, arm/neon_blocks.h).
#pragma once

#include <cstdint>
#include <type_traits>

#include "qlinear/core/layout.h"

namespace qlinear {

template <Format F>
struct BlockTraits {
  static constexpr bool k_quant = F == Format::q2_k || F == Format::q3_k || F == Format::q4_k || F == Format::q5_k ||
                                  F == Format::q6_k || F == Format::iq4_xs;
  static constexpr int kSuper = k_quant ? 256 : 32;
  static constexpr int kSub = F == Format::q2_k || F == Format::q3_k || F == Format::q6_k ? 16 : 32;
  static constexpr int kNsub = kSuper / kSub;
  static constexpr int kBits = F == Format::q2_k ? 2 : F == Format::q3_k ? 3
                             : F == Format::q5_0 || F == Format::q5_1 || F == Format::q5_k ? 5 : F == Format::q6_k ? 6 : 4;
  static constexpr bool kLookup = F == Format::iq4_nl || F == Format::iq4_xs || F == Format::mxfp4;
  static constexpr bool kHasMin = F == Format::q2_k || F == Format::q4_1 || F == Format::q5_1 || F == Format::q4_k ||
                                  F == Format::q5_k;
  static constexpr int kZero = F == Format::q3_k ? 4 : F == Format::q5_0 ? 16 : F == Format::q6_k ? 32 : 0;
  // The code planes (block_format.h): the low bits (nibbles, or two-bit codes below 4 bits), then
  // the high bits' plane of kBits - kLowBits bits per code.
  static constexpr int kLowBits = kBits >= 4 ? 4 : 2;
  static constexpr int kHighBits = kBits - kLowBits;
  static constexpr int64_t kLowBytes = 8 * kSuper * kLowBits / 8;
};

// f(std::integral_constant<int, I>) for I in [B, E).
template <int B, int E, class Fn>
inline void static_for(Fn&& f) {
  if constexpr (B < E) {
    f(std::integral_constant<int, B>{});
    static_for<B + 1, E>(f);
  }
}

// Every block format, for the levels' tables (the enum's order).
template <class Fn>
inline void for_each_block_format(Fn&& f) {
  f(std::integral_constant<Format, Format::q4_1>{});
  f(std::integral_constant<Format, Format::q5_0>{});
  f(std::integral_constant<Format, Format::q5_1>{});
  f(std::integral_constant<Format, Format::q4_k>{});
  f(std::integral_constant<Format, Format::q5_k>{});
  f(std::integral_constant<Format, Format::q6_k>{});
  f(std::integral_constant<Format, Format::iq4_nl>{});
  f(std::integral_constant<Format, Format::iq4_xs>{});
  f(std::integral_constant<Format, Format::mxfp4>{});
  f(std::integral_constant<Format, Format::q2_k>{});
  f(std::integral_constant<Format, Format::q3_k>{});
}

}  // namespace qlinear
