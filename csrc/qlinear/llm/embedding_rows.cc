#include "qlinear/llm/embedding_rows.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qlinear/core/common.h"

namespace qlinear {

namespace {
constexpr GgufBlockInfo kBlocks[] = {{GgufBlock::q4_0, 2 + 16}, {GgufBlock::q8_0, 2 + 32}};

float block_scale(const uint8_t* b) { return half_to_float(static_cast<uint16_t>(b[0] | (b[1] << 8))); }

int64_t dtype_bytes(RowDtype t) { return t == RowDtype::float32 ? 4 : 2; }
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

bool parse_row_dtype(const std::string& name, RowDtype* out) {
  if (name == "bfloat16") *out = RowDtype::bfloat16;
  else if (name == "float16") *out = RowDtype::float16;
  else if (name == "float32") *out = RowDtype::float32;
  else return false;
  return true;
}

void read_file_rows(int fd, int64_t offset, RowDtype dtype, int64_t values, const int64_t* ids, int64_t n,
                    float* out) {
  const int64_t row_bytes = values * dtype_bytes(dtype);
  std::vector<uint16_t> half(dtype == RowDtype::float32 ? 0 : static_cast<size_t>(values));
  for (int64_t i = 0; i < n; ++i, out += values) {
    char* dst = dtype == RowDtype::float32 ? reinterpret_cast<char*>(out) : reinterpret_cast<char*>(half.data());
    const int64_t at = offset + ids[i] * row_bytes;
    int64_t got = 0;
    while (got < row_bytes) {
      const ssize_t r = ::pread(fd, dst + got, static_cast<size_t>(row_bytes - got), static_cast<off_t>(at + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw std::runtime_error(std::string("reading an embedding row failed: ") + std::strerror(errno));
      if (r == 0) {
        throw std::invalid_argument("short read of " + std::to_string(row_bytes) + " bytes at " +
                                    std::to_string(at) + " (truncated?)");
      }
      got += r;
    }
    if (dtype == RowDtype::bfloat16) {
      for (int64_t j = 0; j < values; ++j) {
        const uint32_t bits = static_cast<uint32_t>(half[j]) << 16;
        std::memcpy(out + j, &bits, 4);
      }
    } else if (dtype == RowDtype::float16) {
      for (int64_t j = 0; j < values; ++j) out[j] = half_to_float(half[j]);
    }
  }
}

}  // namespace qlinear
