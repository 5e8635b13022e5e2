// The private extension module qlinear._core: validation of arrays at the boundary, GIL release
// around compute, and nothing else. The public API lives in python/qlinear.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "qlinear/cpu.h"
#include "qlinear/decoder.h"
#include "qlinear/decoder_step.h"
#include "qlinear/kernels.h"
#include "qlinear/layout.h"
#include "qlinear/matmul.h"
#include "qlinear/pack.h"
#include "qlinear/threadpool.h"

namespace py = pybind11;
using namespace qlinear;

namespace {

constexpr int kNpyHalf = 23, kNpyFloat = 11;

// A packed weight: its geometry and a read-only view of the bytes, kept alive (an mmap cannot be
// closed while a PackedWeight uses it).
class PackedWeightHandle {
 public:
  PackedWeightHandle(const WeightGeometry& g, py::buffer owner) : geom_(g), owner_(owner) {
    view_ = std::make_unique<py::buffer_info>(owner.request());
    if (view_->size * view_->itemsize != g.total_bytes)
      throw std::invalid_argument("packed buffer holds " + std::to_string(view_->size * view_->itemsize) +
                                  " bytes, the geometry needs " + std::to_string(g.total_bytes));
    if (!PyBuffer_IsContiguous(view_->view(), 'C'))
      throw std::invalid_argument("packed buffer must be contiguous");
    data_ = static_cast<const uint8_t*>(view_->ptr);
  }
  const WeightGeometry& geom() const { return geom_; }
  const uint8_t* data() const { return data_; }
  py::object owner() const { return owner_; }

 private:
  WeightGeometry geom_;
  py::object owner_;
  std::unique_ptr<py::buffer_info> view_;
  const uint8_t* data_ = nullptr;
};

LayoutId layout_by_name(const std::string& name) {
  const LayoutInfo* info = find_layout(name);
  if (info == nullptr) throw std::invalid_argument("unknown packed layout '" + name + "'");
  return info->id;
}

int dtype_num(const py::array& a) { return a.dtype().num(); }

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

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
                                         layout.empty() ? family_layout() : layout_by_name(layout));
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
                                         layout.empty() ? family_layout() : layout_by_name(layout));
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

py::tuple unpack(const PackedWeightHandle& w) {
  const WeightGeometry& g = w.geom();
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
void list_family(py::list& out, Isa isa, Family f, const std::vector<U>& kernels) {
  for (const U& k : kernels) {
    py::dict d;
    d["isa"] = isa_name(isa);
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
    const KernelTable& kt = kernels_for(isa);
    list_family(out, isa, Family::int8, kt.int8);
    list_family(out, isa, Family::float32, kt.float32);
    list_family(out, isa, Family::float16, kt.float16);
  }
  return out;
}

template <class U>
size_t find_kernel(const std::vector<U>& kernels, const std::string& name) {
  for (size_t i = 0; i < kernels.size(); ++i)
    if (name == kernels[i].name) return i;
  throw py::value_error("no kernel named '" + name + "' at this level");
}

py::array run_ukernel_py(const std::string& isa_str, const std::string& family, const std::string& name,
                         py::array x, const PackedWeightHandle& w, py::object bias, int64_t act_block) {
  Isa isa;
  if (!parse_isa(isa_str, &isa)) throw py::value_error("unknown ISA level '" + isa_str + "'");
  if (!cpu_supports(isa)) throw py::value_error("ISA level '" + isa_str + "' is not supported by this CPU");
  const KernelTable& kt = kernels_for(isa);
  Family f;
  size_t index;
  if (family == "int8") f = Family::int8, index = find_kernel(kt.int8, name);
  else if (family == "float32") f = Family::float32, index = find_kernel(kt.float32, name);
  else if (family == "float16") f = Family::float16, index = find_kernel(kt.float16, name);
  else throw py::value_error("family must be 'int8', 'float32' or 'float16', got '" + family + "'");
  return py_matmul_with(x, w, bias, py::none(), act_block,
                        [&](const MatmulRequest& r) { run_ukernel(kt, f, index, r); });
}

py::dict cpu_info() {
  const CpuFeatures& f = cpu_features();
  py::dict d;
  d["arch"] = f.arch;
  d["features"] = f.flags;
  d["best_isa"] = isa_name(f.best);
  d["active_isa"] = isa_name(active_kernels().isa);
  std::vector<std::string> levels;
  for (Isa isa : available_isas()) levels.emplace_back(isa_name(isa));
  d["available_isas"] = levels;
  // Levels whose kernels run on emulated intrinsics (a QLINEAR_EMULATE_X86 test build): correct
  // but slow, never a measure of speed.
  std::vector<std::string> emulated;
  for (Isa isa : f.emulated) emulated.emplace_back(isa_name(isa));
  d["emulated"] = emulated;
  d["physical_cores"] = f.physical_cores;
  d["layout"] = layout_info(family_layout()).name;
  return d;
}


// -- decoder ops for qlinear.llm's decode step (internal: shapes checked, float32 C-contiguous) --
using F32Array = py::array_t<float, py::array::c_style>;

F32Array checked_f32(const py::array& a, const char* what, int ndim) {
  if (a.dtype().num() != kNpyFloat || a.ndim() != ndim || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + " must be a C-contiguous float32 array of " +
                          std::to_string(ndim) + " dimensions");
  return py::reinterpret_borrow<F32Array>(a);
}

// An array's layout: C-contiguous, of `shape` (-1: any size), writeable when asked.
void check_layout(const py::array& a, const std::string& what, const std::vector<int64_t>& shape, bool writeable) {
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + " must be C-contiguous");
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
  if (!ok) {
    std::string want;
    for (int64_t v : shape) want += (want.empty() ? "" : ", ") + (v < 0 ? std::string("*") : std::to_string(v));
    throw py::value_error(what + " must have shape [" + want + "]");
  }
  if (writeable && !a.writeable()) throw py::value_error(what + " must be writeable");
}

// A KV cache: float32 or float16 (IEEE half), C-contiguous, writeable, of `shape` (-1: any);
// returns whether it is half. A wrong dtype raises TypeError, or ValueError with `dtype_value_error`.
bool checked_kv(const py::handle& obj, const std::string& what, const std::vector<int64_t>& shape,
                bool dtype_value_error = false) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(what + " must be a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  const int t = a.dtype().num();
  if (t != kNpyFloat && t != kNpyHalf) {
    const std::string msg = what + " must be float32 or float16, got " + dtype_str(a);
    if (dtype_value_error) throw py::value_error(msg);
    throw py::type_error(msg);
  }
  check_layout(a, what, shape, true);
  return t == kNpyHalf;
}

// A layer's k and v caches, [kv_heads, capacity, head_dim] both, of one dtype; whether half.
bool checked_kv_pair(const py::handle& k, const py::handle& v, const std::string& where,
                     bool dtype_value_error = false) {
  const bool half = checked_kv(k, where + "k_cache", {-1, -1, -1}, dtype_value_error);
  const py::array ka = py::reinterpret_borrow<py::array>(k);
  if (checked_kv(v, where + "v_cache", {ka.shape(0), ka.shape(1), ka.shape(2)}, dtype_value_error) != half) {
    const std::string msg = where + "k and v caches must be of one dtype";
    if (dtype_value_error) throw py::value_error(msg);
    throw py::type_error(msg);
  }
  return half;
}

// Row-wise elementwise work (prefill: tokens x features) split over the thread pool once there is
// enough of it; a decode step's single row stays on the calling thread.
template <class F>
void rows_in_parallel(int64_t rows, int64_t cost_per_row, F&& fn) {
  constexpr int64_t kMinWork = 1 << 16;
  if (rows < 2 || rows * cost_per_row < kMinWork) {
    fn(int64_t{0}, rows);
    return;
  }
  ThreadPool::global().parallel_for(rows, std::max<int64_t>(1, kMinWork / cost_per_row), fn);
}

F32Array py_rms_norm(const py::array& x_in, const py::array& w_in, float eps) {
  F32Array x = checked_f32(x_in, "x", 2), w = checked_f32(w_in, "weight", 1);
  if (w.shape(0) != x.shape(1)) throw py::value_error("rms_norm: weight size does not match x");
  F32Array y({x.shape(0), x.shape(1)});
  const int64_t n = x.shape(1);
  const float *xp = x.data(), *wp = w.data();
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  rows_in_parallel(x.shape(0), n, [&](int64_t r0, int64_t r1) {
    decoder::rms_norm(xp + r0 * n, wp, eps, r1 - r0, n, yp + r0 * n);
  });
  return y;
}

// act(gate) * up over a fused projection's output [rows, 2n] (gate first): SwiGLU, GeGLU.
template <void (*Fn)(const float*, int64_t, int64_t, float*)>
F32Array py_gated_mul(const py::array& gu_in, const char* name) {
  F32Array gu = checked_f32(gu_in, "gate_up", 2);
  if (gu.shape(1) % 2) throw py::value_error(std::string(name) + ": gate_up must have an even number of columns");
  const int64_t n = gu.shape(1) / 2;
  F32Array y({gu.shape(0), n});
  const float* gp = gu.data();
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  rows_in_parallel(gu.shape(0), 8 * n, [&](int64_t r0, int64_t r1) {  // ~8 x the work of a copy
    Fn(gp + r0 * 2 * n, r1 - r0, n, yp + r0 * n);
  });
  return y;
}

F32Array py_softcap(const py::array& x_in, float cap) {
  if (!(cap > 0.f)) throw py::value_error("softcap: cap must be > 0");
  F32Array x = checked_f32(x_in, "x", 2);
  F32Array y({x.shape(0), x.shape(1)});
  std::copy(x.data(), x.data() + x.size(), y.mutable_data());
  decoder::softcap(y.mutable_data(), y.size(), cap);
  return y;
}

F32Array py_attend_one(const py::array& qkv_in, const py::array& cos_in, const py::array& sin_in,
                       int64_t pos, const py::array& k_in, const py::array& v_in, int64_t heads, float scale,
                       int64_t window, float softcap) {
  F32Array qkv = checked_f32(qkv_in, "qkv", 2), cs = checked_f32(cos_in, "cos", 2), sn = checked_f32(sin_in, "sin", 2);
  const bool half = checked_kv_pair(k_in, v_in, "attend_one: ", true);
  const int64_t kv = k_in.shape(0), cap = k_in.shape(1), d = k_in.shape(2);
  if (heads < 1 || kv < 1 || heads % kv || d < 2 || d % 2 || d > 512)
    throw py::value_error("attend_one: bad head counts or head_dim");
  if (qkv.shape(0) != 1 || qkv.shape(1) != (heads + 2 * kv) * d)
    throw py::value_error("attend_one: qkv must have shape [1, (heads + 2 * kv_heads) * head_dim]");
  if (window != 0 && window != cap)
    throw py::value_error("attend_one: a sliding window's cache holds `window` positions (a ring)");
  if (softcap < 0.f) throw py::value_error("attend_one: softcap must be >= 0");
  if (pos < 0 || (window == 0 && pos >= cap) || pos >= cs.shape(0) || cs.shape(1) != d / 2 ||
      sn.shape(0) != cs.shape(0) || sn.shape(1) != d / 2)
    throw py::value_error("attend_one: position outside the cache or the RoPE tables");
  F32Array out({int64_t(1), heads * d});
  decoder::AttentionShape shape{heads, kv, d, cap};
  shape.softcap = softcap;
  shape.kv_half = half;
  void *kp = py::array(k_in).mutable_data(), *vp = py::array(v_in).mutable_data();
  {
    py::gil_scoped_release release;
    decoder::attend_one(qkv.data(), cs.data() + pos * (d / 2), sn.data() + pos * (d / 2), pos, shape, scale,
                        kp, vp, out.mutable_data());
  }
  return out;
}

// Reads every byte of a buffer once with all the pool's threads (a sum of its 64-bit words):
// the machine's streaming read bandwidth, measured the way a GEMV reads its weights.
uint64_t stream_read(const py::buffer& b) {
  const py::buffer_info info = b.request();
  if (!PyBuffer_IsContiguous(info.view(), 'C')) throw py::value_error("stream_read needs a contiguous buffer");
  const auto* words = static_cast<const uint64_t*>(info.ptr);
  const int64_t n = info.size * info.itemsize / 8;
  std::vector<uint64_t> partial(256, 0);
  py::gil_scoped_release release;
  ThreadPool& pool = ThreadPool::global();
  const int64_t tasks = std::min<int64_t>(256, std::max<int64_t>(1, n / (1 << 16)));
  auto task = [&](int64_t t) {
    uint64_t a = 0, b2 = 0, c = 0, d = 0;
    const int64_t w0 = n * t / tasks, w1 = n * (t + 1) / tasks;
    int64_t i = w0;
    for (; i + 4 <= w1; i += 4) a += words[i], b2 += words[i + 1], c += words[i + 2], d += words[i + 3];
    for (; i < w1; ++i) a += words[i];
    partial[t] = a + b2 + c + d;
  };
  pool.run(tasks, TaskRef(task));
  uint64_t total = 0;
  for (uint64_t v : partial) total += v;
  return total;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "qlinear's compiled core (private: use the qlinear package)";
  active_kernels();  // fail at import, not at the first call, on a bad QLINEAR_ISA

  py::class_<PackedWeightHandle>(m, "PackedWeightHandle")
      .def(py::init([](py::buffer buf, int64_t n, int64_t k, int bits, int64_t group_size,
                       bool symmetric, const std::string& layout) {
             return PackedWeightHandle(make_geometry(n, k, bits, group_size, symmetric, layout_by_name(layout)), buf);
           }),
           py::arg("buffer"), py::arg("n"), py::arg("k"), py::arg("bits"), py::arg("group_size"),
           py::arg("symmetric"), py::arg("layout"))
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
  m.def("unpack", &unpack);
  m.def("matmul_int8", &py_matmul<matmul_int8>, py::arg("x"), py::arg("w"), py::arg("bias"),
        py::arg("out"), py::arg("act_block"));
  m.def("matmul_float", &py_matmul<matmul_float>, py::arg("x"), py::arg("w"), py::arg("bias"),
        py::arg("out"), py::arg("act_block"));
  m.def("matmul_float16_twin", &py_matmul<matmul_float16_twin>, py::arg("x"), py::arg("w"),
        py::arg("bias"), py::arg("out"), py::arg("act_block"));
  m.def("quantize_activation", &quantize_activation, py::arg("x"), py::arg("block"));
  m.def("rms_norm", &py_rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("silu_mul", [](const py::array& gu) { return py_gated_mul<decoder::silu_mul>(gu, "silu_mul"); },
        py::arg("gate_up"));
  m.def("gelu_tanh_mul", [](const py::array& gu) { return py_gated_mul<decoder::gelu_tanh_mul>(gu, "gelu_tanh_mul"); },
        py::arg("gate_up"));
  m.def("softcap", &py_softcap, py::arg("x"), py::arg("cap"));
  m.def("attend_one", &py_attend_one, py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("pos"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("heads"), py::arg("scale"), py::arg("window") = 0,
        py::arg("softcap") = 0.f);
  m.def("kernel_info", &kernel_info, py::arg("w"), py::arg("m") = py::none());
  m.def("_ukernels", &ukernels);
  m.def("_run_ukernel", &run_ukernel_py, py::arg("isa"), py::arg("family"), py::arg("name"), py::arg("x"),
        py::arg("w"), py::arg("bias"), py::arg("act_block"));
  m.def("cpu_info", &cpu_info);
  m.def("set_num_threads", [](int n) {
    if (n < 1) throw py::value_error("number of threads must be >= 1, got " + std::to_string(n));
    py::gil_scoped_release release;
    ThreadPool::global().set_num_threads(n);
  });
  m.def("get_num_threads", [] { return ThreadPool::global().num_threads(); });
  m.def("stream_read", &stream_read, py::arg("buffer"));
  m.def("set_isa", [](const std::string& name) {
    Isa isa;
    if (!parse_isa(name, &isa)) throw py::value_error("unknown ISA level '" + name + "'");
    if (!set_active_isa(isa)) throw py::value_error("ISA level '" + name + "' is not supported by this CPU");
  });
  m.def("family_layout", [] { return std::string(layout_info(family_layout()).name); });

  // -- the decode step of qlinear.llm in one call, and the prefill's attention ---------------
  // (internal API: every array checked here; the step keeps what it points into alive)
  {
    using decoder::DecodeStep;
    using decoder::StepLinear;
    auto f32 = [](const py::handle& obj, const std::string& what, std::vector<int64_t> shape,
                  bool writeable = false) {
      if (!py::isinstance<py::array>(obj)) throw py::type_error(what + " must be a numpy array");
      py::array a = py::reinterpret_borrow<py::array>(obj);
      if (a.dtype().num() != kNpyFloat) throw py::type_error(what + " must be float32, got " + dtype_str(a));
      check_layout(a, what, shape, writeable);
      return a;
    };
    // (handle, bias or None, act_int8, act_block) -> StepLinear with n x k checked
    auto linear = [f32](const py::handle& spec, const std::string& what, int64_t n, int64_t k, py::list& refs) {
      if (!py::isinstance<py::tuple>(spec) || py::len(spec) != 4)
        throw py::type_error(what + " must be a tuple (PackedWeightHandle, bias or None, act_int8, act_block)");
      py::tuple t = py::reinterpret_borrow<py::tuple>(spec);
      if (!py::isinstance<PackedWeightHandle>(t[0])) throw py::type_error(what + ": weight must be a PackedWeightHandle");
      const auto& w = t[0].cast<const PackedWeightHandle&>();
      const WeightGeometry& g = w.geom();
      if ((n >= 0 && g.n != n) || g.k != k)
        throw py::value_error(what + ": weight has shape [" + std::to_string(g.n) + ", " + std::to_string(g.k) +
                              "], expected [" + (n >= 0 ? std::to_string(n) : std::string("*")) + ", " +
                              std::to_string(k) + "]");
      StepLinear l;
      l.w = &g;
      l.packed = w.data();
      if (!t[1].is_none()) l.bias = static_cast<const float*>(f32(t[1], what + " bias", {g.n}).data());
      if (!py::isinstance<py::bool_>(t[2])) throw py::type_error(what + ": act_int8 must be a bool");
      l.act_int8 = t[2].cast<bool>();
      l.act_block = t[3].cast<int64_t>();
      if (l.act_int8 && (l.act_block <= 0 || (l.act_block < g.k && l.act_block % g.block != 0)))
        throw py::value_error(what + ": act_block must be >= K or a positive multiple of the weight's block " +
                              std::to_string(g.block));
      refs.append(t);
      return l;
    };
    py::class_<DecodeStep>(m, "DecodeStep", py::dynamic_attr())
        .def("step", [](DecodeStep& s, const py::array& h_in, int64_t pos) {
               const decoder::StepModel& md = s.model();
               if (!py::isinstance<py::array>(h_in) || h_in.dtype().num() != kNpyFloat ||
                   !(h_in.flags() & py::array::c_style) || h_in.size() != md.hidden)
                 throw py::value_error("h must be a C-contiguous float32 array of " + std::to_string(md.hidden) + " values");
               if (pos < 0 || pos >= md.attn.capacity || pos >= md.rope_rows)
                 throw py::value_error("position " + std::to_string(pos) + " is outside the cache (" +
                                       std::to_string(md.attn.capacity) + ") or the RoPE tables (" +
                                       std::to_string(md.rope_rows) + ")");
               py::array_t<float> logits({int64_t{1}, md.lm_head.w->n});
               const float* h = static_cast<const float*>(h_in.data());
               float* out = logits.mutable_data();
               py::gil_scoped_release release;
               s.run(h, pos, out);
               return logits;
             }, py::arg("h"), py::arg("pos"),
             "One token: h = its embedding [hidden] at position pos; returns the logits [1, vocab].")
        .def("step_batch", [f32](DecodeStep& s, const py::array& h_in, const std::vector<int64_t>& pos,
                                 const py::list& k_caches, const py::list& v_caches,
                                 const std::vector<int64_t>& contexts) {
               const decoder::StepModel& md = s.model();
               const std::vector<decoder::LayerCache>& own = s.caches();
               const int64_t b = static_cast<int64_t>(pos.size()), nl = static_cast<int64_t>(own.size());
               const int64_t kv = md.attn.kv_heads, d = md.attn.head_dim;
               if (b < 1 || static_cast<int64_t>(py::len(k_caches)) != b ||
                   static_cast<int64_t>(py::len(v_caches)) != b || static_cast<int64_t>(contexts.size()) != b)
                 throw py::value_error("step_batch: pos, k_caches, v_caches and contexts must hold the same number "
                                       "(>= 1) of rows");
               py::array h = f32(h_in, "h", {b, md.hidden});
               py::list keep;  // the arrays the caches point into, for the call
               std::vector<decoder::LayerCache> caches(static_cast<size_t>(b * nl));
               std::vector<decoder::StepRow> rows(static_cast<size_t>(b));
               // the caches are of the step's own dtype (float32, or float16 for half caches)
               const auto cache = [&](const py::handle& o, const std::string& what, const std::vector<int64_t>& shape) {
                 if (checked_kv(o, what, shape) != md.attn.kv_half)
                   throw py::type_error(what + " must be " + (md.attn.kv_half ? "float16" : "float32") +
                                        ", as the step's own caches");
                 return py::reinterpret_borrow<py::array>(o);
               };
               // every layer holds the whole context (no sliding window's ring): a row's caches may
               // come as one [layers, kv_heads, context, head_dim] array each, checked once (not
               // a view per layer: this runs between two steps, holding the GIL)
               bool whole_context = true;
               for (const decoder::LayerCache& c : own) whole_context = whole_context && c.capacity >= md.attn.capacity;
               const auto stacked = [&](const py::object& o) {
                 return whole_context && py::isinstance<py::array>(o) && py::reinterpret_borrow<py::array>(o).ndim() == 4;
               };
               for (int64_t r = 0; r < b; ++r) {
                 const std::string what = "row " + std::to_string(r) + " ";
                 const int64_t ctx = contexts[r];
                 if (ctx < 1 || ctx > md.attn.capacity)
                   throw py::value_error(what + "context " + std::to_string(ctx) + " is not in 1.." +
                                         std::to_string(md.attn.capacity));
                 if (pos[r] < 0 || pos[r] >= ctx || pos[r] >= md.rope_rows)
                   throw py::value_error(what + "position " + std::to_string(pos[r]) + " is outside its context (" +
                                         std::to_string(ctx) + ") or the RoPE tables (" +
                                         std::to_string(md.rope_rows) + ")");
                 py::object ks = k_caches[r], vs = v_caches[r];
                 if (static_cast<int64_t>(py::len(ks)) != nl || static_cast<int64_t>(py::len(vs)) != nl)
                   throw py::value_error(what + "caches must hold " + std::to_string(nl) + " layers");
                 if (stacked(ks) && stacked(vs)) {
                   py::array k = cache(ks, what + "k_caches", {nl, kv, ctx, d});
                   py::array v = cache(vs, what + "v_caches", {nl, kv, ctx, d});
                   keep.append(k), keep.append(v);
                   char* kp = static_cast<char*>(k.mutable_data());
                   char* vp = static_cast<char*>(v.mutable_data());
                   const int64_t layer_bytes = kv * ctx * d * static_cast<int64_t>(k.itemsize());
                   for (int64_t i = 0; i < nl; ++i) caches[r * nl + i] = {kp + i * layer_bytes, vp + i * layer_bytes, ctx};
                 } else {
                   for (int64_t i = 0; i < nl; ++i) {
                     // a layer's cache holds the context, or its window's ring (the step's own is one)
                     const int64_t cap = own[i].capacity < md.attn.capacity ? std::min(ctx, own[i].capacity) : ctx;
                     const std::string layer = what + "layer " + std::to_string(i) + " ";
                     py::array k = cache(ks[py::int_(i)], layer + "k_cache", {kv, cap, d});
                     py::array v = cache(vs[py::int_(i)], layer + "v_cache", {kv, cap, d});
                     keep.append(k), keep.append(v);
                     caches[r * nl + i] = {k.mutable_data(), v.mutable_data(), cap};
                   }
                 }
                 for (int64_t i = 0; i < nl; ++i)
                   for (int64_t q = 0; q < r; ++q) {
                     const decoder::LayerCache& o = caches[q * nl + i];
                     if (o.k == caches[r * nl + i].k || o.v == caches[r * nl + i].v)
                       throw py::value_error("step_batch: rows " + std::to_string(q) + " and " + std::to_string(r) +
                                             " share a cache");
                   }
                 rows[r] = {pos[r], caches.data() + r * nl};
               }
               py::array_t<float> logits({b, md.lm_head.w->n});
               const float* hp = static_cast<const float*>(h.data());
               float* out = logits.mutable_data();
               py::gil_scoped_release release;
               s.run(hp, rows.data(), b, out);
               return logits;
             }, py::arg("h"), py::arg("pos"), py::arg("k_caches"), py::arg("v_caches"), py::arg("contexts"),
             "B tokens of B sequences (continuous batching): h = their embeddings [B, hidden], row r at position "
             "pos[r] of a sequence of contexts[r] positions over its own caches: k_caches[r][layer] / "
             "v_caches[r][layer] [kv_heads, capacity, head_dim] (a sliding layer's capacity: min(context, window)); "
             "returns the logits [B, vocab], each row's the bits of that sequence's step alone.")
        .def("run_matmuls", [](DecodeStep& s) {
               std::vector<float> logits(static_cast<size_t>(s.last_rows() * s.model().lm_head.w->n));
               py::gil_scoped_release release;
               s.run_matmuls(logits.data());
             }, "The step's matmuls alone (for timing the rest of the step).")
        .def_property_readonly("num_layers", [](const DecodeStep& s) { return s.model().layers.size(); })
        .def_property_readonly("last_timing", [](const DecodeStep& s) {
              return py::make_tuple(s.last_seconds(), s.last_matmul_seconds());
            }, "(seconds of the last step, seconds of its matmuls), clocked inside the step");
    m.def("decode_step", [f32, linear](const py::list& layers, const py::array& final_norm, const py::tuple& lm_head,
                                       int64_t heads, double eps, double scale, bool gelu, double attn_softcap,
                                       double final_softcap, int64_t context) {
            py::list refs;
            if (py::len(layers) < 1) throw py::value_error("decode_step: no layers");
            if (attn_softcap < 0 || final_softcap < 0) throw py::value_error("decode_step: soft-caps must be >= 0");
            py::array fn = f32(final_norm, "final_norm", {-1});
            const int64_t hidden = fn.shape(0);
            decoder::StepModel md;
            std::vector<decoder::LayerCache> caches;
            md.hidden = hidden;
            md.eps = static_cast<float>(eps);
            md.scale = static_cast<float>(scale);
            md.gelu = gelu;
            md.final_softcap = static_cast<float>(final_softcap);
            md.final_norm = static_cast<const float*>(fn.data());
            md.lm_head = linear(lm_head, "lm_head", -1, hidden, refs);
            const auto optional = [&](const py::dict& o, const char* key, const std::string& what, int64_t n) {
              if (!o.contains(key) || o[key].is_none()) return static_cast<const float*>(nullptr);
              return static_cast<const float*>(f32(o[key], what + key, {n}).data());
            };
            for (size_t i = 0; i < py::len(layers); ++i) {
              const std::string p = "layer " + std::to_string(i) + " ";
              if (!py::isinstance<py::tuple>(layers[i]) || py::len(layers[i]) != 11)
                throw py::type_error(p + "must be a tuple (qkv, o, gate_up, down, input_norm, post_norm, k_cache, "
                                         "v_cache, cos, sin, options dict)");
              py::tuple t = layers[i].cast<py::tuple>();
              const bool half = checked_kv_pair(t[6], t[7], p);
              if (i > 0 && half != md.attn.kv_half)
                throw py::type_error(p + "caches: every layer's k and v caches must be of one dtype");
              py::array kc = py::reinterpret_borrow<py::array>(t[6]), vc = py::reinterpret_borrow<py::array>(t[7]);
              const int64_t kv = kc.shape(0), cap = kc.shape(1), d = kc.shape(2);
              if (kv < 1 || heads < 1 || heads % kv || d < 2 || d % 2 || d > decoder::kMaxHeadDim || cap < 1 ||
                  (i > 0 && (kv != md.attn.kv_heads || d != md.attn.head_dim)))
                throw py::value_error(p + "bad head counts or head_dim");
              md.attn = decoder::AttentionShape{heads, kv, d, std::max(md.attn.capacity, cap)};
              md.attn.softcap = static_cast<float>(attn_softcap);
              md.attn.kv_half = half;
              py::array cs = f32(t[8], p + "cos", {-1, d / 2}), sn = f32(t[9], p + "sin", {cs.shape(0), d / 2});
              md.rope_rows = i == 0 ? cs.shape(0) : std::min(md.rope_rows, cs.shape(0));
              if (!py::isinstance<py::dict>(t[10])) throw py::type_error(p + "options must be a dict");
              py::dict o = t[10].cast<py::dict>();
              for (auto item : o) {
                const std::string key = py::str(item.first);
                if (key != "q_norm" && key != "k_norm" && key != "attn_out_norm" && key != "mlp_out_norm")
                  throw py::value_error(p + "unknown option '" + key + "'");
              }
              decoder::StepLayer L;
              L.qkv = linear(t[0], p + "qkv", (heads + 2 * kv) * d, hidden, refs);
              L.o = linear(t[1], p + "o", hidden, heads * d, refs);
              L.gate_up = linear(t[2], p + "gate_up", -1, hidden, refs);
              const int64_t inter = L.gate_up.w->n / 2;
              if (L.gate_up.w->n % 2 || (i > 0 && inter != md.intermediate))
                throw py::value_error(p + "gate_up has " + std::to_string(L.gate_up.w->n) + " rows: not 2 x intermediate");
              md.intermediate = inter;
              L.down = linear(t[3], p + "down", hidden, inter, refs);
              L.input_norm = static_cast<const float*>(f32(t[4], p + "input_norm", {hidden}).data());
              L.post_norm = static_cast<const float*>(f32(t[5], p + "post_norm", {hidden}).data());
              L.q_norm = optional(o, "q_norm", p, d);
              L.k_norm = optional(o, "k_norm", p, d);
              L.attn_out_norm = optional(o, "attn_out_norm", p, hidden);
              L.mlp_out_norm = optional(o, "mlp_out_norm", p, hidden);
              caches.push_back({kc.mutable_data(), vc.mutable_data(), cap});
              L.cos = static_cast<const float*>(cs.data());
              L.sin = static_cast<const float*>(sn.data());
              refs.append(t);
              for (py::handle a : {py::handle(kc), py::handle(vc), py::handle(cs), py::handle(sn)}) refs.append(a);
              md.layers.push_back(L);
            }
            if (context < 0) throw py::value_error("decode_step: context must be >= 0");
            if (context > 0) {  // every layer's cache holds the context or is a ring of fewer positions
              for (const decoder::LayerCache& c : caches)
                if (c.capacity > context) throw py::value_error("decode_step: a layer's cache is longer than the context");
              md.attn.capacity = context;
            }
            refs.append(fn);
            py::object obj = py::cast(std::make_unique<DecodeStep>(std::move(md), std::move(caches)));
            obj.attr("_refs") = refs;
            return obj;
          }, py::arg("layers"), py::arg("final_norm"), py::arg("lm_head"), py::arg("heads"), py::arg("eps"),
          py::arg("scale"), py::arg("gelu") = false, py::arg("attn_softcap") = 0.0, py::arg("final_softcap") = 0.0,
          py::arg("context") = 0,
          "A DecodeStep over packed weights: layers = [(qkv, o, gate_up, down, input_norm, post_norm, k_cache, "
          "v_cache, cos, sin, options)], each linear (PackedWeightHandle, bias or None, act_int8, act_block), "
          "caches [kv_heads, capacity, head_dim] (a layer's cache shorter than the context, by default the "
          "longest cache, is a sliding window's ring), RoPE tables [rows, head_dim / 2], options {q_norm, k_norm, attn_out_norm, "
          "mlp_out_norm} (arrays or None).");
    m.def("attend_prefill", [f32](const py::array& qkv_in, const py::array& cos_in, const py::array& sin_in,
                                  int64_t start, const py::array& k_in, const py::array& v_in, int64_t heads,
                                  double scale, int64_t window, double softcap) {
            const bool half = checked_kv_pair(k_in, v_in, "attend_prefill: ");
            const int64_t kv = k_in.shape(0), cap = k_in.shape(1), d = k_in.shape(2);
            py::array k = k_in, v = v_in;
            if (kv < 1 || heads < 1 || heads % kv || d < 2 || d % 2 || d > decoder::kMaxHeadDim)
              throw py::value_error("attend_prefill: bad head counts or head_dim");
            py::array qkv = f32(qkv_in, "qkv", {-1, (heads + 2 * kv) * d});
            const int64_t rows = qkv.shape(0);
            py::array cs = f32(cos_in, "cos", {-1, d / 2}), sn = f32(sin_in, "sin", {cs.shape(0), d / 2});
            if (rows < 1 || start < 0 || start + rows > cap || start + rows > cs.shape(0))
              throw py::value_error("attend_prefill: positions " + std::to_string(start) + ".." +
                                    std::to_string(start + rows - 1) + " are outside the cache or the RoPE tables");
            py::array_t<float> out({rows, heads * d});
            if (window < 0 || softcap < 0) throw py::value_error("attend_prefill: window and softcap must be >= 0");
            decoder::AttentionShape sh{heads, kv, d, cap};
            sh.window = window;
            sh.softcap = static_cast<float>(softcap);
            sh.kv_half = half;
            const float *qp = static_cast<const float*>(qkv.data()), *cp = static_cast<const float*>(cs.data()),
                        *sp = static_cast<const float*>(sn.data());
            void *kp = k.mutable_data(), *vp = v.mutable_data();
            float* op = out.mutable_data();
            py::gil_scoped_release release;
            decoder::attend_prefill(qp, rows, cp, sp, start, sh, static_cast<float>(scale), kp, vp, op);
            return out;
          }, py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("start"), py::arg("k_cache"),
          py::arg("v_cache"), py::arg("heads"), py::arg("scale"), py::arg("window") = 0, py::arg("softcap") = 0.0);
  }
}
