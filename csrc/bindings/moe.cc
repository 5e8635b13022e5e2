// Binds routed experts for qlinear.llm (internal API, every array checked here): MoeLayer, a layer's router,
// experts (and shared expert) over packed weights, called on rows (the Python path) or handed to decode_step;
// MoeExperts, the same MLP over slots the caller refills (flash); moe_route, the router's choice (llm/moe.h).
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "bindings/bindings.h"
#include "qlinear/llm/moe.h"

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

decoder::ExpertActivation activation(bool gelu, double swiglu_limit, double swiglu_alpha) {
  if (!(swiglu_limit >= 0) || !std::isfinite(swiglu_limit) || !std::isfinite(swiglu_alpha))
    throw py::value_error("routed experts: swiglu_limit must be >= 0 and swiglu_alpha finite");
  decoder::ExpertActivation a;
  a.gelu = gelu, a.swiglu_limit = static_cast<float>(swiglu_limit), a.swiglu_alpha = static_cast<float>(swiglu_alpha);
  return a;
}

py::object moe_layer(const py::array& router, const py::object& router_bias, const py::list& experts,
                     int64_t top_k, bool norm_topk_prob, bool gelu, double swiglu_limit, double swiglu_alpha,
                     const py::object& shared) {
  auto m = std::make_unique<PyMoeLayer>();
  decoder::MoeLayer& L = m->layer;
  py::list refs;
  set_router(L, router, router_bias, refs);
  check_routing(L.experts, top_k);
  if (static_cast<int64_t>(py::len(experts)) != L.experts)
    throw py::value_error("routed experts: " + std::to_string(py::len(experts)) + " experts given, the router has " +
                          std::to_string(L.experts));
  L.top_k = top_k, L.norm_topk = norm_topk_prob, L.act = activation(gelu, swiglu_limit, swiglu_alpha);
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
  if (!shared.is_none()) {  // (gate_up, down, gate [hidden]): the shared expert
    const auto t = shared.cast<py::tuple>();
    L.shared_gate_up = step_linear(t[0], "shared gate_up", -1, L.hidden, refs);
    L.shared_inter = L.shared_gate_up.w->n / 2;
    L.shared_down = step_linear(t[1], "shared down", L.hidden, L.shared_inter, refs);
    py::array g = f32_array(t[2], "shared gate", {L.hidden});
    refs.append(g), L.shared_gate = static_cast<const float*>(g.data());
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

// Routed experts whose weights sit in slots that are refilled over time (memory="flash": experts
// read from the file on demand): begin(x, top, w) takes a layer's rows and their routing, run()
// the experts whose slots are ready (any order, any grouping), finish() their weighted sum in
// ascending expert order: moe_mlp's stages, so the bits equal the in-memory MoeLayer's.
struct PyMoeExperts {
  int64_t hidden = 0, inter = 0, experts = 0, top_k = 0, rows = 0;
  bool begun = false;
  decoder::ExpertActivation act;
  std::vector<decoder::StepLinear> gate_up, down;  // per slot
  std::vector<float> x, gate_up_bias, down_bias;  // the layer's experts' biases ([experts, n]; empty: none)
  std::vector<decoder::StepLinear> task_gate_up, task_down;  // a run's slots with its experts' biases
  std::vector<char> ran;  // per expert: run since begin
  decoder::MoeScratch scratch;
  std::mutex mutex;
};

py::object moe_experts(const py::list& slots, int64_t experts, int64_t top_k, bool gelu, double swiglu_limit,
                       double swiglu_alpha) {
  auto m = std::make_unique<PyMoeExperts>();
  check_routing(experts, top_k);
  if (py::len(slots) < 1) throw py::value_error("expert slots: none given");
  m->experts = experts, m->top_k = top_k, m->act = activation(gelu, swiglu_limit, swiglu_alpha);
  py::list refs;
  for (size_t i = 0; i < py::len(slots); ++i) {
    const std::string p = "slot " + std::to_string(i) + " ";
    py::handle pair = slots[i];
    if (!py::isinstance<py::tuple>(pair) || py::len(pair) != 2)
      throw py::type_error(p + "must be a tuple (gate_up, down)");
    py::tuple t = py::reinterpret_borrow<py::tuple>(pair);
    if (!py::isinstance<py::tuple>(t[0]) || py::len(t[0]) != 4 ||
        !py::isinstance<PackedWeightHandle>(py::reinterpret_borrow<py::tuple>(t[0])[0]))
      throw py::type_error(p + "gate_up must be a tuple (PackedWeightHandle, bias or None, act_int8, act_block)");
    if (i == 0) m->hidden = py::reinterpret_borrow<py::tuple>(t[0])[0].cast<const PackedWeightHandle&>().geom().k;
    m->gate_up.push_back(step_linear(t[0], p + "gate_up", m->inter ? 2 * m->inter : -1, m->hidden, refs));
    const int64_t n = m->gate_up.back().w->n;
    if (n % 2 || n < 2) throw py::value_error(p + "gate_up has " + std::to_string(n) + " rows: not 2 x a width");
    m->inter = n / 2;
    m->down.push_back(step_linear(t[1], p + "down", m->hidden, m->inter, refs));
  }
  py::object obj = py::cast(std::move(m));
  obj.attr("_refs") = refs;
  return obj;
}

// An optional [experts, n] float32 bias per expert, copied (empty: none).
std::vector<float> expert_biases(const py::object& b, const char* name, int64_t experts, int64_t n) {
  if (b.is_none()) return {};
  py::array a = f32_array(b, name, {experts, n});
  const float* p = static_cast<const float*>(a.data());
  return std::vector<float>(p, p + experts * n);
}

void experts_begin(PyMoeExperts& m, const py::array& x_in, const py::array& top, const py::array& w_in,
                   const py::object& gate_up_bias, const py::object& down_bias) {
  py::array x = rows_of(x_in, m.hidden);
  const int64_t rows = x.shape(0), k = m.top_k;
  if (top.dtype().kind() != 'i' && top.dtype().kind() != 'u')
    throw py::type_error("top must be an integer array, got " + dtype_str(top));
  auto idx = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(top);
  if (!idx || idx.ndim() != 2 || idx.shape(0) != rows || idx.shape(1) != k)
    throw py::value_error("top must be [" + std::to_string(rows) + ", " + std::to_string(k) + "]");
  py::array w = f32_array(w_in, "w", {rows, k});
  std::vector<float> gub = expert_biases(gate_up_bias, "gate_up_bias", m.experts, 2 * m.inter),
                     dnb = expert_biases(down_bias, "down_bias", m.experts, m.hidden);
  std::lock_guard<std::mutex> lock(m.mutex);
  m.gate_up_bias.swap(gub), m.down_bias.swap(dnb);
  auto& s = m.scratch;
  const int32_t* ip = idx.data();
  for (int64_t p = 0; p < rows * k; ++p)
    if (ip[p] < 0 || ip[p] >= m.experts)
      throw py::value_error("top names expert " + std::to_string(ip[p]) + " of " + std::to_string(m.experts));
  s.idx.assign(ip, ip + rows * k);
  const float* wp = static_cast<const float*>(w.data());
  s.w.assign(wp, wp + rows * k);
  const float* xp = static_cast<const float*>(x.data());
  m.x.assign(xp, xp + rows * m.hidden);
  m.rows = rows;
  decoder::group_by_expert(s.idx.data(), rows, k, m.experts, m.hidden, m.inter, s);
  m.ran.assign(m.experts, 0);
  m.begun = true;
}

void experts_run(PyMoeExperts& m, const std::vector<int64_t>& experts, const std::vector<int64_t>& slots) {
  if (experts.size() != slots.size())
    throw py::value_error("run: " + std::to_string(experts.size()) + " experts but " + std::to_string(slots.size()) +
                          " slots");
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!m.begun) throw py::value_error("run: no rows begun");
  auto& s = m.scratch;
  s.tasks.clear();
  for (size_t i = 0; i < experts.size(); ++i) {
    const int64_t e = experts[i], slot = slots[i];
    if (e < 0 || e >= m.experts || !s.count[e] || m.ran[e])
      throw py::value_error("run: expert " + std::to_string(e) + " is not one the rows chose and has not run");
    if (slot < 0 || slot >= static_cast<int64_t>(m.gate_up.size()))
      throw py::value_error("run: slot " + std::to_string(slot) + " of " + std::to_string(m.gate_up.size()));
    for (size_t j = 0; j < i; ++j)
      if (experts[j] == e) throw py::value_error("run: expert " + std::to_string(e) + " given twice");
    s.tasks.push_back(decoder::ExpertTask{e, &m.gate_up[slot], &m.down[slot]});
  }
  m.task_gate_up.resize(s.tasks.size()), m.task_down.resize(s.tasks.size());
  for (size_t i = 0; i < s.tasks.size(); ++i) {  // the slot's weights, the expert's biases
    auto& t = s.tasks[i];
    m.task_gate_up[i] = *t.gate_up, m.task_down[i] = *t.down;
    if (!m.gate_up_bias.empty()) m.task_gate_up[i].bias = m.gate_up_bias.data() + t.expert * 2 * m.inter;
    if (!m.down_bias.empty()) m.task_down[i].bias = m.down_bias.data() + t.expert * m.hidden;
    t.gate_up = &m.task_gate_up[i], t.down = &m.task_down[i];
  }
  for (const auto& t : s.tasks) m.ran[t.expert] = 1;  // all checked first: a refused call runs none
  py::gil_scoped_release release;
  decoder::run_experts(s.tasks.data(), static_cast<int64_t>(s.tasks.size()), m.x.data(), m.hidden, m.inter, m.top_k,
                       m.act, s, false);
}

py::array_t<float> experts_finish(PyMoeExperts& m) {
  std::lock_guard<std::mutex> lock(m.mutex);
  if (!m.begun) throw py::value_error("finish: no rows begun");
  for (int64_t e : m.scratch.used)
    if (!m.ran[e]) throw py::value_error("finish: expert " + std::to_string(e) + " has not run");
  py::array_t<float> y({m.rows, m.hidden});
  float* yp = y.mutable_data();
  {
    py::gil_scoped_release release;
    decoder::sum_experts(m.scratch.idx.data(), m.scratch.w.data(), m.rows, m.top_k, m.hidden, m.scratch, yp);
  }
  m.begun = false;
  return y;
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
        py::arg("norm_topk_prob"), py::arg("gelu") = false, py::arg("swiglu_limit") = 0.0,
        py::arg("swiglu_alpha") = 1.702, py::arg("shared") = py::none(), "Routed experts over packed weights: router [experts, hidden] float32 (bias [experts] or None), experts "
        "[(gate_up, down)] each a (PackedWeightHandle, bias or None, act_int8, act_block), top_k of them per row; shared: "
        "(gate_up, down, gate [hidden]) of a shared expert every row runs, scaled by sigmoid(x . gate), or None.");
  py::class_<PyMoeExperts>(m, "MoeExperts", py::dynamic_attr())
      .def("begin", &experts_begin, py::arg("x"), py::arg("top"), py::arg("w"), py::arg("gate_up_bias") = py::none(),
           py::arg("down_bias") = py::none(),
           "Rows x [rows, hidden] and their experts top [rows, top_k] (integers) with weights w [rows, top_k]; the "
           "layer's experts' biases gate_up_bias [experts, 2 inter] / down_bias [experts, hidden] float32, or None.")
      .def("run", &experts_run, py::arg("experts"), py::arg("slots"),
           "Run these experts of the rows begun, expert i's weights in slot slots[i] (the pool splits them).")
      .def("finish", &experts_finish, "y [rows, hidden]: the experts' outputs summed in ascending expert order.")
      .def_property_readonly("hidden", [](const PyMoeExperts& s) { return s.hidden; })
      .def_property_readonly("slots", [](const PyMoeExperts& s) { return static_cast<int64_t>(s.gate_up.size()); });
  m.def("moe_experts", &moe_experts, py::arg("slots"), py::arg("experts"), py::arg("top_k"), py::arg("gelu") = false,
        py::arg("swiglu_limit") = 0.0, py::arg("swiglu_alpha") = 1.702, "Routed experts over weight slots [(gate_up, down)] (each a (PackedWeightHandle, bias or None, act_int8, "
        "act_block)) refilled by the caller: a layer of `experts` experts, top_k per row.");
  m.def("moe_route", &moe_route, py::arg("x"), py::arg("router"), py::arg("router_bias"), py::arg("top_k"),
        py::arg("norm_topk_prob"),
        "The experts of each row of x [rows, hidden] (int32 [rows, top_k], highest first, ties the lower) and "
        "their weights (float32 [rows, top_k]): softmax of the router's logits, renormalized with norm_topk_prob.");
}

}  // namespace qlinear::bindings
