// Binds the decoder's operations for qlinear.llm (internal: shapes checked, float32 C-contiguous): rms_norm, the
// gated activations, softcap, attention (attend_one, attend_prefill), the delta / conv rows, shared_expert_add.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/llm/decoder.h"
#include "qlinear/llm/moe.h"
#include "qlinear/core/threadpool.h"

namespace qlinear::bindings {

// The Gated DeltaNet's geometry as the bindings take it (delta_rows, decode_step's delta layers).
decoder::DeltaShape delta_shape(const py::dict& g, const std::string& what) {
  decoder::DeltaShape s;
  for (const char* key : {"k_heads", "v_heads", "k_dim", "v_dim", "kernel", "tiled", "eps"})
    if (!g.contains(key)) throw py::value_error(what + ": the delta geometry has no '" + key + "'");
  s.k_heads = g["k_heads"].cast<int64_t>();
  s.v_heads = g["v_heads"].cast<int64_t>();
  s.k_dim = g["k_dim"].cast<int64_t>(), s.v_dim = g["v_dim"].cast<int64_t>();
  s.kernel = g["kernel"].cast<int64_t>();
  s.tiled = g["tiled"].cast<bool>();
  s.eps = g["eps"].cast<float>();
  if (s.k_heads < 1 || s.v_heads < 1 || s.v_heads % s.k_heads || s.k_dim < 1 || s.v_dim < 1 ||
      s.k_dim > decoder::kMaxDeltaDim || s.v_dim > decoder::kMaxDeltaDim || s.kernel < 2 || s.kernel > 16)
    throw py::value_error(what + ": bad delta geometry (heads, head sizes <= " +
                          std::to_string(decoder::kMaxDeltaDim) + ", kernel 2..16)");
  return s;
}

DeltaArrays delta_arrays(const decoder::DeltaShape& s, const py::handle& conv, const py::handle& dt_bias,
                         const py::handle& a, const py::handle& norm, const py::handle& conv_state,
                         const py::handle& state, const std::string& what) {
  DeltaArrays out;
  out.w.conv = static_cast<const float*>(f32_array(conv, what + " conv", {s.kernel, s.channels()}).data());
  out.w.dt_bias = static_cast<const float*>(f32_array(dt_bias, what + " dt_bias", {s.v_heads}).data());
  out.w.a = static_cast<const float*>(f32_array(a, what + " ssm_a", {s.v_heads}).data());
  out.w.norm = static_cast<const float*>(f32_array(norm, what + " norm", {s.v_dim}).data());
  out.conv_state = static_cast<float*>(
      f32_array(conv_state, what + " conv_state", {s.kernel - 1, s.channels()}, true).mutable_data());
  out.state = static_cast<float*>(f32_array(state, what + " state", {s.v_heads, s.k_dim, s.v_dim}, true).mutable_data());
  return out;
}

namespace {

using F32Array = py::array_t<float, py::array::c_style>;

F32Array checked_f32(const py::array& a, const char* what, int ndim) {
  if (a.dtype().num() != kNpyFloat || a.ndim() != ndim || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + " must be a C-contiguous float32 array of " +
                          std::to_string(ndim) + " dimensions");
  return py::reinterpret_borrow<F32Array>(a);
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

// y += the shared expert of x (moe.h): for the blocks whose routed experts run elsewhere (flash).
void py_shared_expert_add(const py::array& y_in, const py::array& x_in, const py::tuple& shared, bool gelu) {
  py::array x = f32_array(x_in, "x", {-1, -1}), y = f32_array(y_in, "y", {x.shape(0), x.shape(1)}, true);
  py::array gate = f32_array(shared[2], "shared gate", {x.shape(1)});
  decoder::MoeLayer L;  // its shared expert only
  decoder::MoeScratch s;
  py::list refs;
  L.hidden = x.shape(1), L.act.gelu = gelu, L.shared_gate = static_cast<const float*>(gate.data());
  L.shared_gate_up = step_linear(shared[0], "shared gate_up", -1, L.hidden, refs), L.shared_inter = L.shared_gate_up.w->n / 2;
  L.shared_down = step_linear(shared[1], "shared down", L.hidden, L.shared_inter, refs);
  decoder::shared_expert(L, static_cast<const float*>(x.data()), x.shape(0), static_cast<float*>(y.mutable_data()), s, false);
}

F32Array py_softcap(const py::array& x_in, float cap) {
  if (!(cap > 0.f)) throw py::value_error("softcap: cap must be > 0");
  F32Array x = checked_f32(x_in, "x", 2);
  F32Array y({x.shape(0), x.shape(1)});
  std::copy(x.data(), x.data() + x.size(), y.mutable_data());
  decoder::softcap(y.mutable_data(), y.size(), cap);
  return y;
}

// None, or a float32 array of one finite sink logit per query head.
py::object checked_sinks(const py::object& sinks, int64_t heads, const std::string& what) {
  if (sinks.is_none()) return sinks;
  py::array a = f32_array(sinks, what + "sinks", {heads});
  const float* p = static_cast<const float*>(a.data());
  for (int64_t i = 0; i < heads; ++i)
    if (!std::isfinite(p[i])) throw py::value_error(what + "sinks must be finite");
  return a;
}

F32Array py_attend_one(const py::array& qkv_in, const py::array& cos_in, const py::array& sin_in,
                       int64_t pos, const py::array& k_in, const py::array& v_in, int64_t heads, float scale,
                       int64_t window, float softcap, const py::object& sinks_in) {
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
  py::object sinks = checked_sinks(sinks_in, heads, "attend_one: ");
  if (!sinks.is_none()) shape.sinks = static_cast<const float*>(py::array(sinks).data());
  void *kp = py::array(k_in).mutable_data(), *vp = py::array(v_in).mutable_data();
  {
    py::gil_scoped_release release;
    decoder::attend_one(qkv.data(), cs.data() + pos * (d / 2), sn.data() + pos * (d / 2), pos, shape, scale,
                        kp, vp, out.mutable_data());
  }
  return out;
}

py::array_t<float> py_attend_prefill(const py::array& qkv_in, const py::array& cos_in, const py::array& sin_in,
                                     int64_t start, const py::array& k_in, const py::array& v_in, int64_t heads,
                                     double scale, int64_t window, double softcap, const py::object& sinks_in) {
  const bool half = checked_kv_pair(k_in, v_in, "attend_prefill: ");
  const int64_t kv = k_in.shape(0), cap = k_in.shape(1), d = k_in.shape(2);
  py::array k = k_in, v = v_in;
  if (kv < 1 || heads < 1 || heads % kv || d < 2 || d % 2 || d > decoder::kMaxHeadDim)
    throw py::value_error("attend_prefill: bad head counts or head_dim");
  py::array qkv = f32_array(qkv_in, "qkv", {-1, (heads + 2 * kv) * d});
  const int64_t rows = qkv.shape(0);
  py::array cs = f32_array(cos_in, "cos", {-1, d / 2}), sn = f32_array(sin_in, "sin", {cs.shape(0), d / 2});
  if (rows < 1 || start < 0 || start + rows > cap || start + rows > cs.shape(0))
    throw py::value_error("attend_prefill: positions " + std::to_string(start) + ".." +
                          std::to_string(start + rows - 1) + " are outside the cache or the RoPE tables");
  py::array_t<float> out({rows, heads * d});
  if (window < 0 || softcap < 0) throw py::value_error("attend_prefill: window and softcap must be >= 0");
  decoder::AttentionShape sh{heads, kv, d, cap};
  sh.window = window;
  sh.softcap = static_cast<float>(softcap);
  sh.kv_half = half;
  py::object sinks = checked_sinks(sinks_in, heads, "attend_prefill: ");
  if (!sinks.is_none()) sh.sinks = static_cast<const float*>(py::array(sinks).data());
  const float *qp = static_cast<const float*>(qkv.data()), *cp = static_cast<const float*>(cs.data()),
              *sp = static_cast<const float*>(sn.data());
  void *kp = k.mutable_data(), *vp = v.mutable_data();
  float* op = out.mutable_data();
  py::gil_scoped_release release;
  decoder::attend_prefill(qp, rows, cp, sp, start, sh, static_cast<float>(scale), kp, vp, op);
  return out;
}

// Rows y [n, width] of one sequence, in order, through delta_token: the readouts [n, v_heads * v_dim].
F32Array py_delta_rows(const py::array& y_in, const py::dict& geometry, const py::array& conv,
                       const py::array& dt_bias, const py::array& a, const py::array& norm,
                       const py::array& conv_state, const py::array& state) {
  const decoder::DeltaShape s = delta_shape(geometry, "delta_rows");
  F32Array y = checked_f32(y_in, "y", 2);
  if (y.shape(1) != s.width())
    throw py::value_error("delta_rows: y has " + std::to_string(y.shape(1)) + " columns, expected " +
                          std::to_string(s.width()));
  DeltaArrays d = delta_arrays(s, conv, dt_bias, a, norm, conv_state, state, "delta_rows:");
  const int64_t n = y.shape(0), vd = s.v_heads * s.v_dim;
  F32Array out({n, vd});
  const float* yp = y.data();
  float* op = out.mutable_data();
  py::gil_scoped_release release;
  for (int64_t r = 0; r < n; ++r) decoder::delta_token(yp + r * s.width(), s, d.w, d.conv_state, d.state, op + r * vd);
  return out;
}

// Rows y [n, 3 hidden] of one sequence, in order, through short_conv_token: [n, hidden].
// A prefill's rows of one sequence at positions start.. through delta_chunked.
F32Array py_delta_chunked(const py::array& y_in, int64_t start, const py::dict& geometry, const py::array& conv,
                          const py::array& dt_bias, const py::array& a, const py::array& norm,
                          const py::array& conv_state, const py::array& state) {
  const decoder::DeltaShape s = delta_shape(geometry, "delta_chunked");
  F32Array y = checked_f32(y_in, "y", 2);
  if (y.shape(1) != s.width() || start < 0)
    throw py::value_error("delta_chunked: y has " + std::to_string(y.shape(1)) + " columns, expected " +
                          std::to_string(s.width()) + " (and start >= 0)");
  DeltaArrays d = delta_arrays(s, conv, dt_bias, a, norm, conv_state, state, "delta_chunked:");
  const int64_t n = y.shape(0);
  F32Array out({n, s.v_heads * s.v_dim});
  const float* yp = y.data();
  float* op = out.mutable_data();
  py::gil_scoped_release release;
  if (n) decoder::delta_chunked(yp, n, start, s, d.w, d.conv_state, d.state, op);
  return out;
}

F32Array py_short_conv_rows(const py::array& y_in, const py::array& conv_in, const py::array& state_in) {
  F32Array y = checked_f32(y_in, "y", 2), conv = checked_f32(conv_in, "conv", 2);
  const int64_t kernel = conv.shape(0), h = conv.shape(1);
  if (kernel < 2 || kernel > 16 || y.shape(1) != 3 * h)
    throw py::value_error("short_conv_rows: y must be [n, 3 x hidden] and conv [kernel 2..16, hidden]");
  float* st = static_cast<float*>(f32_array(state_in, "conv_state", {kernel - 1, h}, true).mutable_data());
  const int64_t n = y.shape(0);
  F32Array out({n, h});
  const float *yp = y.data(), *cp = conv.data();
  float* op = out.mutable_data();
  py::gil_scoped_release release;
  for (int64_t r = 0; r < n; ++r) decoder::short_conv_token(yp + r * 3 * h, h, kernel, cp, st, op + r * h);
  return out;
}

F32Array py_sigmoid_mul(const py::array& x_in, const py::array& gate_in) {
  F32Array x = checked_f32(x_in, "x", 2), g = checked_f32(gate_in, "gate", 2);
  if (x.shape(0) != g.shape(0) || x.shape(1) != g.shape(1)) throw py::value_error("sigmoid_mul: x and gate differ in shape");
  F32Array y({x.shape(0), x.shape(1)});
  std::copy(x.data(), x.data() + x.size(), y.mutable_data());
  decoder::sigmoid_mul(g.data(), x.size(), y.mutable_data());
  return y;
}

}  // namespace

void register_decoder(py::module_& m) {
  m.def("delta_rows", &py_delta_rows, py::arg("y"), py::arg("geometry"), py::arg("conv"), py::arg("dt_bias"),
        py::arg("ssm_a"), py::arg("norm"), py::arg("conv_state"), py::arg("state"),
        "Gated DeltaNet rows of one sequence in order (decoder.h delta_token): y [n, width] the layer's "
        "projections; conv_state [kernel - 1, channels] and state [v_heads, k_dim, v_dim] updated in place; "
        "returns the readouts [n, v_heads * v_dim]. geometry: {k_heads, v_heads, k_dim, v_dim, kernel, tiled, eps}.");
  m.def("delta_chunked", &py_delta_chunked, py::arg("y"), py::arg("start"), py::arg("geometry"), py::arg("conv"),
        py::arg("dt_bias"), py::arg("ssm_a"), py::arg("norm"), py::arg("conv_state"), py::arg("state"),
        "Gated DeltaNet over a prefill's rows y [n, width] at positions start.. in the chunked form (decoder.h "
        "delta_chunked): the states updated; returns the readouts [n, v_heads * v_dim].");
  m.attr("DELTA_CHUNK") = decoder::kDeltaChunk;
  m.def("short_conv_rows", &py_short_conv_rows, py::arg("y"), py::arg("conv"), py::arg("conv_state"),
        "LFM2's short convolution over rows y [n, 3 hidden] (B, C, x) of one sequence in order (decoder.h "
        "short_conv_token): conv [kernel, hidden], conv_state [kernel - 1, hidden] updated; returns [n, hidden].");
  m.def("sigmoid_mul", &py_sigmoid_mul, py::arg("x"), py::arg("gate"), "x * sigmoid(gate), a new array.");
  m.def("rms_norm", &py_rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("silu_mul", [](const py::array& gu) { return py_gated_mul<decoder::silu_mul>(gu, "silu_mul"); },
        py::arg("gate_up"));
  m.def("gelu_tanh_mul", [](const py::array& gu) { return py_gated_mul<decoder::gelu_tanh_mul>(gu, "gelu_tanh_mul"); },
        py::arg("gate_up"));
  m.def("clamped_swiglu_mul", [](const py::array& gu_in, double limit, double alpha) {
        if (!(limit > 0) || !std::isfinite(alpha)) throw py::value_error("clamped_swiglu_mul: limit must be > 0");
        py::array gu = f32_array(gu_in, "gate_up", {-1, -1});
        if (gu.shape(1) % 2) throw py::value_error("clamped_swiglu_mul: gate_up must have an even number of columns");
        py::array_t<float> y({gu.shape(0), gu.shape(1) / 2});
        decoder::clamped_swiglu_mul(static_cast<const float*>(gu.data()), gu.shape(0), gu.shape(1) / 2,
                                    static_cast<float>(limit), static_cast<float>(alpha), y.mutable_data());
        return y;
      }, py::arg("gate_up"), py::arg("limit"), py::arg("alpha") = 1.702, "GPT-OSS's clamped SwiGLU of gate_up [rows, 2n] (gate first).");
  m.def("shared_expert_add", &py_shared_expert_add, py::arg("y"), py::arg("x"), py::arg("shared"), py::arg("gelu") = false);
  m.def("softcap", &py_softcap, py::arg("x"), py::arg("cap"));
  m.def("attend_one", &py_attend_one, py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("pos"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("heads"), py::arg("scale"), py::arg("window") = 0,
        py::arg("softcap") = 0.f, py::arg("sinks") = py::none());
  m.def("attend_prefill", &py_attend_prefill, py::arg("qkv"), py::arg("cos"), py::arg("sin"), py::arg("start"),
        py::arg("k_cache"), py::arg("v_cache"), py::arg("heads"), py::arg("scale"), py::arg("window") = 0,
        py::arg("softcap") = 0.0, py::arg("sinks") = py::none());
  // keys per block of attend_prefill's online softmax, blocks aligned to absolute positions
  m.attr("PREFILL_KEY_BLOCK") = decoder::kKeyBlock;
}

}  // namespace qlinear::bindings
