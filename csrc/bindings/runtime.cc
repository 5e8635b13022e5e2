// Binds the runtime: cpu_info, the thread pool's size (set_num_threads / get_num_threads), the
// active ISA level (set_isa), the layouts it packs and reads (native_layout / reads_layout), and
// stream_read (the memory's read bandwidth).
#include <algorithm>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "qlinear/core/cpu.h"
#include "qlinear/core/kernels.h"
#include "qlinear/core/layout.h"
#include "qlinear/core/threadpool.h"

namespace qlinear::bindings {
namespace {

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
  d["layout"] = layout_info(native_layout(8)).name;  // int8 weights' (int4: native_layout(4))
  return d;
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

void register_runtime(py::module_& m) {
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
  // What a weight of `bits` is packed in for the active level.
  m.def("native_layout", [](int bits) {
    if (bits != 4 && bits != 8) throw py::value_error("bits must be 4 or 8, got " + std::to_string(bits));
    return std::string(layout_info(native_layout(bits)).name);
  }, py::arg("bits"));
  // Whether the active level's own kernels run a weight of `bits` packed in `layout` (else the
  // scalar ones would): the native layout, and on the i8mm level the dotprod level's too; the
  // scalar level reads every layout.
  m.def("reads_layout", [](const std::string& layout, int bits) {
    if (bits != 4 && bits != 8) throw py::value_error("bits must be 4 or 8, got " + std::to_string(bits));
    const LayoutInfo* info = find_layout(layout);
    if (info == nullptr) throw py::value_error("unknown packed layout '" + layout + "'");
    WeightGeometry g;
    g.bits = bits;
    g.layout = storage_layout(info->id, bits);
    if (g.layout != info->id) return false;  // an int4-only name for int8, or the reverse
    return active_kernels().isa == Isa::scalar || table_for(active_kernels(), g) != nullptr;
  }, py::arg("layout"), py::arg("bits"));
}

}  // namespace qlinear::bindings
