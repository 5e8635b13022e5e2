// Binds the decode step of qlinear.llm in one call: the DecodeStep class (step, step_block,
// step_batch) and decode_step, which makes one over packed weights (internal API: every array
// checked here; the step keeps what it points into alive).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/llm/decoder.h"
#include "qlinear/llm/decoder_step.h"

namespace qlinear::bindings {

using decoder::DecodeStep;
using decoder::StepLinear;

// (handle, bias or None, act_int8, act_block) -> StepLinear with n x k checked
StepLinear step_linear(const py::handle& spec, const std::string& what, int64_t n, int64_t k, py::list& refs) {
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
  if (!t[1].is_none()) l.bias = static_cast<const float*>(f32_array(t[1], what + " bias", {g.n}).data());
  if (!py::isinstance<py::bool_>(t[2])) throw py::type_error(what + ": act_int8 must be a bool");
  l.act_int8 = t[2].cast<bool>();
  l.act_block = t[3].cast<int64_t>();
  if (l.act_int8 && (l.act_block <= 0 || (l.act_block < g.k && l.act_block % g.block != 0)))
    throw py::value_error(what + ": act_block must be >= K or a positive multiple of the weight's block " +
                          std::to_string(g.block));
  refs.append(t);
  return l;
}

namespace {

py::array_t<float> step(DecodeStep& s, const py::array& h_in, int64_t pos) {
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
}

// b tokens of the step's own sequence at positions pos.. (a speculative verification).
py::array_t<float> step_block(DecodeStep& s, const py::array& h_in, int64_t pos) {
  const decoder::StepModel& md = s.model();
  if (!py::isinstance<py::array>(h_in) || h_in.ndim() != 2 || h_in.shape(0) < 1)
    throw py::value_error("step_block: h must be a [tokens, hidden] float32 array");
  const int64_t b = h_in.shape(0);
  py::array h = f32_array(h_in, "h", {b, md.hidden});
  if (pos < 0 || pos + b > md.attn.capacity || pos + b > md.rope_rows)
    throw py::value_error("step_block: positions " + std::to_string(pos) + ".." + std::to_string(pos + b - 1) +
                          " are outside the cache (" + std::to_string(md.attn.capacity) + ") or the RoPE tables (" +
                          std::to_string(md.rope_rows) + ")");
  py::array_t<float> logits({b, md.lm_head.w->n});
  const float* hp = static_cast<const float*>(h.data());
  float* out = logits.mutable_data();
  py::gil_scoped_release release;
  s.run_block(hp, pos, b, out);
  return logits;
}

py::object decode_step(const py::list& layers, const py::array& final_norm, const py::tuple& lm_head,
                       int64_t heads, double eps, double scale, bool gelu, double attn_softcap,
                       double final_softcap, int64_t context) {
  py::list refs;
  if (py::len(layers) < 1) throw py::value_error("decode_step: no layers");
  if (attn_softcap < 0 || final_softcap < 0) throw py::value_error("decode_step: soft-caps must be >= 0");
  py::array fn = f32_array(final_norm, "final_norm", {-1});
  const int64_t hidden = fn.shape(0);
  decoder::StepModel md;
  std::vector<decoder::LayerCache> caches;
  md.hidden = hidden;
  md.eps = static_cast<float>(eps);
  md.scale = static_cast<float>(scale);
  md.gelu = gelu;
  md.final_softcap = static_cast<float>(final_softcap);
  md.final_norm = static_cast<const float*>(fn.data());
  md.lm_head = step_linear(lm_head, "lm_head", -1, hidden, refs);
  const auto optional = [&](const py::dict& o, const char* key, const std::string& what, int64_t n) {
    if (!o.contains(key) || o[key].is_none()) return static_cast<const float*>(nullptr);
    return static_cast<const float*>(f32_array(o[key], what + key, {n}).data());
  };
  // the attention's geometry from the attention layers' caches (a delta layer has none)
  bool any_attention = false;
  for (size_t i = 0; i < py::len(layers); ++i) {
    const std::string p = "layer " + std::to_string(i) + " ";
    if (!py::isinstance<py::tuple>(layers[i]) || py::len(layers[i]) != 11)
      throw py::type_error(p + "must be a tuple (qkv, o, gate_up, down, input_norm, post_norm, k_cache, "
                               "v_cache, cos, sin, options dict)");
    py::tuple t = layers[i].cast<py::tuple>();
    if (!py::isinstance<py::dict>(t[10])) throw py::type_error(p + "options must be a dict");
    py::dict o = t[10].cast<py::dict>();
    for (auto item : o) {
      const std::string key = py::str(item.first);
      if (key != "q_norm" && key != "k_norm" && key != "attn_out_norm" && key != "mlp_out_norm" && key != "moe" &&
          key != "delta" && key != "gate" && key != "short_conv" && key != "sinks")
        throw py::value_error(p + "unknown option '" + key + "'");
    }
    decoder::StepLayer L;
    if (o.contains("delta") && !o["delta"].is_none()) {  // a Gated DeltaNet layer: its states, no KV cache
      if (!py::isinstance<py::dict>(o["delta"])) throw py::type_error(p + "delta must be a dict");
      py::dict dd = o["delta"].cast<py::dict>();
      for (const char* key : {"geometry", "conv", "dt_bias", "ssm_a", "norm", "conv_state", "state", "record"})
        if (!dd.contains(key)) throw py::value_error(p + "delta has no '" + key + "'");
      if (!py::isinstance<py::dict>(dd["geometry"])) throw py::type_error(p + "delta geometry must be a dict");
      L.delta = true;
      L.delta_shape = delta_shape(dd["geometry"].cast<py::dict>(), p + "delta");
      const DeltaArrays a = delta_arrays(L.delta_shape, dd["conv"], dd["dt_bias"], dd["ssm_a"], dd["norm"],
                                         dd["conv_state"], dd["state"], p + "delta");
      L.delta_weights = a.w;
      const int64_t width = L.delta_shape.width(), vd = L.delta_shape.v_heads * L.delta_shape.v_dim;
      py::array rec = f32_array(dd["record"], p + "delta record", {-1, width}, true);
      if (rec.shape(0) < 1) throw py::value_error(p + "delta record must hold >= 1 row");
      L.qkv = step_linear(t[0], p + "delta_in", width, hidden, refs);
      L.o = step_linear(t[1], p + "delta_out", hidden, vd, refs);
      decoder::LayerCache c;
      c.conv_state = a.conv_state, c.state = a.state;
      c.record = static_cast<float*>(rec.mutable_data()), c.record_rows = rec.shape(0);
      caches.push_back(c);
      refs.append(dd);
    } else if (o.contains("short_conv") && !o["short_conv"].is_none()) {  // LFM2's: its conv state, no KV cache
      if (!py::isinstance<py::dict>(o["short_conv"])) throw py::type_error(p + "short_conv must be a dict");
      py::dict sc = o["short_conv"].cast<py::dict>();
      for (const char* key : {"conv", "conv_state", "record"})
        if (!sc.contains(key)) throw py::value_error(p + "short_conv has no '" + key + "'");
      py::array taps = f32_array(sc["conv"], p + "short_conv taps", {-1, hidden});
      L.conv_kernel = taps.shape(0);
      if (L.conv_kernel < 2 || L.conv_kernel > 16) throw py::value_error(p + "short_conv kernel must be 2..16");
      L.conv = static_cast<const float*>(taps.data());
      py::array cs = f32_array(sc["conv_state"], p + "short_conv conv_state", {L.conv_kernel - 1, hidden}, true);
      py::array rec = f32_array(sc["record"], p + "short_conv record", {-1, 3 * hidden}, true);
      if (rec.shape(0) < 1) throw py::value_error(p + "short_conv record must hold >= 1 row");
      L.qkv = step_linear(t[0], p + "conv_in", 3 * hidden, hidden, refs);
      L.o = step_linear(t[1], p + "conv_out", hidden, hidden, refs);
      decoder::LayerCache c;
      c.conv_state = static_cast<float*>(cs.mutable_data());
      c.record = static_cast<float*>(rec.mutable_data()), c.record_rows = rec.shape(0);
      caches.push_back(c);
      refs.append(sc);
    } else {
      const bool half = checked_kv_pair(t[6], t[7], p);
      if (any_attention && half != md.attn.kv_half)
        throw py::type_error(p + "caches: every layer's k and v caches must be of one dtype");
      py::array kc = py::reinterpret_borrow<py::array>(t[6]), vc = py::reinterpret_borrow<py::array>(t[7]);
      const int64_t kv = kc.shape(0), cap = kc.shape(1), d = kc.shape(2);
      if (kv < 1 || heads < 1 || heads % kv || d < 2 || d % 2 || d > decoder::kMaxHeadDim || cap < 1 ||
          (any_attention && (kv != md.attn.kv_heads || d != md.attn.head_dim)))
        throw py::value_error(p + "bad head counts or head_dim");
      md.attn = decoder::AttentionShape{heads, kv, d, std::max(md.attn.capacity, cap)};
      md.attn.softcap = static_cast<float>(attn_softcap);
      md.attn.kv_half = half;
      py::array cs = f32_array(t[8], p + "cos", {-1, d / 2}), sn = f32_array(t[9], p + "sin", {cs.shape(0), d / 2});
      md.rope_rows = !any_attention ? cs.shape(0) : std::min(md.rope_rows, cs.shape(0));
      any_attention = true;
      L.gated = o.contains("gate") && o["gate"].cast<bool>();
      L.qkv = step_linear(t[0], p + "qkv", (heads + 2 * kv + (L.gated ? heads : 0)) * d, hidden, refs);
      L.o = step_linear(t[1], p + "o", hidden, heads * d, refs);
      L.q_norm = optional(o, "q_norm", p, d);
      L.k_norm = optional(o, "k_norm", p, d);
      L.sinks = optional(o, "sinks", p, heads);
      caches.push_back({kc.mutable_data(), vc.mutable_data(), cap});
      L.cos = static_cast<const float*>(cs.data());
      L.sin = static_cast<const float*>(sn.data());
      for (py::handle a : {py::handle(kc), py::handle(vc), py::handle(cs), py::handle(sn)}) refs.append(a);
    }
    if (o.contains("moe") && !o["moe"].is_none()) {  // routed experts instead of gate_up / down
      if (!(L.moe = moe_layer_of(o["moe"])) || L.moe->hidden != hidden || !t[2].is_none() || !t[3].is_none())
        throw py::value_error(p + "moe must be a MoeLayer of hidden " + std::to_string(hidden) +
                              ", with gate_up and down None");
      refs.append(o["moe"]);
    } else {
      L.gate_up = step_linear(t[2], p + "gate_up", -1, hidden, refs);
      const int64_t inter = L.gate_up.w->n / 2;
      if (L.gate_up.w->n % 2 || (md.intermediate && inter != md.intermediate))
        throw py::value_error(p + "gate_up has " + std::to_string(L.gate_up.w->n) + " rows: not 2 x intermediate");
      md.intermediate = inter;
      L.down = step_linear(t[3], p + "down", hidden, inter, refs);
    }
    L.input_norm = static_cast<const float*>(f32_array(t[4], p + "input_norm", {hidden}).data());
    L.post_norm = static_cast<const float*>(f32_array(t[5], p + "post_norm", {hidden}).data());
    L.attn_out_norm = optional(o, "attn_out_norm", p, hidden);
    L.mlp_out_norm = optional(o, "mlp_out_norm", p, hidden);
    refs.append(t);
    md.layers.push_back(L);
  }
  if (!any_attention) throw py::value_error("decode_step: no attention layer");
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
}

}  // namespace

void register_decode_step(py::module_& m) {
  py::class_<DecodeStep>(m, "DecodeStep", py::dynamic_attr())
      .def("step", &step, py::arg("h"), py::arg("pos"),
           "One token: h = its embedding [hidden] at position pos; returns the logits [1, vocab].")
      .def("step_block", &step_block, py::arg("h"), py::arg("pos"),
           "Tokens of the step's own sequence at positions pos, pos + 1, ... (a speculative verification): "
           "h = their embeddings [B, hidden]; returns the logits [B, vocab], row j the bits of the one-token "
           "step at pos + j after the rows before it.")
      .def("step_batch", &step_batch, py::arg("h"), py::arg("pos"), py::arg("k_caches"), py::arg("v_caches"),
           py::arg("contexts"), py::arg("states") = py::none(),
           "B tokens of sequences (continuous batching): h = their embeddings [B, hidden], row r at position "
           "pos[r] of a sequence of contexts[r] positions over its own caches: k_caches[r][layer] / "
           "v_caches[r][layer] [kv_heads, capacity, head_dim] (a sliding layer's capacity: min(context, window)); "
           "rows of one sequence (a verification) share all its caches at consecutive positions; states[r][layer]: "
           "a Gated DeltaNet layer's (conv_state, state, record) of row r's sequence (None for the others); "
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
  m.def("decode_step", &decode_step, py::arg("layers"), py::arg("final_norm"), py::arg("lm_head"), py::arg("heads"),
        py::arg("eps"), py::arg("scale"), py::arg("gelu") = false, py::arg("attn_softcap") = 0.0,
        py::arg("final_softcap") = 0.0, py::arg("context") = 0,
        "A DecodeStep over packed weights: layers = [(qkv, o, gate_up, down, input_norm, post_norm, k_cache, "
        "v_cache, cos, sin, options)], each linear (PackedWeightHandle, bias or None, act_int8, act_block), "
        "caches [kv_heads, capacity, head_dim] (a layer's cache shorter than the context, by default the "
        "longest cache, is a sliding window's ring), RoPE tables [rows, head_dim / 2], options {q_norm, k_norm, sinks, attn_out_norm, "
        "mlp_out_norm} (arrays or None) and moe (a MoeLayer, gate_up and down then None).");
}

}  // namespace qlinear::bindings
