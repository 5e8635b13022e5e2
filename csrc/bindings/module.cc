// The private extension module qlinear._core: validation of arrays at the boundary, GIL release
// around compute, and nothing else. The public API lives in python/qlinear. This file is its entry
// point; each domain's bindings are in their own file (bindings.h lists them).
#include "bindings/bindings.h"
#include "qlinear/core/kernels.h"

namespace py = pybind11;

PYBIND11_MODULE(_core, m) {
  m.doc() = "qlinear's compiled core (private: use the qlinear package)";
  qlinear::active_kernels();  // fail at import, not at the first call, on a bad QLINEAR_ISA

  qlinear::bindings::register_weights(m);  // first: the other signatures name PackedWeightHandle
  qlinear::bindings::register_matmul(m);
  qlinear::bindings::register_decoder(m);
  qlinear::bindings::register_moe(m);  // before decode_step: its layers may hold a MoeLayer
  qlinear::bindings::register_decode_step(m);
  qlinear::bindings::register_runtime(m);
  qlinear::bindings::register_embedding_rows(m);
}
