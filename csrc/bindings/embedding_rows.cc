// Binds the readers of embedding rows (gguf_rows, file_rows): a decode step's token row in one
// call, from a GGUF-quantized table mapped in memory or from a float table in a file.
#include <string>

#include "bindings/bindings.h"
#include "qlinear/llm/embedding_rows.h"

namespace qlinear::bindings {
namespace {

// ids as int64, each in [0, rows)
const int64_t* checked_ids(const py::array& ids, int64_t rows) {
  if (ids.dtype().num() != py::dtype::of<int64_t>().num() || ids.ndim() != 1 || !(ids.flags() & py::array::c_style))
    throw py::type_error("ids must be a contiguous 1-D int64 array");
  const auto* id = static_cast<const int64_t*>(ids.data());
  for (int64_t i = 0; i < ids.shape(0); ++i)
    if (id[i] < 0 || id[i] >= rows)
      throw py::value_error("id " + std::to_string(id[i]) + " is outside the table's " + std::to_string(rows) + " rows");
  return id;
}

py::array_t<float> gguf_rows(const py::array& table, const std::string& type, const py::array& ids) {
  const GgufBlockInfo* t = find_gguf_block(type);
  if (!t) throw py::value_error("gguf_rows reads Q4_0 or Q8_0 rows, not '" + type + "'");
  if (table.dtype().num() != py::dtype::of<uint8_t>().num() || table.ndim() != 2)
    throw py::type_error("table must be a uint8 array [rows, bytes per row]");
  if (!(table.flags() & py::array::c_style)) throw py::value_error("table must be C-contiguous");
  const int64_t rows = table.shape(0), row_bytes = table.shape(1), n = ids.shape(0);
  if (row_bytes % t->bytes) {
    throw py::value_error("a " + type + " row is a whole number of " + std::to_string(t->bytes) +
                          "-byte blocks, got " + std::to_string(row_bytes) + " bytes");
  }
  const int64_t* id = checked_ids(ids, rows);
  const int64_t values = row_bytes / t->bytes * 32;
  py::array_t<float> out({n, values});
  const auto* base = static_cast<const uint8_t*>(table.data());
  float* y = out.mutable_data();
  py::gil_scoped_release release;
  for (int64_t i = 0; i < n; ++i) gguf_dequantize_row(*t, base + id[i] * row_bytes, values, y + i * values);
  return out;
}

py::array_t<float> file_rows(int fd, int64_t offset, int64_t rows, int64_t values, const std::string& dtype,
                             const py::array& ids) {
  RowDtype t;
  if (!parse_row_dtype(dtype, &t)) throw py::value_error("file_rows reads bfloat16, float16 or float32 rows, not '" + dtype + "'");
  if (fd < 0 || offset < 0 || rows <= 0 || values <= 0) throw py::value_error("file_rows needs fd, offset >= 0 and rows, values > 0");
  const int64_t* id = checked_ids(ids, rows);
  const int64_t n = ids.shape(0);
  py::array_t<float> out({n, values});
  float* y = out.mutable_data();
  py::gil_scoped_release release;
  read_file_rows(fd, offset, t, values, id, n, y);
  return out;
}

}  // namespace

void register_embedding_rows(py::module_& m) {
  m.def("gguf_rows", &gguf_rows, py::arg("table"), py::arg("type"), py::arg("ids"),
        "Rows ids of a GGUF table of type Q4_0 or Q8_0 (uint8 [rows, bytes per row], e.g. a mapped "
        "tensor) as float32 [len(ids), values], equal to gguf.quants.dequantize bit for bit.");
  m.def("file_rows", &file_rows, py::arg("fd"), py::arg("offset"), py::arg("rows"), py::arg("values"),
        py::arg("dtype"), py::arg("ids"),
        "Rows ids of a [rows, values] table of dtype (bfloat16 / float16 / float32) at byte offset of the "
        "open file fd, read with pread, as float32 [len(ids), values] (widened exactly); ValueError on a "
        "short read.");
}

}  // namespace qlinear::bindings
