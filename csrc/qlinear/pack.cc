#include "pack.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "layout_access.h"  // read_code (unpack_weight)
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

// Stores one row's codes of a block (`len` <= block real k, the rest stays zero) into the
// block's chunks: whole bytes at a time (both nibbles of an int4 byte at once), as layout.h
// describes (read_code in layout_access.h reads them back element by element).
void write_row_codes(const WeightGeometry& g, const uint8_t* codes, int64_t len, int r, uint8_t* block) {
  const int64_t kr = g.kr, chunk_bytes = int64_t(g.nr) * kr;
  uint8_t* out = block + r * kr;
  const auto code = [&](int64_t kk) -> uint8_t { return kk < len ? codes[kk] : 0; };
  if (g.bits == 8) {
    for (int64_t c = 0; c * kr < len; ++c, out += chunk_bytes)
      for (int64_t i = 0; i < kr; ++i) out[i] = code(c * kr + i);
  } else {
    for (int64_t c = 0; c * 2 * kr < len; ++c, out += chunk_bytes)
      for (int64_t i = 0; i < kr; ++i)
        out[i] = static_cast<uint8_t>(code(c * 2 * kr + i) | code(c * 2 * kr + kr + i) << 4);
  }
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
          write_row_codes(g, in.codes + n * g.k + b * g.block, std::min(g.block, g.k - b * g.block), r, block);
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
