// What the files of the private extension module qlinear._core share: the packed-weight handle,
// the checks of arrays at the boundary, and one register_* function per domain (module.cc calls
// them in order).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file: the same casters for std containers everywhere

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "qlinear/core/layout.h"
#include "qlinear/llm/decoder.h"
#include "qlinear/llm/moe.h"

namespace qlinear::bindings {

namespace py = pybind11;

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
  bool writable() const { return !view_->readonly; }
  py::object owner() const { return owner_; }

 private:
  WeightGeometry geom_;
  py::object owner_;
  std::unique_ptr<py::buffer_info> view_;
  const uint8_t* data_ = nullptr;
};

inline int dtype_num(const py::array& a) { return a.dtype().num(); }

inline std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// An array's layout: C-contiguous, of `shape` (-1: any size), writeable when asked.
void check_layout(const py::array& a, const std::string& what, const std::vector<int64_t>& shape, bool writeable);

// A numpy float32 array of `shape` (-1: any size), C-contiguous, writeable when asked.
py::array f32_array(const py::handle& obj, const std::string& what, std::vector<int64_t> shape,
                    bool writeable = false);

// A KV cache: float32 or float16 (IEEE half), C-contiguous, writeable, of `shape` (-1: any);
// returns whether it is half. A wrong dtype raises TypeError, or ValueError with `dtype_value_error`.
}  // namespace qlinear::bindings
namespace qlinear::decoder {
class DecodeStep;
}
namespace qlinear::bindings {

// DecodeStep.step_batch (decode_step_batch.cc): B tokens of sequences over their own caches.
py::array_t<float> step_batch(decoder::DecodeStep& s, const py::array& h_in, const std::vector<int64_t>& pos,
                              const py::list& k_caches, const py::list& v_caches,
                              const std::vector<int64_t>& contexts, const py::object& states);

// A Gated DeltaNet layer's geometry ({k_heads, v_heads, k_dim, v_dim, kernel, tiled, eps}),
// and its weights and one sequence's states checked against it (decoder.cc).
decoder::DeltaShape delta_shape(const py::dict& g, const std::string& what);
struct DeltaArrays {
  decoder::DeltaWeights w;
  float* conv_state;
  float* state;
};
DeltaArrays delta_arrays(const decoder::DeltaShape& s, const py::handle& conv, const py::handle& dt_bias,
                         const py::handle& a, const py::handle& norm, const py::handle& conv_state,
                         const py::handle& state, const std::string& what);

bool checked_kv(const py::handle& obj, const std::string& what, const std::vector<int64_t>& shape,
                bool dtype_value_error = false);

// A layer's k and v caches, [kv_heads, capacity, head_dim] both, of one dtype; whether half.
bool checked_kv_pair(const py::handle& k, const py::handle& v, const std::string& where,
                     bool dtype_value_error = false);

// A linear of the decode step or of routed experts: spec = (PackedWeightHandle, bias or None,
// act_int8, act_block), the weight n x k (n < 0: any n); the spec is appended to `refs`.
decoder::StepLinear step_linear(const py::handle& spec, const std::string& what, int64_t n, int64_t k,
                                py::list& refs);

// The routed experts of a layer made by moe_layer (moe.cc), or nullptr when `obj` is not one.
const decoder::MoeLayer* moe_layer_of(const py::handle& obj);

// The domains, registered in this order (a signature names PackedWeightHandle once it is bound).
void register_weights(py::module_& m);   // weights.cc: PackedWeightHandle, quantize and pack, unpack
void register_matmul(py::module_& m);    // matmul.cc: the matmul drivers, kernel_info, per-kernel tests
void register_decoder(py::module_& m);   // decoder.cc: norms, activations, attention
void register_decode_step(py::module_& m);  // decode_step.cc: DecodeStep and decode_step
void register_moe(py::module_& m);       // moe.cc: MoeLayer (routed experts), moe_route
void register_runtime(py::module_& m);   // runtime.cc: threads, CPU, ISA level, memory bandwidth
void register_embedding_rows(py::module_& m);  // embedding_rows.cc: a token's embedding row in one call

}  // namespace qlinear::bindings
