// Binds DecodeStep.step_batch (decode_step.cc registers it): B tokens of sequences, each over its
// own caches (and a hybrid's recurrent states), checked here between two steps (holding the GIL).
#include <algorithm>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/llm/decoder.h"
#include "qlinear/llm/decoder_step.h"

namespace qlinear::bindings {

using decoder::DecodeStep;

py::array_t<float> step_batch(DecodeStep& s, const py::array& h_in, const std::vector<int64_t>& pos,
                              const py::list& k_caches, const py::list& v_caches,
                              const std::vector<int64_t>& contexts, const py::object& states) {
  const decoder::StepModel& md = s.model();
  const std::vector<decoder::LayerCache>& own = s.caches();
  const int64_t b = static_cast<int64_t>(pos.size()), nl = static_cast<int64_t>(own.size());
  const int64_t kv = md.attn.kv_heads, d = md.attn.head_dim;
  if (b < 1 || static_cast<int64_t>(py::len(k_caches)) != b ||
      static_cast<int64_t>(py::len(v_caches)) != b || static_cast<int64_t>(contexts.size()) != b)
    throw py::value_error("step_batch: pos, k_caches, v_caches and contexts must hold the same number "
                          "(>= 1) of rows");
  py::array h = f32_array(h_in, "h", {b, md.hidden});
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
      py::object st = states;
      const bool has_delta = std::any_of(md.layers.begin(), md.layers.end(),
                                         [](const auto& L) { return L.delta || L.conv_kernel; });
      if (has_delta && (states.is_none() || static_cast<int64_t>(py::len(states)) != b ||
                        static_cast<int64_t>(py::len(states[py::int_(r)])) != nl))
        throw py::value_error(what + "states must hold a list of " + std::to_string(nl) +
                              " layers' states per row (the model has Gated DeltaNet layers)");
      for (int64_t i = 0; i < nl; ++i) {
        const decoder::StepLayer& SL = md.layers[i];
        if (SL.delta || SL.conv_kernel) {  // (conv_state, state or None, record) of this sequence
          const std::string layer = what + "layer " + std::to_string(i) + " ";
          py::object t = states[py::int_(r)][py::int_(i)];
          if (!py::isinstance<py::tuple>(t) || py::len(t) != 3)
            throw py::type_error(layer + "state must be a tuple (conv_state, state or None, record)");
          const decoder::DeltaShape& ds = SL.delta_shape;
          const int64_t rows_of_conv = SL.delta ? ds.kernel - 1 : SL.conv_kernel - 1;
          const int64_t conv_width = SL.delta ? ds.channels() : md.hidden;
          py::tuple tt = t.cast<py::tuple>();
          py::array cs = f32_array(tt[0], layer + "conv_state", {rows_of_conv, conv_width}, true);
          py::array rc = f32_array(tt[2], layer + "record", {-1, SL.qkv.w->n}, true);
          if (rc.shape(0) < 1) throw py::value_error(layer + "record must hold >= 1 row");
          decoder::LayerCache c;
          if (SL.delta)
            c.state = static_cast<float*>(
                f32_array(tt[1], layer + "state", {ds.v_heads, ds.k_dim, ds.v_dim}, true).mutable_data());
          keep.append(tt);
          c.conv_state = static_cast<float*>(cs.mutable_data());
          c.record = static_cast<float*>(rc.mutable_data()), c.record_rows = rc.shape(0);
          caches[r * nl + i] = c;
          continue;
        }
        // a layer's cache holds the context, or its window's ring (the step's own is one)
        const int64_t cap = own[i].capacity < md.attn.capacity ? std::min(ctx, own[i].capacity) : ctx;
        const std::string layer = what + "layer " + std::to_string(i) + " ";
        py::array k = cache(ks[py::int_(i)], layer + "k_cache", {kv, cap, d});
        py::array v = cache(vs[py::int_(i)], layer + "v_cache", {kv, cap, d});
        keep.append(k), keep.append(v);
        caches[r * nl + i] = {k.mutable_data(), v.mutable_data(), cap};
      }
    }
    // Rows of one sequence (a speculative verification) share all its caches, at consecutive
    // positions: the step runs their attention in rounds, each row after the one before it.
    const decoder::LayerCache* own_caches = caches.data() + r * nl;
    for (int64_t q = r - 1; q >= 0; --q) {  // the latest earlier row sharing any cache
      int64_t shared = 0;
      for (int64_t i = 0; i < nl; ++i)
        shared += md.layers[i].delta || md.layers[i].conv_kernel
                      ? 2 * (rows[q].caches[i].conv_state == own_caches[i].conv_state)
                                     : (rows[q].caches[i].k == own_caches[i].k) + (rows[q].caches[i].v == own_caches[i].v);
      if (shared == 0) continue;
      const std::string pair = "step_batch: rows " + std::to_string(q) + " and " + std::to_string(r) + " share a cache";
      if (shared != 2 * nl)
        throw py::value_error(pair + " in part (rows of one sequence share every layer's k and v caches)");
      if (pos[r] != pos[q] + 1)
        throw py::value_error(pair + " at positions " + std::to_string(pos[q]) + " and " + std::to_string(pos[r]) +
                              " (rows of one sequence stand at consecutive positions, in order)");
      own_caches = rows[q].caches;
      break;
    }
    rows[r] = {pos[r], own_caches};
  }
  py::array_t<float> logits({b, md.lm_head.w->n});
  const float* hp = static_cast<const float*>(h.data());
  float* out = logits.mutable_data();
  py::gil_scoped_release release;
  s.run(hp, rows.data(), b, out);
  return logits;
}

}  // namespace qlinear::bindings
