#include "gguf_blocks.h"

#include "common.h"

namespace qlinear {

namespace {
constexpr GgufBlockInfo kBlocks[] = {{GgufBlock::q4_0, 2 + 16}, {GgufBlock::q8_0, 2 + 32}};

float block_scale(const uint8_t* b) { return half_to_float(static_cast<uint16_t>(b[0] | (b[1] << 8))); }
}  // namespace

const GgufBlockInfo* find_gguf_block(const std::string& name) {
  if (name == "Q4_0") return &kBlocks[0];
  if (name == "Q8_0") return &kBlocks[1];
  return nullptr;
}

void gguf_dequantize_row(const GgufBlockInfo& t, const uint8_t* row, int64_t values, float* out) {
  for (int64_t b = 0; b < values / 32; ++b, row += t.bytes, out += 32) {
    const float d = block_scale(row);
    const uint8_t* q = row + 2;
    if (t.type == GgufBlock::q4_0) {
      // value j: low nibble of byte j (j < 16), high nibble of byte j - 16 (j >= 16); minus 8
      for (int j = 0; j < 16; ++j) {
        out[j] = d * static_cast<float>((q[j] & 0x0F) - 8);
        out[j + 16] = d * static_cast<float>((q[j] >> 4) - 8);
      }
    } else {
      for (int j = 0; j < 32; ++j) out[j] = d * static_cast<float>(static_cast<int8_t>(q[j]));
    }
  }
}

}  // namespace qlinear
