// Binds routed experts for qlinear.llm (internal API, every array checked here): MoeLayer, a
// layer's router and experts over packed weights, called on rows (the Python path's routed MLP)
// or handed to decode_step; and moe_route, the router's choice alone (both: qlinear/moe.h).
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "bindings/bindings.h"
#include "qlinear/moe.h"

namespace qlinear::bindings {

namespace {

struct PyMoeLayer {
  decoder::MoeLayer layer;
  decoder::MoeScratch scratch;
  std::mutex mutex;  // one call at a time (the scratch)
};

constexpr int64_t kMaxTopK = 64;

void check_routing(int64_t experts, int64_t top_k) {
  if (experts < 1) throw py::value_error("routed experts: the router has no experts");
  if (top_k < 1 || top_k > experts || top_k > kMaxTopK)
    throw py::value_error("routed experts: top_k " + std::to_string(top_k) + " must be in 1.." +
                          std::to_string(std::min(experts, kMaxTopK)) + " (experts: " + std::to_string(experts) + ")");
}

// The router's weight [experts, hidden] and bias (or None), checked; the arrays kept in refs.
void set_router(decoder::MoeLayer& L, const py::handle& router, const py::handle& bias, py::list& refs) {
  py::array r = f32_array(router, "router", {-1, -1});
  L.experts = r.shape(0), L.hidden = r.shape(1);
  L.router = static_cast<const float*>(r.data());
  refs.append(r);
  if (!bias.is_none()) {
    py::array b = f32_array(bias, "router bias", {L.experts});
    L.router_bias = static_cast<const float*>(b.data());
    refs.append(b);
  }
}

py::array rows_of(const py::array& x_in, int64_t hidden) {
  return f32_array(x_in, "x", {-1, hidden});
}

py::object moe_layer(const py::array& router, const py::object& router_bias, const py::list& experts,
                     int64_t top_k, bool norm_topk_prob, bool gelu) {
  auto m = std::make_unique<PyMoeLayer>();
  decoder::MoeLayer& L = m->layer;
  py::list refs;
  set_router(L, router, router_bias, refs);
  check_routing(L.experts, top_k);
  if (static_cast<int64_t>(py::len(experts)) != L.experts)
    throw py::value_error("routed experts: " + std::to_string(py::len(experts)) + " experts given, the router has " +
                          std::to_string(L.experts));
  L.top_k = top_k, L.norm_topk = norm_topk_prob, L.gelu = gelu;
  for (int64_t e = 0; e < L.experts; ++e) {
    const std::string p = "expert " + std::to_string(e) + " ";
    py::handle pair = experts[py::int_(e)];
    if (!py::isinstance<py::tuple>(pair) || py::len(pair) != 2)
      throw py::type_error(p + "must be a tuple (gate_up, down)");
    py::tuple t = py::reinterpret_borrow<py::tuple>(pair);
    L.gate_up.push_back(step_linear(t[0], p + "gate_up", -1, L.hidden, refs));
    const int64_t inter = L.gate_up.back().w->n / 2;
    if (L.gate_up.back().w->n % 2 || inter < 1 || (e > 0 && inter != L.inter))
      throw py::value_error(p + "gate_up has " + std::to_string(L.gate_up.back().w->n) +
                            " rows: not 2 x the experts' width");
    L.inter = inter;
    L.down.push_back(step_linear(t[1], p + "down", L.hidden, inter, refs));
  }
  py::object obj = py::cast(std::move(m));
  obj.attr("_refs") = refs;
  return obj;
}

py::array_t<float> moe_call(PyMoeLayer& m, const py::array& x_in) {
  const decoder::MoeLayer& L = m.layer;
  py::array x = rows_of(x_in, L.hidden);
  const int64_t rows = x.shape(0);
  py::array_t<float> y({rows, L.hidden});
  const float* xp = static_cast<const float*>(x.data());
  float* yp = y.mutable_data();
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(m.mutex);
  decoder::moe_mlp(L, xp, rows, yp, m.scratch, false);
  return y;
}

// (experts [rows, k] int32, highest first; weights [rows, k] float32) of x [rows, hidden].
py::tuple moe_route(const py::array& x_in, const py::array& router, const py::object& router_bias, int64_t top_k,
                    bool norm_topk_prob) {
  decoder::MoeLayer L;
  py::list refs;
  set_router(L, router, router_bias, refs);
  check_routing(L.experts, top_k);
  py::array x = rows_of(x_in, L.hidden);
  const int64_t rows = x.shape(0);
  py::array_t<int32_t> idx({rows, top_k});
  py::array_t<float> w({rows, top_k});
  std::vector<float> logits(static_cast<size_t>(rows * L.experts));
  const float* xp = static_cast<const float*>(x.data());
  int32_t* ip = idx.mutable_data();
  float* wp = w.mutable_data();
  {
    py::gil_scoped_release release;
    decoder::router_logits(L, xp, rows, logits.data());
    decoder::route(logits.data(), rows, L.experts, top_k, norm_topk_prob, ip, wp);
  }
  return py::make_tuple(idx, w);
}

}  // namespace

const decoder::MoeLayer* moe_layer_of(const py::handle& obj) {
  if (!py::isinstance<PyMoeLayer>(obj)) return nullptr;
  return &obj.cast<PyMoeLayer&>().layer;
}

void register_moe(py::module_& m) {
  py::class_<PyMoeLayer>(m, "MoeLayer", py::dynamic_attr())
      .def("__call__", &moe_call, py::arg("x"),
           "The routed MLP of x [rows, hidden] (rows grouped by expert, one GEMM per expert).")
      .def_property_readonly("experts", [](const PyMoeLayer& s) { return s.layer.experts; })
      .def_property_readonly("top_k", [](const PyMoeLayer& s) { return s.layer.top_k; })
      .def_property_readonly("bytes_read", [](const PyMoeLayer& s) { return s.layer.bytes_read.load(); },
                             "Packed bytes of the experts run, over all calls (this object's and a decode step's).");
  m.def("moe_layer", &moe_layer, py::arg("router"), py::arg("router_bias"), py::arg("experts"), py::arg("top_k"),
        py::arg("norm_topk_prob"), py::arg("gelu") = false,
        "Routed experts over packed weights: router [experts, hidden] float32 (bias [experts] or None), experts "
        "[(gate_up, down)] each a (PackedWeightHandle, bias or None, act_int8, act_block), top_k of them per row.");
  m.def("moe_route", &moe_route, py::arg("x"), py::arg("router"), py::arg("router_bias"), py::arg("top_k"),
        py::arg("norm_topk_prob"),
        "The experts of each row of x [rows, hidden] (int32 [rows, top_k], highest first, ties the lower) and "
        "their weights (float32 [rows, top_k]): softmax of the router's logits, renormalized with norm_topk_prob.");
}

}  // namespace qlinear::bindings
