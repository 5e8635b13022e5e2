// Binds the rows of a GGUF-quantized table (gguf_rows): a quantized token embedding's rows,
// dequantized straight from the mapped file.
#include <string>

#include "bindings/bindings.h"
#include "qlinear/gguf_blocks.h"

namespace qlinear::bindings {
namespace {

py::array_t<float> gguf_rows(const py::array& table, const std::string& type, const py::array& ids) {
  const GgufBlockInfo* t = find_gguf_block(type);
  if (!t) throw py::value_error("gguf_rows reads Q4_0 or Q8_0 rows, not '" + type + "'");
  if (table.dtype().num() != py::dtype::of<uint8_t>().num() || table.ndim() != 2)
    throw py::type_error("table must be a uint8 array [rows, bytes per row]");
  if (!(table.flags() & py::array::c_style)) throw py::value_error("table must be C-contiguous");
  if (ids.dtype().num() != py::dtype::of<int64_t>().num() || ids.ndim() != 1)
    throw py::type_error("ids must be a 1-D int64 array");
  const int64_t rows = table.shape(0), row_bytes = table.shape(1), n = ids.shape(0);
  if (row_bytes % t->bytes) {
    throw py::value_error("a " + type + " row is a whole number of " + std::to_string(t->bytes) +
                          "-byte blocks, got " + std::to_string(row_bytes) + " bytes");
  }
  const int64_t values = row_bytes / t->bytes * 32;
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> idx(ids);
  const int64_t* id = idx.data();
  for (int64_t i = 0; i < n; ++i)
    if (id[i] < 0 || id[i] >= rows)
      throw py::value_error("id " + std::to_string(id[i]) + " is outside the table's " + std::to_string(rows) + " rows");
  py::array_t<float> out({n, values});
  const auto* base = static_cast<const uint8_t*>(table.data());
  float* y = out.mutable_data();
  py::gil_scoped_release release;
  for (int64_t i = 0; i < n; ++i) gguf_dequantize_row(*t, base + id[i] * row_bytes, values, y + i * values);
  return out;
}

}  // namespace

void register_gguf(py::module_& m) {
  m.def("gguf_rows", &gguf_rows, py::arg("table"), py::arg("type"), py::arg("ids"),
        "Rows ids of a GGUF table of type Q4_0 or Q8_0 (uint8 [rows, bytes per row], e.g. a mapped "
        "tensor) as float32 [len(ids), values], equal to gguf.quants.dequantize bit for bit.");
}

}  // namespace qlinear::bindings
