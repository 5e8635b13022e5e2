// Binds the matmuls over packed weights: matmul_int8 / matmul_float / matmul_float16_twin,
// quantize_activation, kernel_info, and the per-kernel test entry points _ukernels / _run_ukernel
// (one micro-kernel of one level through the same checks).
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/core/cpu.h"
#include "qlinear/core/kernels.h"
#include "qlinear/core/layout.h"
#include "qlinear/core/matmul.h"

namespace qlinear::bindings {
namespace {

// Activations: float32 or float16, [K] or [M, K], unit inner stride (else copied).
struct ActView {
  py::array arr;  // holds a copy if one was needed
  DType dtype;
  int64_t m, k, ldx;
  bool vector;
};

ActView view_activations(py::array x, int64_t k_expected, const char* what) {
  const int num = dtype_num(x);
  if (num != kNpyFloat && num != kNpyHalf)
    throw py::type_error(std::string(what) + " must be float32 or float16, got " + dtype_str(x));
  if (x.ndim() != 1 && x.ndim() != 2)
    throw py::value_error(std::string(what) + " must have shape [K] or [M, K], got " +
                          std::to_string(x.ndim()) + " dimensions");
  const int64_t item = x.itemsize();
  const bool vector = x.ndim() == 1;
  const int64_t k = x.shape(x.ndim() - 1), m = vector ? 1 : x.shape(0);
  if (k_expected >= 0 && k != k_expected)
    throw py::value_error(std::string(what) + " has K = " + std::to_string(k) +
                          " but the weight has K = " + std::to_string(k_expected));
  if (k == 0) throw py::value_error(std::string(what) + " has K = 0");
  bool ok = x.strides(x.ndim() - 1) == item || k == 1;
  if (!vector) ok = ok && x.strides(0) >= 0 && x.strides(0) % item == 0;
  if (!ok) x = py::array::ensure(x, py::array::c_style);
  const int64_t ldx = vector || m == 1 ? k : x.strides(0) / item;
  return {x, num == kNpyFloat ? DType::f32 : DType::f16, m, k, std::max<int64_t>(ldx, 1), vector};
}

thread_local std::vector<float> tl_y32, tl_bias32;

// y = x @ W'.T (+ bias) computed by run(request): a driver, or one micro-kernel.
template <class Run>
py::array py_matmul_with(py::array x_in, const PackedWeightHandle& w, py::object bias_in,
                         py::object out_in, int64_t act_block, const Run& run) {
  const WeightGeometry& g = w.geom();
  ActView x = view_activations(x_in, g.k, "x");
  if (act_block <= 0) throw py::value_error("act_block must be positive");
  if (act_block < g.k && act_block % g.block != 0)
    throw py::value_error("act_block must be None (per row) or a multiple of the weight's group size " +
                          std::to_string(g.block) + ", got " + std::to_string(act_block));
  const float* bias = nullptr;
  if (!bias_in.is_none()) {
    py::array b = py::array::ensure(bias_in);
    if (!b || (dtype_num(b) != kNpyFloat && dtype_num(b) != kNpyHalf))
      throw py::type_error("bias must be a float32 or float16 array");
    if (b.ndim() != 1 || b.shape(0) != g.n)
      throw py::value_error("bias must have shape [" + std::to_string(g.n) + "]");
    auto b32 = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(b);
    tl_bias32.assign(b32.data(), b32.data() + g.n);
    bias = tl_bias32.data();
  }
  std::vector<py::ssize_t> shape = x.vector ? std::vector<py::ssize_t>{g.n}
                                            : std::vector<py::ssize_t>{x.m, g.n};
  py::array out;
  if (out_in.is_none()) {
    out = py::array(x.arr.dtype(), shape);
  } else {
    if (!py::isinstance<py::array>(out_in)) throw py::type_error("out must be a numpy array");
    out = out_in.cast<py::array>();
    if (!out.dtype().is(x.arr.dtype()))
      throw py::type_error("out must have the dtype of x (" + dtype_str(x.arr) + "), got " + dtype_str(out));
    bool shape_ok = out.ndim() == static_cast<py::ssize_t>(shape.size());
    for (size_t i = 0; shape_ok && i < shape.size(); ++i) shape_ok = out.shape(i) == shape[i];
    if (!shape_ok) {
      const auto dims = [](const std::vector<py::ssize_t>& d) {
        std::string t = "(";
        for (size_t i = 0; i < d.size(); ++i) t += (i ? ", " : "") + std::to_string(d[i]);
        return t + (d.size() == 1 ? ",)" : ")");
      };
      throw py::value_error("out has the wrong shape " + dims({out.shape(), out.shape() + out.ndim()}) +
                            ": expected " + dims(shape));
    }
    if (!(out.flags() & py::array::c_style) || !out.writeable())
      throw py::value_error("out must be C-contiguous and writeable");
  }
  MatmulRequest req{&g, w.data(), x.arr.data(), x.dtype, x.m, x.ldx, act_block, bias, nullptr, g.n};
  if (x.dtype == DType::f32) {
    req.y = static_cast<float*>(out.mutable_data());
    py::gil_scoped_release release;
    run(req);
  } else {
    auto* y16 = static_cast<uint16_t*>(out.mutable_data());
    py::gil_scoped_release release;
    tl_y32.resize(static_cast<size_t>(x.m * g.n));
    req.y = tl_y32.data();
    run(req);
    for (size_t i = 0; i < tl_y32.size(); ++i) y16[i] = float_to_half(tl_y32[i]);
  }
  return out;
}

// The drivers: matmul_int8 (act="int8"), matmul_float, matmul_float16_twin.
template <void (*kDriver)(const MatmulRequest&)>
py::array py_matmul(py::array x_in, const PackedWeightHandle& w, py::object bias_in,
                    py::object out_in, int64_t act_block) {
  return py_matmul_with(x_in, w, bias_in, out_in, act_block, kDriver);
}

py::tuple quantize_activation(py::array x_in, int64_t block) {
  ActView x = view_activations(x_in, -1, "x");
  if (block <= 0) throw py::value_error("block must be positive");
  const int64_t nb = ceil_div(x.k, block);
  const int64_t kpad = nb * block;
  std::vector<int8_t> q(static_cast<size_t>(x.m * kpad));
  py::array_t<float> scale({x.m, nb});
  py::array_t<int32_t> sums({x.m, nb});
  {
    py::gil_scoped_release release;
    quantize_activations(x.arr.data(), x.dtype, x.m, x.ldx, x.k, block, block, q.data(), kpad,
                         scale.mutable_data(), sums.mutable_data());
  }
  py::array_t<int8_t> xq({x.m, x.k});
  for (int64_t i = 0; i < x.m; ++i)
    std::memcpy(xq.mutable_data(i, 0), q.data() + i * kpad, static_cast<size_t>(x.k));
  return py::make_tuple(xq, scale, sums);
}

py::list planned(const WeightGeometry& g, int64_t m, Family family) {
  py::list l;
  for (const PlannedKernel& k : planned_kernels(g, m, family)) {
    py::dict d;
    d["name"] = k.name;
    d["mr"] = k.mr;
    d["nr"] = k.nr;
    d["rows"] = py::make_tuple(k.m0, k.m1);
    l.append(d);
  }
  return l;
}

// Without m: the level's kernels for one row (gemv*) and for many (gemm*). With m: the kernels
// that will run for m rows, per activation type, each with its tile and the rows it computes.
py::dict kernel_info(const PackedWeightHandle& w, std::optional<int64_t> m) {
  const WeightGeometry& g = w.geom();
  const KernelTable& kt = kernels_for_weight(g);
  py::dict d;
  d["isa"] = isa_name(kt.isa);
  d["layout"] = layout_info(g.layout).name;
  d["quantize_acts"] = kt.quantize_acts_name;
  if (m.has_value()) {
    if (*m < 1) throw py::value_error("m must be >= 1, got " + std::to_string(*m));
    d["m"] = *m;
    d["int8"] = planned(g, *m, Family::int8);
    d["float"] = planned(g, *m, Family::float32);
    d["float16"] = planned(g, *m, Family::float16);
    return d;
  }
  const auto name = [&](int64_t rows, Family f) { return planned_kernels(g, rows, f).front().name; };
  constexpr int64_t kTall = 1 << 20;  // the kernel a large prefill runs
  d["gemv"] = name(1, Family::int8);
  d["gemm"] = name(kTall, Family::int8);
  d["gemv_float"] = name(1, Family::float32);
  d["gemm_float"] = name(kTall, Family::float32);
  // Kernels for float16 activations: FP16 arithmetic where the level has it.
  d["gemv_float16"] = name(1, Family::float16);
  d["gemm_float16"] = name(kTall, Family::float16);
  return d;
}

// -- per-kernel tests: every micro-kernel descriptor of every level this build can run -----------

const char* family_name(Family f) {
  return f == Family::int8 ? "int8" : f == Family::float32 ? "float32" : "float16";
}

template <class U>
void list_family(py::list& out, Isa isa, LayoutId layout, Family f, const std::vector<U>& kernels) {
  for (const U& k : kernels) {
    py::dict d;
    d["isa"] = isa_name(isa);
    d["layout"] = layout_info(storage_layout(layout, k.bits)).name;  // what its weights are packed in
    d["family"] = family_name(f);
    d["name"] = k.name;
    d["bits"] = k.bits;
    d["mr"] = k.mr;
    d["nr"] = k.np * layout_info(LayoutId::nr8_kr4).nr;
    d["m_min"] = k.m_min;
    d["m_max"] = k.m_max;
    d["m_unit"] = k.m_unit;
    d["code_shift"] = k.code_shift;
    out.append(d);
  }
}

py::list ukernels() {
  py::list out;
  for (Isa isa : available_isas()) {
    for (const KernelTable* kt = &kernels_for(isa); kt != nullptr; kt = kt->also) {
      list_family(out, isa, kt->layout, Family::int8, kt->int8);
      list_family(out, isa, kt->layout, Family::float32, kt->float32);
      list_family(out, isa, kt->layout, Family::float16, kt->float16);
    }
  }
  return out;
}

template <class U>
std::optional<size_t> find_kernel(const std::vector<U>& kernels, const std::string& name) {
  for (size_t i = 0; i < kernels.size(); ++i)
    if (name == kernels[i].name) return i;
  return std::nullopt;
}

py::array run_ukernel_py(const std::string& isa_str, const std::string& family, const std::string& name,
                         py::array x, const PackedWeightHandle& w, py::object bias, int64_t act_block) {
  Isa isa;
  if (!parse_isa(isa_str, &isa)) throw py::value_error("unknown ISA level '" + isa_str + "'");
  if (!cpu_supports(isa)) throw py::value_error("ISA level '" + isa_str + "' is not supported by this CPU");
  Family f;
  if (family == "int8") f = Family::int8;
  else if (family == "float32") f = Family::float32;
  else if (family == "float16") f = Family::float16;
  else throw py::value_error("family must be 'int8', 'float32' or 'float16', got '" + family + "'");
  // the level's table, or the one for its other layouts (KernelTable::also) that lists the name
  for (const KernelTable* kt = &kernels_for(isa); kt != nullptr; kt = kt->also) {
    const std::optional<size_t> index = f == Family::int8      ? find_kernel(kt->int8, name)
                                        : f == Family::float32 ? find_kernel(kt->float32, name)
                                                               : find_kernel(kt->float16, name);
    if (index.has_value())
      return py_matmul_with(x, w, bias, py::none(), act_block,
                            [&](const MatmulRequest& r) { run_ukernel(*kt, f, *index, r); });
  }
  throw py::value_error("no kernel named '" + name + "' at this level");
}

}  // namespace

void register_matmul(py::module_& m) {
  m.def("matmul_int8", &py_matmul<matmul_int8>, py::arg("x"), py::arg("w"), py::arg("bias"),
        py::arg("out"), py::arg("act_block"));
  m.def("matmul_float", &py_matmul<matmul_float>, py::arg("x"), py::arg("w"), py::arg("bias"),
        py::arg("out"), py::arg("act_block"));
  m.def("matmul_float16_twin", &py_matmul<matmul_float16_twin>, py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("out"), py::arg("act_block"));
  m.def("quantize_activation", &quantize_activation, py::arg("x"), py::arg("block"));
  m.def("kernel_info", &kernel_info, py::arg("w"), py::arg("m") = py::none());
  m.def("_ukernels", &ukernels);
  m.def("_run_ukernel", &run_ukernel_py, py::arg("isa"), py::arg("family"), py::arg("name"), py::arg("x"),
        py::arg("w"), py::arg("bias"), py::arg("act_block"));
}

}  // namespace qlinear::bindings
