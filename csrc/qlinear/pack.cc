#include "pack.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "layout_access.h"
#include "threadpool.h"

namespace qlinear {

namespace {

enum class GroupError : int { none = 0, not_finite = 1, out_of_range = 2 };

// Quantizes one group of `len` weights; returns the stored codes and fp16 scale / offset.
GroupError quantize_group(const float* w, int64_t len, int bits, bool symmetric, uint8_t* codes,
                          uint16_t* scale16, uint16_t* offset16) {
  float lo = w[0], hi = w[0], absmax = 0.f;
  for (int64_t i = 0; i < len; ++i) {
    if (!std::isfinite(w[i])) return GroupError::not_finite;
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
    absmax = std::max(absmax, std::fabs(w[i]));
  }
  if (symmetric) {
    const float qmax = bits == 4 ? 7.f : 127.f, qmin = bits == 4 ? -8.f : -127.f;
    const int zp = bits == 4 ? 8 : 128;
    *scale16 = float_to_half(absmax / qmax);
    *offset16 = 0;
    const float s = half_to_float(*scale16);
    if (std::isinf(s)) return GroupError::out_of_range;
    for (int64_t i = 0; i < len; ++i) {
      const float q = s == 0.f ? 0.f : std::min(qmax, std::max(qmin, std::nearbyint(w[i] / s)));
      codes[i] = static_cast<uint8_t>(int(q) + zp);
    }
  } else {
    const float qmax = bits == 4 ? 15.f : 255.f;
    *scale16 = float_to_half((hi - lo) / qmax);
    *offset16 = float_to_half(lo);
    const float s = half_to_float(*scale16), o = half_to_float(*offset16);
    if (std::isinf(s) || std::isinf(o) || std::isinf(hi - lo)) return GroupError::out_of_range;
    for (int64_t i = 0; i < len; ++i) {
      const float q = s == 0.f ? 0.f : std::min(qmax, std::max(0.f, std::nearbyint((w[i] - o) / s)));
      codes[i] = static_cast<uint8_t>(q);
    }
  }
  return GroupError::none;
}

}  // namespace

void quantize_weight(const WeightGeometry& g, const float* w, int64_t ldw, QuantizedWeight out) {
  std::atomic<int> error{0};
  ThreadPool::global().parallel_for(g.n, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1 && error.load(std::memory_order_relaxed) == 0; ++n) {
      for (int64_t j = 0; j < g.ngroups; ++j) {
        const int64_t k0 = j * g.group_size, len = std::min(g.group_size, g.k - k0);
        const GroupError e = quantize_group(w + n * ldw + k0, len, g.bits, g.symmetric,
                                            out.codes + n * g.k + k0, out.scale + n * g.ngroups + j,
                                            out.offset + n * g.ngroups + j);
        if (e != GroupError::none) { error.store(int(e)); break; }
      }
    }
  });
  if (error.load() == int(GroupError::not_finite))
    throw std::invalid_argument("weight contains NaN or Inf");
  if (error.load() == int(GroupError::out_of_range))
    throw std::invalid_argument("weight values exceed the float16 range of the group scales");
}

void pack_weight(const WeightGeometry& g, const QuantizedWeight& in, uint8_t* packed) {
  ThreadPool::global().parallel_for(g.npanels, 16, [&](int64_t p0, int64_t p1) {
    std::memset(packed + p0 * g.panel_bytes, 0, (p1 - p0) * g.panel_bytes);
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t b = 0; b < g.nblocks; ++b) {
        uint8_t* block = packed + p * g.panel_bytes + b * g.block_bytes;
        auto* scales = reinterpret_cast<uint16_t*>(block + g.code_bytes);
        const int64_t j = b * g.block / g.group_size;  // the semantic group holding this block
        for (int r = 0; r < g.nr; ++r) {
          const int64_t n = p * g.nr + r;
          if (n >= g.n) break;  // padding rows stay zero: zero scale, zero output
          const uint8_t* codes = in.codes + n * g.k;
          for (int64_t kk = 0; kk < g.block && b * g.block + kk < g.k; ++kk)
            write_code(block, g.bits, g.nr, g.kr, r, kk, codes[b * g.block + kk]);
          std::memcpy(scales + r, in.scale + n * g.ngroups + j, 2);
          if (!g.symmetric) std::memcpy(scales + g.nr + r, in.offset + n * g.ngroups + j, 2);
        }
      }
    }
  });
}

void unpack_weight(const WeightGeometry& g, const uint8_t* packed, QuantizedWeight out) {
  ThreadPool::global().parallel_for(g.npanels, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      for (int64_t b = 0; b < g.nblocks; ++b) {
        const uint8_t* block = packed + p * g.panel_bytes + b * g.block_bytes;
        const auto* scales = reinterpret_cast<const uint16_t*>(block + g.code_bytes);
        const int64_t j = b * g.block / g.group_size;
        for (int r = 0; r < g.nr; ++r) {
          const int64_t n = p * g.nr + r;
          if (n >= g.n) break;
          for (int64_t kk = 0; kk < g.block && b * g.block + kk < g.k; ++kk)
            out.codes[n * g.k + b * g.block + kk] =
                static_cast<uint8_t>(read_code(block, g.bits, g.nr, g.kr, r, kk));
          std::memcpy(out.scale + n * g.ngroups + j, scales + r, 2);
          if (!g.symmetric) std::memcpy(out.offset + n * g.ngroups + j, scales + g.nr + r, 2);
          else out.offset[n * g.ngroups + j] = 0;
        }
      }
    }
  });
}

}  // namespace qlinear
