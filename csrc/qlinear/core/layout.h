// Packed weight layouts: how quantized weight codes, scales and offsets sit in memory.
//
// A packed weight is a sequence of *panels*; a panel holds `nr` consecutive output rows (n) over
// the whole K range, so a kernel streams one panel front to back. A panel is a sequence of
// *blocks*, one per `block` consecutive k (the storage block: the weight group, or 256 for
// per-channel weights, whose scale then repeats in every block so that int32 sums stay short):
//
//   block := codes[nr * block * bits / 8] | scale fp16[nr] | offset fp16[nr] (asymmetric only)
//
// Codes are unsigned: asymmetric weights store q (0..15 / 0..255) and dequantize to
// offset + scale * q; symmetric weights store q + zero_point (8 / 128) and dequantize to
// scale * (code - zero_point), the offset being implied (-zero_point * scale, never stored).
//
// Inside a block's codes, k advances in *chunks*; a chunk is one SIMD register of nr x kr bytes:
//   int8 : chunk c holds k = c*kr .. c*kr+kr-1;      byte r*kr + i = code[r][c*kr + i]
//   int4 : chunk c holds k = c*2kr .. c*2kr+2kr-1;   byte r*kr + i = code[r][c*2kr + i]        (low nibble)
//                                                                  | code[r][c*2kr + kr + i] << 4 (high nibble)
// so one byte-wise AND / shift splits an int4 chunk into two int8 chunks, and every 4-byte lane
// of a chunk is one output row times kr consecutive k. That is the operand shape of x86
// VPMADDUBSW + VPMADDWD and VPDPBUSD (u8 weights x s8 activations broadcast 4 bytes at a time)
// and of ARM SDOT by element (a 16-byte half chunk = 4 rows x 4 k against 4 activation bytes
// picked by lane); zipping the 32-bit lanes of an int4 chunk's two nibble halves gives each row
// 8 consecutive k, the operand of ARM SMMLA. So one byte order serves both families (int8 codes
// flipped on ARM, below). Rows past N and k past K are zero bytes with zero
// scales (activations past K are zero, so what code a zero byte means never matters).
//
// nr8_kr4_s8 is nr8_kr4 with every int8 code byte stored with its top bit flipped (code ^ 0x80,
// i.e. code - 128 read as a signed byte): the operand of ARM SDOT / SMMLA / SMULL as loaded, with
// no EOR in the loop (x86's VPDPBUSD wants the unsigned code, so x86 keeps nr8_kr4). int4 bytes
// are the same in both, so an int4 weight is always nr8_kr4 (storage_layout); packed files of one
// family load in the other with their int8 codes flipped (a copy, no re-rounding).
//
// The i8mm level's layouts have kr = 8, so that each 16 bytes are two rows x 8 k, SMMLA's operand:
// nr8_kr8_s8 (int8): chunk c holds k 8c .. 8c + 7, byte r*8 + i = code[r][8c + i] ^ 0x80, the
// operand as loaded; nr8_kr8 (int4): chunk c holds k 16c .. 16c + 15, byte r*8 + i =
// code[r][16c + i] | code[r][16c + 8 + i] << 4, so one AND and one shift give the operands of
// two 8-k steps (nr8_kr4 needs a ZIP per operand as well).
// Which layout a weight is packed in follows the running level (native_layout); a weight of
// another layout runs the kernels of a level that reads it (the i8mm level also reads the dotprod
// level's layouts: files converted on other ARM CPUs), else the scalar ones until it is packed
// again (files: converted at load).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "qlinear/core/common.h"

namespace qlinear {

enum class LayoutId : uint8_t {
  nr8_kr4 = 1,     // 8 rows x 4 k per 32-byte chunk: x86 AVX2 / VNNI / AMX
  nr8_kr4_s8 = 2,  // nr8_kr4, int8 codes stored as code ^ 0x80: ARM NEON / dotprod / fp16
  nr8_kr8_s8 = 3,  // int8 only: 8 rows x 8 k per 64-byte chunk, codes ^ 0x80: ARM i8mm (SMMLA)
  nr8_kr8 = 4,     // int4 only: 8 rows x 16 k per 64-byte chunk: ARM i8mm (SMMLA)
};

// The weight's format: affine int4 / int8 (codes, fp16 scales and offsets per group: the rules of
// docs/semantics.md, sections 1-3) or one of the block formats of GGUF files (block_format.h).
enum class Format : uint8_t {
  affine = 0,
  q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, iq4_nl, iq4_xs, mxfp4, q2_k, q3_k,
};

struct LayoutInfo {
  LayoutId id;
  const char* name;
  int nr;  // output rows per panel
  int kr;  // consecutive k of one row in a chunk
  uint8_t int8_xor;  // int8 codes are stored as code ^ int8_xor (0 or 0x80)
};

const LayoutInfo& layout_info(LayoutId id);
// Looks a layout up by name; returns nullptr if unknown.
const LayoutInfo* find_layout(const std::string& name);
// The base layout of this build's SIMD family (x86 nr8_kr4, ARM nr8_kr4_s8): what the scalar
// level packs in, so that its weights run on the family's levels (the i8mm level packs kr 8).
LayoutId family_layout();
// The layout a weight of `bits` is stored in when `layout` is asked for: int4 weights have no
// flipped variant (nr8_kr4_s8 -> nr8_kr4), kr 8 is nr8_kr8 for int4 and nr8_kr8_s8 for int8.
LayoutId storage_layout(LayoutId layout, int bits);
// What pack_weight produces for a weight of `bits`: the layout the active level's kernels read
// (storage_layout of its table's layout; dispatch.cc).
LayoutId native_layout(int bits);

// Storage block for a semantic group size: the group itself (32..256, multiples of 32), or
// min(round_up(K, 32), 256) for per-channel weights (group_size >= K).
int64_t storage_block(int64_t k, int64_t group_size);

struct WeightPart;

// Everything a kernel needs to walk a packed weight; computed once at pack / load time.
struct WeightGeometry {
  int64_t n = 0, k = 0;       // logical shape [N, K]
  int bits = 4;               // 4 or 8
  bool symmetric = false;
  int64_t group_size = 0;     // semantic group (== K for per-channel)
  int64_t ngroups = 0;        // ceil(K / group_size)
  int64_t block = 0;          // storage block (k per scale entry), multiple of 32
  int64_t nblocks = 0;        // ceil(K / block)
  LayoutId layout = LayoutId::nr8_kr4;
  int nr = 8, kr = 4;
  uint8_t code_xor = 0;       // stored byte = code ^ code_xor (int8 of nr8_kr4_s8 / nr8_kr8_s8: 0x80)
  int64_t npanels = 0;        // ceil(N / nr)
  int64_t code_bytes = 0;     // codes per block: nr * block * bits / 8
  int64_t block_bytes = 0;    // codes + scales (+ offsets)
  int64_t panel_bytes = 0;    // nblocks * block_bytes
  int64_t total_bytes = 0;    // npanels * panel_bytes
  Format format = Format::affine;  // block formats: bits = code bits, block = super-block
  // A weight of parts (rows of other formats one after another, e.g. a fused q / k / v whose
  // tensors a file stores in different types): the parts, each its own geometry and bytes; the
  // fields above then describe the whole (n, k, total_bytes; block: the largest part's).
  std::shared_ptr<const std::vector<WeightPart>> parts;

  bool is_block_format() const { return format != Format::affine; }
  bool is_composite() const { return parts != nullptr; }

  int zero_point() const { return symmetric ? (bits == 4 ? 8 : 128) : 0; }
  int64_t padded_k() const { return nblocks * block; }
};

struct WeightPart {
  WeightGeometry g;
  int64_t row0;    // its first row in the whole
  int64_t offset;  // its first byte in the whole's buffer
};

// The geometry of parts stacked by rows (the same k; none of them composite).
WeightGeometry make_composite_geometry(const std::vector<WeightGeometry>& parts);

// Validates the parameters (throws std::invalid_argument naming the problem) and fills in the
// derived sizes; the layout is storage_layout(layout, bits).
WeightGeometry make_geometry(int64_t n, int64_t k, int bits, int64_t group_size, bool symmetric,
                             LayoutId layout);

}  // namespace qlinear
