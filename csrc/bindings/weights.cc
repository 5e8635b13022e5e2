// Binds the packed weights: the PackedWeightHandle class, quantize_and_pack, pack_quantized,
// pack_gguf_rows and unpack.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/core/block_format.h"
#include "qlinear/llm/embedding_rows.h"
#include "qlinear/core/layout.h"
#include "qlinear/core/pack.h"

namespace qlinear::bindings {
namespace {

LayoutId layout_by_name(const std::string& name) {
  const LayoutInfo* info = find_layout(name);
  if (info == nullptr) throw std::invalid_argument("unknown packed layout '" + name + "'");
  return info->id;
}

py::array_t<float> as_f32_matrix(py::array w) {
  if (w.ndim() != 2) throw py::value_error("weight must have shape [N, K], got " + std::to_string(w.ndim()) + " dimensions");
  const int num = dtype_num(w);
  if (num != kNpyFloat && num != kNpyHalf && num != 12 /* float64 */)
    throw py::type_error("weight must be float32, float16 or float64, got " + dtype_str(w));
  return py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(w);
}

PackedWeightHandle quantize_and_pack(py::array w_in, int bits, int64_t group_size, bool symmetric,
                                     const std::string& layout) {
  py::array_t<float> w = as_f32_matrix(w_in);
  const WeightGeometry g = make_geometry(w.shape(0), w.shape(1), bits, group_size, symmetric,
                                         layout.empty() ? native_layout(bits) : layout_by_name(layout));
  py::array_t<uint8_t> packed(g.total_bytes);
  {
    py::gil_scoped_release release;
    std::vector<uint8_t> codes(static_cast<size_t>(g.n * g.k));
    std::vector<uint16_t> scale(static_cast<size_t>(g.n * g.ngroups)), offset(scale.size());
    const QuantizedWeight q{codes.data(), scale.data(), offset.data()};
    quantize_weight(g, w.data(), g.k, q);
    pack_weight(g, q, packed.mutable_data());
  }
  return PackedWeightHandle(g, packed);
}

// A C-contiguous array of the given dtype and shape (copied only if not contiguous).
py::array expect(py::array a, const char* name, int num, std::vector<int64_t> shape) {
  if (dtype_num(a) != num) throw py::type_error(std::string(name) + " has dtype " + dtype_str(a));
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = a.shape(i) == shape[i];
  if (!ok) throw py::value_error(std::string(name) + " has the wrong shape");
  return py::array::ensure(a, py::array::c_style);
}

// Packs already-quantized codes (stored form) and fp16 scales / offsets: no rounding happens.
PackedWeightHandle pack_quantized(py::array codes_in, py::array scale_in, py::object offset_in,
                                  int bits, int64_t group_size, bool symmetric, const std::string& layout) {
  if (codes_in.ndim() != 2) throw py::value_error("codes must have shape [N, K]");
  const WeightGeometry g = make_geometry(codes_in.shape(0), codes_in.shape(1), bits, group_size, symmetric,
                                         layout.empty() ? native_layout(bits) : layout_by_name(layout));
  py::array codes = expect(codes_in, "codes", 2 /* uint8 */, {g.n, g.k});
  py::array scale = expect(scale_in, "scale (float16)", kNpyHalf, {g.n, g.ngroups});
  std::vector<uint16_t> zeros;
  py::array offset;
  if (symmetric) {
    zeros.assign(static_cast<size_t>(g.n * g.ngroups), 0);
  } else {
    if (offset_in.is_none()) throw py::value_error("asymmetric weights need offsets");
    offset = expect(py::array::ensure(offset_in), "offset (float16)", kNpyHalf, {g.n, g.ngroups});
  }
  const int qmax = bits == 4 ? 15 : 255;
  const auto* c = static_cast<const uint8_t*>(codes.data());
  uint8_t top = 0;
  for (int64_t i = 0; i < g.n * g.k; ++i) top = std::max(top, c[i]);  // vectorizes
  if (top > qmax) throw py::value_error("codes exceed " + std::to_string(qmax) + " for " + std::to_string(bits) + "-bit weights");
  py::array_t<uint8_t> packed(g.total_bytes);
  const QuantizedWeight q{const_cast<uint8_t*>(c), static_cast<uint16_t*>(const_cast<void*>(scale.data())),
                          symmetric ? zeros.data() : static_cast<uint16_t*>(const_cast<void*>(offset.data()))};
  {
    py::gil_scoped_release release;
    pack_weight(g, q, packed.mutable_data());
  }
  return PackedWeightHandle(g, packed);
}

// GGUF Q4_0 / Q8_0 rows (uint8 [rows, bytes per row]) into rows [row0, row0 + rows) of a packed
// weight's own buffer, in place.
void pack_gguf_rows(const py::array& src, const std::string& type, PackedWeightHandle& dst, int64_t row0) {
  const GgufBlockInfo* t = find_gguf_block(type);
  if (!t) throw py::value_error("pack_gguf_rows moves Q4_0 or Q8_0 rows, not '" + type + "'");
  if (dtype_num(src) != 2 /* uint8 */ || src.ndim() != 2 || !(src.flags() & py::array::c_style))
    throw py::type_error("src must be a C-contiguous uint8 array [rows, bytes per row]");
  const WeightGeometry& g = dst.geom();
  pack_gguf_rows_check(g, *t, src.shape(0), row0, src.shape(1));
  if (!dst.writable()) throw py::value_error("the packed weight's buffer is read-only");
  const auto* s = static_cast<const uint8_t*>(src.data());
  py::gil_scoped_release release;
  qlinear::pack_gguf_rows(g, *t, s, src.shape(0), row0, const_cast<uint8_t*>(dst.data()));
}

const FormatInfo& format_by_name(const std::string& name) {
  const FormatInfo* f = find_format(name);
  if (f == nullptr) {
    std::string known;
    for (const FormatInfo& i : block_formats()) known += std::string(known.empty() ? "" : ", ") + i.name;
    throw py::value_error("unknown block format '" + name + "' (known: " + known + ")");
  }
  return *f;
}

const uint8_t* checked_rows(const py::array& src) {
  if (dtype_num(src) != 2 /* uint8 */ || src.ndim() != 2 || !(src.flags() & py::array::c_style))
    throw py::type_error("src must be a C-contiguous uint8 array [rows, bytes per row]");
  return static_cast<const uint8_t*>(src.data());
}

// A block-format weight [n, k] from file rows (uint8 [n, bytes per row]): codes and constants
// moved, nothing rounded.
PackedWeightHandle pack_blocks(const py::array& src, const std::string& format, int64_t n, int64_t k) {
  const FormatInfo& f = format_by_name(format);
  const WeightGeometry g = make_block_geometry(n, k, f.id);
  const uint8_t* s = checked_rows(src);
  if (src.shape(0) != n) throw py::value_error("src has " + std::to_string(src.shape(0)) + " rows, the weight " + std::to_string(n));
  py::array_t<uint8_t> packed(g.total_bytes);
  std::fill_n(packed.mutable_data(), g.total_bytes, uint8_t(0));
  {
    py::gil_scoped_release release;
    pack_block_rows(g, s, n, 0, src.shape(1), packed.mutable_data());
  }
  return PackedWeightHandle(g, packed);
}

// File rows into rows [row0, row0 + rows) of a block-format weight's own buffer, in place.
void pack_block_rows_into(const py::array& src, PackedWeightHandle& dst, int64_t row0) {
  const uint8_t* s = checked_rows(src);
  const WeightGeometry& g = dst.geom();
  if (!g.is_block_format()) throw py::value_error("the packed weight is not of a block format");
  if (!dst.writable()) throw py::value_error("the packed weight's buffer is read-only");
  py::gil_scoped_release release;
  pack_block_rows(g, s, src.shape(0), row0, src.shape(1), const_cast<uint8_t*>(dst.data()));
}

py::array_t<uint8_t> unpack_blocks(const PackedWeightHandle& w) {
  const WeightGeometry& g = w.geom();
  if (!g.is_block_format()) throw py::value_error("the packed weight is not of a block format");
  py::array_t<uint8_t> out({g.n, g.nblocks * format_info(g.format).file_bytes});
  {
    py::gil_scoped_release release;
    unpack_block_rows(g, w.data(), g.n, 0, out.mutable_data());
  }
  return out;
}

// Weights of the same K stacked by rows as one weight of parts (their bytes copied one after another).
PackedWeightHandle concat_weights(const std::vector<const PackedWeightHandle*>& parts) {
  std::vector<WeightGeometry> geoms;
  for (const PackedWeightHandle* p : parts) {
    if (p == nullptr) throw py::type_error("parts must be PackedWeightHandles");
    if (p->geom().is_composite())
      for (const WeightPart& q : *p->geom().parts) geoms.push_back(q.g);
    else
      geoms.push_back(p->geom());
  }
  const WeightGeometry g = make_composite_geometry(geoms);
  py::array_t<uint8_t> packed(g.total_bytes);
  uint8_t* out = packed.mutable_data();
  for (const PackedWeightHandle* p : parts) {
    std::memcpy(out, p->data(), size_t(p->geom().total_bytes));
    out += p->geom().total_bytes;
  }
  return PackedWeightHandle(g, packed);
}

// A weight of parts over an existing buffer (a mapped file): specs are ("affine", n, k, bits,
// group_size, symmetric, layout) or (block format, n, k); the buffer must hold exactly their bytes.
PackedWeightHandle parts_handle(py::buffer buf, const py::list& specs) {
  std::vector<WeightGeometry> geoms;
  for (const py::handle& h : specs) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
    const std::string fmt = t[0].cast<std::string>();
    if (fmt == "affine") {
      if (t.size() != 7) throw py::value_error("an affine part is (\"affine\", n, k, bits, group_size, symmetric, layout)");
      geoms.push_back(make_geometry(t[1].cast<int64_t>(), t[2].cast<int64_t>(), t[3].cast<int>(), t[4].cast<int64_t>(),
                                    t[5].cast<bool>(), layout_by_name(t[6].cast<std::string>())));
    } else {
      if (t.size() != 3) throw py::value_error("a block-format part is (format, n, k)");
      geoms.push_back(make_block_geometry(t[1].cast<int64_t>(), t[2].cast<int64_t>(), format_by_name(fmt).id));
    }
  }
  return PackedWeightHandle(make_composite_geometry(geoms), buf);
}

py::list weight_parts(const PackedWeightHandle& w) {
  py::list out;
  if (!w.geom().is_composite()) return out;
  for (const WeightPart& p : *w.geom().parts) {
    py::array_t<uint8_t> bytes(p.g.total_bytes);
    std::memcpy(bytes.mutable_data(), w.data() + p.offset, size_t(p.g.total_bytes));
    out.append(PackedWeightHandle(p.g, bytes));
  }
  return out;
}

py::tuple unpack(const PackedWeightHandle& w) {
  const WeightGeometry& g = w.geom();
  if (g.is_composite()) throw py::value_error("a weight of parts unpacks part by part: parts()");
  if (g.is_block_format()) throw py::value_error("a block-format weight unpacks to file blocks: unpack_blocks");
  py::array_t<uint8_t> codes({g.n, g.k});
  py::array scale(py::dtype("float16"), {g.n, g.ngroups});
  py::array offset(py::dtype("float16"), {g.n, g.ngroups});
  const QuantizedWeight q{codes.mutable_data(), static_cast<uint16_t*>(scale.mutable_data()),
                          static_cast<uint16_t*>(offset.mutable_data())};
  {
    py::gil_scoped_release release;
    unpack_weight(g, w.data(), q);
  }
  return py::make_tuple(codes, scale, g.symmetric ? py::object(py::none()) : py::object(offset));
}

}  // namespace

void register_weights(py::module_& m) {
  py::class_<PackedWeightHandle>(m, "PackedWeightHandle")
      .def(py::init([](py::buffer buf, int64_t n, int64_t k, int bits, int64_t group_size,
                       bool symmetric, const std::string& layout) {
             return PackedWeightHandle(make_geometry(n, k, bits, group_size, symmetric, layout_by_name(layout)), buf);
           }),
           py::arg("buffer"), py::arg("n"), py::arg("k"), py::arg("bits"), py::arg("group_size"),
           py::arg("symmetric"), py::arg("layout"))
      .def(py::init([](py::buffer buf, int64_t n, int64_t k, const std::string& format) {
             return PackedWeightHandle(make_block_geometry(n, k, format_by_name(format).id), buf);
           }),
           py::arg("buffer"), py::arg("n"), py::arg("k"), py::arg("format"))
      .def_property_readonly("format", [](const PackedWeightHandle& w) {
        if (w.geom().is_composite()) return std::string("parts");
        return w.geom().is_block_format() ? std::string(format_info(w.geom().format).name) : std::string("affine");
      })
      .def_property_readonly("n", [](const PackedWeightHandle& w) { return w.geom().n; })
      .def_property_readonly("k", [](const PackedWeightHandle& w) { return w.geom().k; })
      .def_property_readonly("bits", [](const PackedWeightHandle& w) { return w.geom().bits; })
      .def_property_readonly("group_size", [](const PackedWeightHandle& w) { return w.geom().group_size; })
      .def_property_readonly("block", [](const PackedWeightHandle& w) { return w.geom().block; })
      .def_property_readonly("symmetric", [](const PackedWeightHandle& w) { return w.geom().symmetric; })
      .def_property_readonly("layout", [](const PackedWeightHandle& w) { return std::string(layout_info(w.geom().layout).name); })
      .def_property_readonly("nbytes", [](const PackedWeightHandle& w) { return w.geom().total_bytes; })
      .def_property_readonly("buffer", &PackedWeightHandle::owner);

  m.def("quantize_and_pack", &quantize_and_pack, py::arg("w"), py::arg("bits"), py::arg("group_size"),
        py::arg("symmetric"), py::arg("layout") = "");
  m.def("pack_quantized", &pack_quantized, py::arg("codes"), py::arg("scale"), py::arg("offset"),
        py::arg("bits"), py::arg("group_size"), py::arg("symmetric"), py::arg("layout") = "");
  m.def("pack_gguf_rows", &pack_gguf_rows, py::arg("src"), py::arg("type"), py::arg("dst"), py::arg("row0") = 0,
        "Moves GGUF Q4_0 / Q8_0 rows (uint8 [rows, bytes per row]) into rows [row0, row0 + rows) of the "
        "packed weight dst (symmetric, group 32, int4 / int8), in place; no rounding.");
  m.def("unpack", &unpack);
  m.def("pack_blocks", &pack_blocks, py::arg("src"), py::arg("format"), py::arg("n"), py::arg("k"),
        "A block-format weight [n, k] from file rows (uint8 [n, bytes per row]); nothing rounded.");
  m.def("pack_block_rows", &pack_block_rows_into, py::arg("src"), py::arg("dst"), py::arg("row0") = 0);
  m.def("unpack_blocks", &unpack_blocks, "A block-format weight's rows as file blocks (uint8 [n, bytes per row]).");
  m.def("concat_weights", &concat_weights, py::arg("parts"),
        "Weights of the same K stacked by rows as one weight of parts (formats may differ).");
  m.def("parts_handle", &parts_handle, py::arg("buffer"), py::arg("specs"));
  m.def("weight_parts", &weight_parts, "A weight of parts' parts (copies), or [] for a plain weight.");
  m.def("block_formats", [] {
    py::dict d;
    for (const FormatInfo& f : block_formats())
      d[f.name] = py::dict(py::arg("super") = f.super, py::arg("sub") = f.sub, py::arg("code_bits") = f.code_bits,
                           py::arg("file_bytes") = f.file_bytes, py::arg("lookup") = f.lookup, py::arg("has_min") = f.has_min);
    return d;
  });
}

}  // namespace qlinear::bindings
