// Block formats: the weight types of GGUF files (K-quants Q2_K .. Q6_K, Q5_0 / Q4_1 / Q5_1,
// IQ4_NL / IQ4_XS, MXFP4) as weight formats of the package, their codes moved from the file, never re-rounded
// (docs/semantics.md, section 6).
//
// Every format is one rule over a *super-block* of S consecutive k of a row (256 for the K-quants
// and IQ4_XS, 32 for the others), cut into sub-blocks of B k (16 or 32):
//
//   w[k] = d * sc[j] * v(c[k]) + m * mn[j]          (k in sub-block j)
//
// c the unsigned code (2 to 6 bits), v(c) = c - zero (zero 0 / 4 / 16 / 32) or a table of int8
// values (IQ4's non-uniform grid, MXFP4's e2m1 values doubled), sc / mn small integers (the
// K-quants' 4-bit, 6-bit or int8 sub-scales and minimums; 1 where a format has none), d and m floats
// (fp16 in the file, MXFP4's e8m0 power of two; m = -dmin for the K-quants, the stored min for
// Q4_1 / Q5_1, 0 without minimums). With int8 activations (scale s_x over the super-block):
//
//   y += s_x * d * sum_j sc[j] * sum_{k in j} xq[k] v(c[k])  +  s_x * m * sum_j mn[j] * sum_{k in j} xq[k]
//
// both sums exact in int32 (the bound: 16 sub-blocks x 127 x 128 x 16 x 127 < 2^31).
//
// Packed layout (the panels of layout.h, 8 rows; block = one super-block of 8 rows):
//   block := low plane | high plane | meta
//   low     : codes of 4 bits and more: c & 15 as int4 chunks of nr8_kr4 (32 bytes = 8 rows x 8 k;
//             low nibbles k 0..3, high nibbles k 4..7): unpacking gives the int8 chunks 2i, 2i + 1
//             of 8 rows x 4 k; of 2 and 3 bits: c & 3, int8 chunks 4g .. 4g + 3 in one 32-byte
//             group (chunk 4g + t at bits 2t of byte i)
//   high    : the bits above the low plane's. One bit (5-bit codes' bit 4, 3-bit codes' bit 2):
//             int8 chunks 8g .. 8g + 7 in one 32-byte group (byte i = sum_t bit(chunk 8g + t,
//             byte i) << t); two bits (6-bit codes' bits 4..5): chunks 4g .. 4g + 3 per group
//             (chunk 4g + t at bits 2t)
//   meta    : the constants of the 8 rows, by kind: d as fp16 [8] (MXFP4: its e8m0 exponent
//             [8]), m as fp16 [8] (formats with minimums: the file's dmin or min), then the
//             sub-scales [sub-block][row] (Q6_K int8; Q2_K the file's bytes, sub-scale | minimum
//             << 4; Q4_K / Q5_K six bits each, scales then minimums; IQ4_XS and Q3_K six bits,
//             before their -32), six-bit entries as 32 bytes of nibbles and 16 of two-bit pairs
//             per 64 (block_format.cc: get6), so that 8 rows' values unpack with a few vector
//             operations
// so a packed weight takes exactly the file's bytes (bits per weight equal to the file's), the
// meta region of 8 rows being 8 x meta_bytes.
#pragma once

#include <cstdint>
#include <string>

#include "qlinear/core/layout.h"

namespace qlinear {

struct FormatInfo {
  Format id;
  const char* name;        // the GGUF type name
  int super;               // k per super-block (the storage block)
  int sub;                 // k per sub-block
  int code_bits;           // 4, 5 or 6
  int zero;                // v(c) = c - zero (lookup formats: 0, v from the table)
  bool lookup;             // v(c) = kTable[c]
  bool has_min;            // the m * mn term
  int file_bytes;          // bytes of one super-block in the file
  int meta_bytes;          // of which not codes (kept per row in the packed block)
  int nsub() const { return super / sub; }
};

const FormatInfo& format_info(Format f);
// Every block format, in enum order.
struct FormatList { const FormatInfo* b; const FormatInfo* e; const FormatInfo* begin() const { return b; } const FormatInfo* end() const { return e; } };
FormatList block_formats();
// By GGUF type name ("Q4_K", ...); nullptr for the affine formats and unknown names.
const FormatInfo* find_format(const std::string& name);
// The int8 values of a lookup format's 16 codes (IQ4_NL / IQ4_XS, MXFP4 x 2).
const int8_t* format_table(Format f);

// The decoded constants of one row's super-block (from its meta bytes).
struct BlockMeta {
  float d = 0.f, m = 0.f;
  int32_t sc[16], mn[16];  // per sub-block
};
// Row r's constants of a packed block.
void decode_meta(const WeightGeometry& g, const uint8_t* block, int r, BlockMeta* out);

// A block format's geometry: `block` = super-block, layout nr8_kr4's panels of 8 rows.
WeightGeometry make_block_geometry(int64_t n, int64_t k, Format format);

// Rows [row0, row0 + rows) of the packed weight from `rows` rows of file blocks at src (each
// g.nblocks blocks: g.k padded to the super-block). Throws std::invalid_argument for bytes that
// do not fit (row count, row size); the codes and meta bytes are moved, nothing is rounded.
void pack_block_rows(const WeightGeometry& g, const uint8_t* src, int64_t rows, int64_t row0,
                     int64_t row_bytes, uint8_t* packed);
// The inverse: rows [row0, row0 + rows) as file blocks.
void unpack_block_rows(const WeightGeometry& g, const uint8_t* packed, int64_t rows, int64_t row0, uint8_t* dst);

// The unsigned codes of row r of a packed block (S values).
void block_codes(const WeightGeometry& g, const uint8_t* block, int r, uint8_t* c);

}  // namespace qlinear
