// Scalar kernels of the block formats (block_format.h): the fallback on every CPU and the oracle
// the SIMD ones are tested against. They follow docs/semantics.md, section 6, literally: the
// integer core per super-block, then one fused multiply-add per term (as the SIMD epilogues), so
// their float results equal the x86 levels' bit for bit.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <mutex>
#include <string>

#include "qlinear/core/block_format.h"
#include "qlinear/kernels/block_kernels.h"

namespace qlinear {
namespace {

constexpr int64_t kRowTile = 16;  // activation rows per pass over a panel's blocks

// The int8 value v(c) of each code of a format.
struct CodeValues {
  int8_t v[64];
  explicit CodeValues(const FormatInfo& f) {
    for (int c = 0; c < 64; ++c) v[c] = static_cast<int8_t>(f.lookup ? format_table(f.id)[c & 15] : c - f.zero);
  }
};

// Row r of super-block b of panel p: its values v(c) and constants.
inline const uint8_t* decode_block(const WeightGeometry& w, const uint8_t* packed, const CodeValues& cv,
                                   int64_t p, int64_t b, int r, int8_t* values, BlockMeta* meta) {
  const uint8_t* block = packed + p * w.panel_bytes + b * w.block_bytes;
  uint8_t codes[256];
  block_codes(w, block, r, codes);
  for (int64_t kk = 0; kk < w.block; ++kk) values[kk] = cv.v[codes[kk]];
  decode_meta(w, block, r, meta);
  return block;
}

void block_int8_matmul(const Int8MatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& w = *a.w;
  const FormatInfo& f = format_info(w.format);
  const CodeValues cv(f);
  int8_t values[256];
  BlockMeta meta;
  for (int64_t p = p0; p < p1; ++p) {
    const int rows = static_cast<int>(std::min<int64_t>(w.nr, w.n - p * w.nr));
    for (int64_t mt = m0; mt < m1; mt += kRowTile) {
      const int64_t mt1 = std::min(m1, mt + kRowTile);
      for (int r = 0; r < rows; ++r) {
        float y[kRowTile] = {};
        for (int64_t b = 0; b < w.nblocks; ++b) {
          decode_block(w, a.packed, cv, p, b, r, values, &meta);
          for (int64_t m = mt; m < mt1; ++m) {
            const int8_t* xq = a.act.q + m * a.act.ldq + b * w.block;
            const int32_t* s16 = a.act.sum16 + m * a.act.ld16 + b * w.block / 16;
            int32_t acc = 0, macc = 0;
            for (int j = 0; j < f.nsub(); ++j) {
              int32_t dot = 0, xsum = 0;
              for (int kk = j * f.sub; kk < (j + 1) * f.sub; ++kk) dot += int32_t(xq[kk]) * values[kk];
              for (int h = j * f.sub / 16; h < (j + 1) * f.sub / 16; ++h) xsum += s16[h];
              acc += meta.sc[j] * dot;
              macc += meta.mn[j] * xsum;
            }
            const float sx = a.act.scale[m * w.nblocks + b];
            float& yy = y[m - mt];
            yy = std::fma(float(acc), meta.d * sx, yy);
            if (f.has_min) yy = std::fma(float(macc), meta.m * sx, yy);
          }
        }
        const int64_t n = p * w.nr + r;
        for (int64_t m = mt; m < mt1; ++m) a.y[m * a.ldy + n] = a.bias ? y[m - mt] + a.bias[n] : y[m - mt];
      }
    }
  }
}

// Float activations: w' = fma(d * sc, v, m * mn) (both products exact), summed per super-block in
// k order, the blocks' sums added in order, times the activations' unscale.
void block_float_matmul(const FloatMatmulArgs& a, int64_t m0, int64_t m1, int64_t p0, int64_t p1) {
  const WeightGeometry& w = *a.w;
  const FormatInfo& f = format_info(w.format);
  const CodeValues cv(f);
  int8_t values[256];
  float wf[256];
  BlockMeta meta;
  for (int64_t p = p0; p < p1; ++p) {
    const int rows = static_cast<int>(std::min<int64_t>(w.nr, w.n - p * w.nr));
    for (int64_t mt = m0; mt < m1; mt += kRowTile) {
      const int64_t mt1 = std::min(m1, mt + kRowTile);
      for (int r = 0; r < rows; ++r) {
        float y[kRowTile] = {};
        for (int64_t b = 0; b < w.nblocks; ++b) {
          decode_block(w, a.packed, cv, p, b, r, values, &meta);
          for (int64_t kk = 0; kk < w.block; ++kk) {
            const int j = int(kk / f.sub);
            wf[kk] = std::fma(meta.d * float(meta.sc[j]), float(values[kk]), f.has_min ? meta.m * float(meta.mn[j]) : 0.f);
          }
          for (int64_t m = mt; m < mt1; ++m) {
            const float* x = a.x + m * a.ldx + b * w.block;
            float s = 0.f;
            for (int64_t kk = 0; kk < w.block; ++kk) s = std::fma(x[kk], wf[kk], s);
            y[m - mt] += s;
          }
        }
        const int64_t n = p * w.nr + r;
        for (int64_t m = mt; m < mt1; ++m) {
          const float v = y[m - mt] * a.unscale;
          a.y[m * a.ldy + n] = a.bias ? v + a.bias[n] : v;
        }
      }
    }
  }
}

}  // namespace

const char* block_kernel_name(const char* scheme, Format f, const char* what, const char* level) {
  static std::mutex mu;
  static std::deque<std::string> names;  // stable addresses
  std::string name = std::string(scheme) + "_" + format_info(f).name + "_" + what + "_" + level;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  std::lock_guard<std::mutex> lock(mu);
  for (const std::string& s : names)
    if (s == name) return s.c_str();
  return names.emplace_back(std::move(name)).c_str();
}

void add_scalar_block_kernels(KernelTable& t) {
  for (const FormatInfo& f : block_formats()) {
    Int8Ukernel k{};
    k.name = block_kernel_name("gemm", f.id, "a8", "scalar"); k.fn = block_int8_matmul; k.bits = f.code_bits; k.format = f.id;
    t.blocks.push_back(k);
    FloatUkernel fk{};
    fk.name = block_kernel_name("gemm", f.id, "f32", "scalar"); fk.fn = block_float_matmul; fk.bits = f.code_bits; fk.format = f.id;
    t.blocks_float.push_back(fk);
  }
}

}  // namespace qlinear
