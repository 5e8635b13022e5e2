// The checks of arrays shared by the decoder's bindings (decoder.cc, decode_step.cc): float32
// arrays of a shape, KV caches of float32 or float16.
#include "bindings/bindings.h"

namespace qlinear::bindings {

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

py::array f32_array(const py::handle& obj, const std::string& what, std::vector<int64_t> shape, bool writeable) {
  if (!py::isinstance<py::array>(obj)) throw py::type_error(what + " must be a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (a.dtype().num() != kNpyFloat) throw py::type_error(what + " must be float32, got " + dtype_str(a));
  check_layout(a, what, shape, writeable);
  return a;
}

bool checked_kv(const py::handle& obj, const std::string& what, const std::vector<int64_t>& shape,
                bool dtype_value_error) {
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

bool checked_kv_pair(const py::handle& k, const py::handle& v, const std::string& where, bool dtype_value_error) {
  const bool half = checked_kv(k, where + "k_cache", {-1, -1, -1}, dtype_value_error);
  const py::array ka = py::reinterpret_borrow<py::array>(k);
  if (checked_kv(v, where + "v_cache", {ka.shape(0), ka.shape(1), ka.shape(2)}, dtype_value_error) != half) {
    const std::string msg = where + "k and v caches must be of one dtype";
    if (dtype_value_error) throw py::value_error(msg);
    throw py::type_error(msg);
  }
  return half;
}

}  // namespace qlinear::bindings
