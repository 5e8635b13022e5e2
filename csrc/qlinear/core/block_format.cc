#include "qlinear/core/block_format.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "qlinear/core/common.h"

namespace qlinear {

namespace {

// name, super, sub, code bits, zero, lookup, has_min, file bytes, meta bytes
const FormatInfo kFormats[] = {
    {Format::q4_1, "Q4_1", 32, 32, 4, 0, false, true, 20, 4},
    {Format::q5_0, "Q5_0", 32, 32, 5, 16, false, false, 22, 2},
    {Format::q5_1, "Q5_1", 32, 32, 5, 0, false, true, 24, 4},
    {Format::q4_k, "Q4_K", 256, 32, 4, 0, false, true, 144, 16},
    {Format::q5_k, "Q5_K", 256, 32, 5, 0, false, true, 176, 16},
    {Format::q6_k, "Q6_K", 256, 16, 6, 32, false, false, 210, 18},
    {Format::iq4_nl, "IQ4_NL", 32, 32, 4, 0, true, false, 18, 2},
    {Format::iq4_xs, "IQ4_XS", 256, 32, 4, 0, true, false, 136, 8},
    {Format::mxfp4, "MXFP4", 32, 32, 4, 0, true, false, 17, 1},
    {Format::q2_k, "Q2_K", 256, 16, 2, 0, false, true, 84, 20},
    {Format::q3_k, "Q3_K", 256, 16, 3, 4, false, false, 110, 14},
};

const int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t kMxfp4x2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

inline uint16_t u16(const uint8_t* p) { uint16_t v; std::memcpy(&v, p, 2); return v; }
inline uint32_t u32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

// The K-quants' 6-bit sub-scale and minimum j of the 12 packed bytes q (llama.cpp's
// get_scale_min_k4), and its inverse.
inline void scale_min_k4(int j, const uint8_t* q, int32_t* sc, int32_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}
inline void put_scale_min_k4(const int32_t* sc, const int32_t* mn, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = uint8_t((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    q[j + 8] = uint8_t((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
  }
}

// 64 six-bit entries of a panel block (entry i = sub-block i / 8, row i % 8): 32 bytes of low
// nibbles (entry i and i + 32 in one byte), then 16 bytes of high pairs (entries i, i + 16,
// i + 32, i + 48 at bits 0, 2, 4, 6): one AND / shift per 32 entries unpacks them.
inline int32_t get6(const uint8_t* p, int i) {
  const int lo = (p[i % 32] >> (4 * (i / 32))) & 15;
  const int hi = (p[32 + i % 16] >> (2 * (i / 16))) & 3;
  return lo | hi << 4;
}
inline void put6(uint8_t* p, int i, int32_t v) {
  uint8_t& lo = p[i % 32];
  const int ls = 4 * (i / 32);
  lo = uint8_t((lo & ~(15 << ls)) | (v & 15) << ls);
  uint8_t& hi = p[32 + i % 16];
  const int hs = 2 * (i / 16);
  hi = uint8_t((hi & ~(3 << hs)) | ((v >> 4) & 3) << hs);
}

// Q3_K's sub-scale j of its 12 packed bytes: low nibbles in bytes 0..7 (j and j + 8 in one),
// the high pairs in bytes 8..11 (j, j + 4, j + 8, j + 12 at bits 0, 2, 4, 6).
inline int32_t q3k_scale(const uint8_t* s, int j) {
  return ((s[j % 8] >> (4 * (j / 8))) & 15) | ((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4;
}

// A file block's constants as stored: fp16 bits of d and m (or MXFP4's exponent in d), the
// integer sub-scales and minimums before any offset (IQ4_XS: ls, 0..63).
struct RawMeta {
  uint16_t d = 0, m = 0;
  int32_t sc[16] = {}, mn[16] = {};
};

RawMeta read_file_meta(Format f, const uint8_t* b) {
  RawMeta r;
  switch (f) {
    case Format::mxfp4: r.d = b[0]; break;
    case Format::q5_0: case Format::iq4_nl: r.d = u16(b); break;
    case Format::q4_1: case Format::q5_1: r.d = u16(b); r.m = u16(b + 2); break;
    case Format::q4_k: case Format::q5_k:
      r.d = u16(b); r.m = u16(b + 2);
      for (int j = 0; j < 8; ++j) scale_min_k4(j, b + 4, &r.sc[j], &r.mn[j]);
      break;
    case Format::q6_k:
      for (int j = 0; j < 16; ++j) r.sc[j] = static_cast<int8_t>(b[192 + j]);
      r.d = u16(b + 208);
      break;
    case Format::q2_k:  // scales[16] (sub-scale | minimum << 4), qs[64], d, dmin
      for (int j = 0; j < 16; ++j) { r.sc[j] = b[j] & 15; r.mn[j] = b[j] >> 4; }
      r.d = u16(b + 80); r.m = u16(b + 82);
      break;
    case Format::q3_k:  // hmask[32], qs[64], scales[12] (16 six-bit values, ls before its -32), d
      for (int j = 0; j < 16; ++j) r.sc[j] = q3k_scale(b + 96, j);
      r.d = u16(b + 108);
      break;
    case Format::iq4_xs: {
      r.d = u16(b);
      const uint16_t h = u16(b + 2);
      for (int ib = 0; ib < 8; ++ib) r.sc[ib] = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((h >> (2 * ib)) & 3) << 4);
      break;
    }
    case Format::affine: throw std::logic_error("not a block format");
  }
  return r;
}

void write_file_meta(Format f, const RawMeta& r, uint8_t* b) {
  switch (f) {
    case Format::mxfp4: b[0] = uint8_t(r.d); break;
    case Format::q5_0: case Format::iq4_nl: std::memcpy(b, &r.d, 2); break;
    case Format::q4_1: case Format::q5_1: std::memcpy(b, &r.d, 2); std::memcpy(b + 2, &r.m, 2); break;
    case Format::q4_k: case Format::q5_k:
      std::memcpy(b, &r.d, 2); std::memcpy(b + 2, &r.m, 2);
      put_scale_min_k4(r.sc, r.mn, b + 4);
      break;
    case Format::q6_k:
      for (int j = 0; j < 16; ++j) b[192 + j] = uint8_t(static_cast<int8_t>(r.sc[j]));
      std::memcpy(b + 208, &r.d, 2);
      break;
    case Format::q2_k:
      for (int j = 0; j < 16; ++j) b[j] = uint8_t((r.sc[j] & 15) | (r.mn[j] & 15) << 4);
      std::memcpy(b + 80, &r.d, 2); std::memcpy(b + 82, &r.m, 2);
      break;
    case Format::q3_k:
      std::memset(b + 96, 0, 12);
      for (int j = 0; j < 16; ++j) {
        b[96 + j % 8] = uint8_t(b[96 + j % 8] | (r.sc[j] & 15) << (4 * (j / 8)));
        b[104 + j % 4] = uint8_t(b[104 + j % 4] | ((r.sc[j] >> 4) & 3) << (2 * (j / 4)));
      }
      std::memcpy(b + 108, &r.d, 2);
      break;
    case Format::iq4_xs: {
      std::memcpy(b, &r.d, 2);
      uint16_t h = 0;
      for (int ib = 0; ib < 8; ++ib) h = uint16_t(h | ((r.sc[ib] >> 4) & 3) << (2 * ib));
      std::memcpy(b + 2, &h, 2);
      for (int i = 0; i < 4; ++i) b[4 + i] = uint8_t((r.sc[2 * i] & 15) | (r.sc[2 * i + 1] & 15) << 4);
      break;
    }
    case Format::affine: throw std::logic_error("not a block format");
  }
}

// Row r's constants in / out of a panel block's meta region (block_format.h, meta_layout).
void put_panel_meta(const WeightGeometry& g, uint8_t* block, int r, const RawMeta& m) {
  uint8_t* p = block + g.code_bytes;
  const Format f = g.format;
  if (f == Format::mxfp4) { p[r] = uint8_t(m.d); return; }
  std::memcpy(p + 2 * r, &m.d, 2);
  if (format_info(f).has_min) std::memcpy(p + 16 + 2 * r, &m.m, 2);
  if (f == Format::q2_k) {
    for (int j = 0; j < 16; ++j) p[32 + 8 * j + r] = uint8_t((m.sc[j] & 15) | (m.mn[j] & 15) << 4);
  } else if (f == Format::q3_k) {
    for (int j = 0; j < 16; ++j) put6(p + 16 + 48 * (j / 8), 8 * (j % 8) + r, m.sc[j]);
  } else if (f == Format::q4_k || f == Format::q5_k) {
    for (int j = 0; j < 8; ++j) { put6(p + 32, 8 * j + r, m.sc[j]); put6(p + 80, 8 * j + r, m.mn[j]); }
  } else if (f == Format::q6_k) {
    for (int j = 0; j < 16; ++j) p[16 + 8 * j + r] = uint8_t(static_cast<int8_t>(m.sc[j]));
  } else if (f == Format::iq4_xs) {
    for (int j = 0; j < 8; ++j) put6(p + 16, 8 * j + r, m.sc[j]);
  }
}

RawMeta get_panel_meta(const WeightGeometry& g, const uint8_t* block, int r) {
  const uint8_t* p = block + g.code_bytes;
  const Format f = g.format;
  RawMeta m;
  if (f == Format::mxfp4) { m.d = p[r]; return m; }
  m.d = u16(p + 2 * r);
  if (format_info(f).has_min) m.m = u16(p + 16 + 2 * r);
  if (f == Format::q2_k) {
    for (int j = 0; j < 16; ++j) { m.sc[j] = p[32 + 8 * j + r] & 15; m.mn[j] = p[32 + 8 * j + r] >> 4; }
  } else if (f == Format::q3_k) {
    for (int j = 0; j < 16; ++j) m.sc[j] = get6(p + 16 + 48 * (j / 8), 8 * (j % 8) + r);
  } else if (f == Format::q4_k || f == Format::q5_k) {
    for (int j = 0; j < 8; ++j) { m.sc[j] = get6(p + 32, 8 * j + r); m.mn[j] = get6(p + 80, 8 * j + r); }
  } else if (f == Format::q6_k) {
    for (int j = 0; j < 16; ++j) m.sc[j] = static_cast<int8_t>(p[16 + 8 * j + r]);
  } else if (f == Format::iq4_xs) {
    for (int j = 0; j < 8; ++j) m.sc[j] = get6(p + 16, 8 * j + r);
  }
  return m;
}

float mxfp4_half_scale(uint8_t e) {  // 2^(e - 127), halved for the doubled values: 2^(e - 128)
  return float_of(e >= 2 ? uint32_t(e - 1) << 23 : (e == 1 ? 0x00400000u : 0x00200000u));
}

// The unsigned codes of one file block (S values).
void codes_from_file(Format f, const uint8_t* b, uint8_t* c) {
  switch (f) {
    case Format::q4_1: case Format::iq4_nl: case Format::mxfp4: {
      const uint8_t* qs = b + (f == Format::q4_1 ? 4 : f == Format::iq4_nl ? 2 : 1);
      for (int j = 0; j < 16; ++j) { c[j] = qs[j] & 15; c[j + 16] = qs[j] >> 4; }
      return;
    }
    case Format::q5_0: case Format::q5_1: {
      const int off = f == Format::q5_0 ? 2 : 4;
      const uint32_t qh = u32(b + off);
      const uint8_t* qs = b + off + 4;
      for (int j = 0; j < 16; ++j) {
        c[j] = uint8_t((qs[j] & 15) | ((qh >> j) & 1) << 4);
        c[j + 16] = uint8_t((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
      }
      return;
    }
    case Format::q4_k: case Format::q5_k: {
      const bool five = f == Format::q5_k;
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + 16 + (five ? 32 : 0);
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const uint8_t q = qs[32 * j + l];
          c[64 * j + l] = uint8_t((q & 15) | (five ? ((qh[l] >> (2 * j)) & 1) << 4 : 0));
          c[64 * j + 32 + l] = uint8_t((q >> 4) | (five ? ((qh[l] >> (2 * j + 1)) & 1) << 4 : 0));
        }
      return;
    }
    case Format::q6_k: {
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = b + 64 * n;
        const uint8_t* qh = b + 128 + 32 * n;
        uint8_t* o = c + 128 * n;
        for (int l = 0; l < 32; ++l) {
          o[l] = uint8_t((ql[l] & 15) | ((qh[l] >> 0) & 3) << 4);
          o[l + 32] = uint8_t((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
          o[l + 64] = uint8_t((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
          o[l + 96] = uint8_t((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
        }
      }
      return;
    }
    case Format::iq4_xs: {
      const uint8_t* qs = b + 8;
      for (int ib = 0; ib < 8; ++ib)
        for (int j = 0; j < 16; ++j) {
          c[32 * ib + j] = qs[16 * ib + j] & 15;
          c[32 * ib + 16 + j] = qs[16 * ib + j] >> 4;
        }
      return;
    }
    case Format::q2_k: case Format::q3_k: {  // k 128n + 32j + l: bits 2j of qs[32n + l]; Q3_K's bit 2 in hmask[l] bit 4n + j
      const bool three = f == Format::q3_k;
      const uint8_t* qs = b + (three ? 32 : 16);
      for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l)
            c[128 * n + 32 * j + l] = uint8_t(((qs[32 * n + l] >> (2 * j)) & 3) | (three ? ((b[l] >> (4 * n + j)) & 1) << 2 : 0));
      return;
    }
    case Format::affine: break;
  }
  throw std::logic_error("codes_from_file: not a block format");
}

// The inverse of codes_from_file for the code bytes (the meta bytes are written by the caller).
void codes_to_file(Format f, const uint8_t* c, uint8_t* b) {
  switch (f) {
    case Format::q4_1: case Format::iq4_nl: case Format::mxfp4: {
      uint8_t* qs = b + (f == Format::q4_1 ? 4 : f == Format::iq4_nl ? 2 : 1);
      for (int j = 0; j < 16; ++j) qs[j] = uint8_t((c[j] & 15) | (c[j + 16] & 15) << 4);
      return;
    }
    case Format::q5_0: case Format::q5_1: {
      const int off = f == Format::q5_0 ? 2 : 4;
      uint32_t qh = 0;
      uint8_t* qs = b + off + 4;
      for (int j = 0; j < 16; ++j) {
        qs[j] = uint8_t((c[j] & 15) | (c[j + 16] & 15) << 4);
        qh |= uint32_t((c[j] >> 4) & 1) << j | uint32_t((c[j + 16] >> 4) & 1) << (j + 16);
      }
      std::memcpy(b + off, &qh, 4);
      return;
    }
    case Format::q4_k: case Format::q5_k: {
      const bool five = f == Format::q5_k;
      uint8_t* qh = b + 16;
      uint8_t* qs = b + 16 + (five ? 32 : 0);
      if (five) std::memset(qh, 0, 32);
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          const uint8_t lo = c[64 * j + l], hi = c[64 * j + 32 + l];
          qs[32 * j + l] = uint8_t((lo & 15) | (hi & 15) << 4);
          if (five) qh[l] |= uint8_t(((lo >> 4) & 1) << (2 * j) | ((hi >> 4) & 1) << (2 * j + 1));
        }
      return;
    }
    case Format::q6_k: {
      for (int n = 0; n < 2; ++n) {
        uint8_t* ql = b + 64 * n;
        uint8_t* qh = b + 128 + 32 * n;
        const uint8_t* o = c + 128 * n;
        for (int l = 0; l < 32; ++l) {
          ql[l] = uint8_t((o[l] & 15) | (o[l + 64] & 15) << 4);
          ql[l + 32] = uint8_t((o[l + 32] & 15) | (o[l + 96] & 15) << 4);
          qh[l] = uint8_t((o[l] >> 4) | (o[l + 32] >> 4) << 2 | (o[l + 64] >> 4) << 4 | (o[l + 96] >> 4) << 6);
        }
      }
      return;
    }
    case Format::iq4_xs: {
      uint8_t* qs = b + 8;
      for (int ib = 0; ib < 8; ++ib)
        for (int j = 0; j < 16; ++j) qs[16 * ib + j] = uint8_t((c[32 * ib + j] & 15) | (c[32 * ib + 16 + j] & 15) << 4);
      return;
    }
    case Format::q2_k: case Format::q3_k: {
      const bool three = f == Format::q3_k;
      uint8_t* qs = b + (three ? 32 : 16);
      std::memset(qs, 0, 64);
      if (three) std::memset(b, 0, 32);
      for (int n = 0; n < 2; ++n)
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) {
            const uint8_t v = c[128 * n + 32 * j + l];
            qs[32 * n + l] = uint8_t(qs[32 * n + l] | (v & 3) << (2 * j));
            if (three) b[l] = uint8_t(b[l] | ((v >> 2) & 1) << (4 * n + j));
          }
      return;
    }
    case Format::affine: break;
  }
  throw std::logic_error("codes_to_file: not a block format");
}

// A code plane of `bits` (1, 2 or 4) bits per code: int8 chunk `chunk` (8 rows x 4 k) is in
// 32-byte group chunk / (8 / bits), byte r * 4 + i, at bit bits * (chunk % (8 / bits)).
inline int plane_get(const uint8_t* plane, int bits, int64_t chunk, int r, int i) {
  const int per = 8 / bits;
  return (plane[(chunk / per) * 32 + r * 4 + i] >> (bits * (chunk % per))) & ((1 << bits) - 1);
}
inline void plane_put(uint8_t* plane, int bits, int64_t chunk, int r, int i, int v) {
  const int per = 8 / bits, s = int(bits * (chunk % per)), mask = (1 << bits) - 1;
  uint8_t& b = plane[(chunk / per) * 32 + r * 4 + i];
  b = uint8_t((b & ~(mask << s)) | (v & mask) << s);
}
// The low bits' plane (nibbles; two-bit codes below 4 bits) and the high bits' after it.
inline int low_bits(const FormatInfo& f) { return f.code_bits >= 4 ? 4 : 2; }
inline int64_t low_plane_bytes(const WeightGeometry& g, const FormatInfo& f) { return int64_t(g.nr) * f.super * low_bits(f) / 8; }

}  // namespace

const FormatInfo& format_info(Format f) {
  for (const auto& i : kFormats)
    if (i.id == f) return i;
  throw std::invalid_argument("not a block format: " + std::to_string(int(f)));
}

FormatList block_formats() { return {std::begin(kFormats), std::end(kFormats)}; }

const FormatInfo* find_format(const std::string& name) {
  for (const auto& i : kFormats)
    if (name == i.name) return &i;
  return nullptr;
}

const int8_t* format_table(Format f) {
  return f == Format::mxfp4 ? kMxfp4x2 : kIq4nl;
}

void decode_meta(const WeightGeometry& g, const uint8_t* block, int r, BlockMeta* out) {
  const FormatInfo& f = format_info(g.format);
  const RawMeta raw = get_panel_meta(g, block, r);
  for (int j = 0; j < f.nsub(); ++j) {
    out->sc[j] = f.nsub() == 1 ? 1 : raw.sc[j] - (g.format == Format::iq4_xs || g.format == Format::q3_k ? 32 : 0);
    out->mn[j] = f.nsub() == 1 ? 1 : raw.mn[j];
  }
  out->d = g.format == Format::mxfp4 ? mxfp4_half_scale(uint8_t(raw.d)) : half_to_float(raw.d);
  out->m = !f.has_min ? 0.f : f.super == 256 ? -half_to_float(raw.m) : half_to_float(raw.m);
}

WeightGeometry make_block_geometry(int64_t n, int64_t k, Format format) {
  const FormatInfo& f = format_info(format);
  if (n <= 0 || k <= 0)
    throw std::invalid_argument("weight must be non-empty, got shape [" + std::to_string(n) + ", " + std::to_string(k) + "]");
  if (n > (int64_t(1) << 31) || k > (int64_t(1) << 31))
    throw std::invalid_argument("weight dimensions must be below 2^31");
  WeightGeometry g;
  g.n = n; g.k = k; g.bits = f.code_bits; g.symmetric = false;
  g.group_size = f.super; g.block = f.super;
  g.nblocks = g.ngroups = ceil_div(k, f.super);
  g.layout = LayoutId::nr8_kr4; g.nr = 8; g.kr = 4;
  g.npanels = ceil_div(n, g.nr);
  g.code_bytes = int64_t(g.nr) * f.super * f.code_bits / 8;
  g.block_bytes = g.code_bytes + int64_t(g.nr) * f.meta_bytes;
  g.panel_bytes = g.nblocks * g.block_bytes;
  g.total_bytes = g.npanels * g.panel_bytes;
  g.format = format;
  return g;
}

void block_codes(const WeightGeometry& g, const uint8_t* block, int r, uint8_t* c) {
  const FormatInfo& f = format_info(g.format);
  const int lo = low_bits(f), hi = f.code_bits - lo;
  const uint8_t* high = block + low_plane_bytes(g, f);
  for (int64_t kk = 0; kk < f.super; ++kk) {
    const int64_t chunk = kk / 4;
    const int i = int(kk % 4);
    int v = plane_get(block, lo, chunk, r, i);
    if (hi) v |= plane_get(high, hi, chunk, r, i) << lo;
    c[kk] = uint8_t(v);
  }
}

void pack_block_rows(const WeightGeometry& g, const uint8_t* src, int64_t rows, int64_t row0,
                     int64_t row_bytes, uint8_t* packed) {
  const FormatInfo& f = format_info(g.format);
  if (row_bytes != g.nblocks * f.file_bytes)
    throw std::invalid_argument(std::string(f.name) + " rows of " + std::to_string(g.k) + " values take " +
                                std::to_string(g.nblocks * f.file_bytes) + " bytes, got rows of " + std::to_string(row_bytes));
  if (rows < 0 || row0 < 0 || row0 + rows > g.n)
    throw std::invalid_argument("rows [" + std::to_string(row0) + ", " + std::to_string(row0 + rows) +
                                ") do not fit a weight of " + std::to_string(g.n) + " rows");
  const int lo = low_bits(f), hi = f.code_bits - lo;
  uint8_t c[256];
  for (int64_t row = row0; row < row0 + rows; ++row) {
    const int64_t p = row / g.nr;
    const int r = int(row % g.nr);
    for (int64_t b = 0; b < g.nblocks; ++b) {
      const uint8_t* fb = src + (row - row0) * row_bytes + b * f.file_bytes;
      uint8_t* block = packed + p * g.panel_bytes + b * g.block_bytes;
      uint8_t* high = block + low_plane_bytes(g, f);
      const int nibble_off = g.format == Format::mxfp4 ? 1 : g.format == Format::iq4_nl ? 2 : g.format == Format::q4_1 ? 4 : 0;
      if (nibble_off) {  // 32 nibbles, value j low and j + 16 high in byte j: the panel's bytes straight from them
        const uint8_t* qs = fb + nibble_off;
        for (int i = 0; i < 4; ++i) {
          block[r * 4 + i] = uint8_t((qs[i] & 15) | (qs[4 + i] & 15) << 4);
          block[32 + r * 4 + i] = uint8_t((qs[8 + i] & 15) | (qs[12 + i] & 15) << 4);
          block[64 + r * 4 + i] = uint8_t(qs[i] >> 4 | (qs[4 + i] & 0xF0));
          block[96 + r * 4 + i] = uint8_t(qs[8 + i] >> 4 | (qs[12 + i] & 0xF0));
        }
      } else {
        codes_from_file(g.format, fb, c);
      }
      if (lo == 4 && !nibble_off) {  // a row's nibble bytes whole (both nibbles are its own): chunks 2q and 2q + 1 in one
        for (int64_t q = 0; q < f.super / 8; ++q)
          for (int i = 0; i < 4; ++i) block[q * 32 + r * 4 + i] = uint8_t((c[8 * q + i] & 15) | (c[8 * q + 4 + i] & 15) << 4);
      }
      for (int64_t kk = 0; !nibble_off && (lo != 4 || hi) && kk < f.super; ++kk) {
        const int64_t chunk = kk / 4;
        const int i = int(kk % 4);
        if (lo != 4) plane_put(block, lo, chunk, r, i, c[kk]);
        if (hi) plane_put(high, hi, chunk, r, i, c[kk] >> lo);
      }
      if (g.format == Format::mxfp4) {  // its one meta byte, the E8M0 exponent
        if (fb[0] == 0xFF)
          throw std::invalid_argument("MXFP4 block " + std::to_string(b) + " of row " + std::to_string(row) +
                                      " has a scale that is NaN or infinite");
        block[g.code_bytes + r] = fb[0];
        continue;
      }
      const RawMeta meta = read_file_meta(g.format, fb);
      // MXFP4's E8M0 scale has no infinity; 0xFF is its NaN (OCP MX spec).
      const float d = g.format == Format::mxfp4 ? (meta.d == 0xFF ? NAN : 1.f) : half_to_float(meta.d);
      if (!std::isfinite(d) || !std::isfinite(half_to_float(meta.m)))
        throw std::invalid_argument(std::string(f.name) + " block " + std::to_string(b) + " of row " + std::to_string(row) +
                                    " has a scale that is NaN or infinite");
      put_panel_meta(g, block, r, meta);
    }
  }
}

void unpack_block_rows(const WeightGeometry& g, const uint8_t* packed, int64_t rows, int64_t row0, uint8_t* dst) {
  const FormatInfo& f = format_info(g.format);
  if (rows < 0 || row0 < 0 || row0 + rows > g.n) throw std::invalid_argument("rows out of range");
  uint8_t c[256];
  for (int64_t row = row0; row < row0 + rows; ++row) {
    const int64_t p = row / g.nr;
    const int r = int(row % g.nr);
    for (int64_t b = 0; b < g.nblocks; ++b) {
      uint8_t* fb = dst + (row - row0) * g.nblocks * f.file_bytes + b * f.file_bytes;
      const uint8_t* block = packed + p * g.panel_bytes + b * g.block_bytes;
      block_codes(g, block, r, c);
      codes_to_file(g.format, c, fb);
      write_file_meta(g.format, get_panel_meta(g, block, r), fb);
    }
  }
}

}  // namespace qlinear
