// Register-tile iteration shared by every level's kernels (portable C++).
#pragma once

#include <cstdint>
#include <type_traits>

namespace qlinear {

template <int R>
using Rows = std::integral_constant<int, R>;

namespace tiling_detail {
template <int R, class F>
inline void tail(int64_t rows, int64_t m, F& f) {
  if constexpr (R >= 1) {
    if (rows == R) f(Rows<R>{}, m);
    else tail<R - 1>(rows, m, f);
  }
}
}  // namespace tiling_detail

// Calls f(Rows<MR>{}, m) for the full MR-row tiles of [m0, m1), then once with the rows left
// (Rows<1> .. Rows<MR - 1>), so that every tile height is a compile-time constant.
template <int MR, class F>
inline void for_row_tiles(int64_t m0, int64_t m1, F&& f) {
  int64_t m = m0;
  for (; m + MR <= m1; m += MR) f(Rows<MR>{}, m);
  if (m < m1) tiling_detail::tail<MR - 1>(m1 - m, m, f);
}

}  // namespace qlinear
