#include "qlinear/core/pack.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "qlinear/llm/embedding_rows.h"  // GgufBlockInfo
#include "qlinear/core/layout_access.h"  // read_code (unpack_weight)
#include "qlinear/core/threadpool.h"

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
  if (g.bits == 8) {  // k past len: zero bytes, as the chunks past it (layout.h)
    for (int64_t c = 0; c * kr < len; ++c, out += chunk_bytes)
      for (int64_t i = 0; i < kr; ++i) out[i] = c * kr + i < len ? codes[c * kr + i] ^ g.code_xor : 0;
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
                static_cast<uint8_t>(read_code(g, block, r, kk));
          std::memcpy(out.scale + n * g.ngroups + j, scales + r, 2);
          if (!g.symmetric) std::memcpy(out.offset + n * g.ngroups + j, scales + g.nr + r, 2);
          else out.offset[n * g.ngroups + j] = 0;
        }
      }
    }
  });
}

void pack_gguf_rows_check(const WeightGeometry& g, const GgufBlockInfo& type, int64_t rows, int64_t row0,
                          int64_t row_bytes) {
  const int bits = type.type == GgufBlock::q4_0 ? 4 : 8;
  const std::string what = bits == 4 ? "Q4_0" : "Q8_0";
  if (g.bits != bits || !g.symmetric || g.group_size != 32 || g.block != 32)
    throw std::invalid_argument(what + " rows go into a symmetric int" + std::to_string(bits) +
                                " weight of group 32, not int" + std::to_string(g.bits) + " group " +
                                std::to_string(g.group_size) + (g.symmetric ? " symmetric" : " asymmetric"));
  if (row_bytes != g.k / 32 * type.bytes || g.k % 32)
    throw std::invalid_argument("a row of " + std::to_string(g.k) + " values is " + std::to_string(g.k / 32) +
                                " " + what + " blocks of " + std::to_string(type.bytes) + " bytes, got " +
                                std::to_string(row_bytes) + " bytes");
  if (g.kr != 4 && g.kr != 8)
    throw std::invalid_argument("pack_gguf_rows writes layouts of 4 or 8 k per row and chunk, not " +
                                std::string(layout_info(g.layout).name));
  if (rows < 0 || row0 < 0 || row0 + rows > g.n)
    throw std::invalid_argument("rows [" + std::to_string(row0) + ", " + std::to_string(row0 + rows) +
                                ") are outside the weight's " + std::to_string(g.n));
}

void pack_gguf_rows(const WeightGeometry& g, const GgufBlockInfo& type, const uint8_t* src, int64_t rows,
                    int64_t row0, uint8_t* packed) {
  const bool q4 = type.type == GgufBlock::q4_0;
  const int64_t chunk_bytes = int64_t(g.nr) * g.kr;  // kr 4 or 8 (pack_gguf_rows_check)
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "32-bit lanes hold bytes in memory order");
  // On the calling thread: flash's reader threads move experts side by side, and the pool's
  // workers, woken for so little, would spin on the cores the decode step needs.
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t n = row0 + i, p = n / g.nr;
    const int r = static_cast<int>(n % g.nr);
    const uint8_t* s = src + i * g.nblocks * type.bytes;
    for (int64_t b = 0; b < g.nblocks; ++b, s += type.bytes) {
      uint8_t* block = packed + p * g.panel_bytes + b * g.block_bytes;
      const uint8_t* q = s + 2;
      uint8_t* out = block + r * g.kr;
      std::memcpy(block + g.code_bytes + 2 * r, s, 2);  // d: the scale, as stored (float16)
      // 4 bytes at a time: one 32-bit lane is one row's 4 bytes of a chunk
      uint32_t lane[8];
      std::memcpy(lane, q, q4 ? 16 : 32);
      if (q4 && g.kr == 8) {
        // chunk c holds k 16c .. 16c + 15 as bytes code(16c + j) | code(16c + 8 + j) << 4: with
        // Q4_0's bytes 0-7 (values 0-7 | 16-23) and 8-15 (8-15 | 24-31), chunk 0 is their low
        // nibbles, chunk 1 their high ones
        constexpr uint64_t kLow = 0x0F0F0F0F0F0F0F0Full;
        uint64_t a, h;
        std::memcpy(&a, q, 8);
        std::memcpy(&h, q + 8, 8);
        const uint64_t lo = (a & kLow) | ((h & kLow) << 4), hi = ((a >> 4) & kLow) | (h & ~kLow);
        std::memcpy(out, &lo, 8);
        std::memcpy(out + chunk_bytes, &hi, 8);
      } else if (q4) {
        // chunk c holds k 8c .. 8c + 7 as bytes code(8c + j) | code(8c + 4 + j) << 4 (layout.h);
        // byte j of Q4_0 holds values j (low nibble) and j + 16 (high nibble)
        constexpr uint32_t kLow = 0x0F0F0F0Fu;
        for (int c = 0; c < 2; ++c) {
          const uint32_t a = lane[2 * c], h = lane[2 * c + 1];
          const uint32_t lo = (a & kLow) | ((h & kLow) << 4), hi = ((a >> 4) & kLow) | (h & ~kLow);
          std::memcpy(out + c * chunk_bytes, &lo, 4);
          std::memcpy(out + (c + 2) * chunk_bytes, &hi, 4);
        }
      } else {  // chunk c holds k kr*c .. kr*c + kr - 1; int8 q as q + 128, stored ^ code_xor
        const uint32_t flip = 0x80808080u ^ (0x01010101u * g.code_xor);
        for (int c = 0; c < 8; ++c) {  // 4 k at a time: kr 4, one chunk; kr 8, half of one
          const uint32_t v = lane[c] ^ flip;
          std::memcpy(out + (c * 4 / g.kr) * chunk_bytes + (c * 4) % g.kr, &v, 4);
        }
      }
    }
  }
}

}  // namespace qlinear
