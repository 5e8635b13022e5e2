#include "qlinear/core/layout.h"

#include <algorithm>
#include <stdexcept>

namespace qlinear {

namespace {
const LayoutInfo kLayouts[] = {
    {LayoutId::nr8_kr4, "nr8_kr4", 8, 4, 0},
    {LayoutId::nr8_kr4_s8, "nr8_kr4_s8", 8, 4, 0x80},
    {LayoutId::nr8_kr8_s8, "nr8_kr8_s8", 8, 8, 0x80},
    {LayoutId::nr8_kr8, "nr8_kr8", 8, 8, 0},
};
}  // namespace

const LayoutInfo& layout_info(LayoutId id) {
  for (const auto& l : kLayouts)
    if (l.id == id) return l;
  throw std::invalid_argument("unknown packed layout id " + std::to_string(int(id)));
}

const LayoutInfo* find_layout(const std::string& name) {
  for (const auto& l : kLayouts)
    if (name == l.name) return &l;
  return nullptr;
}

LayoutId family_layout() {
#if defined(__aarch64__)
  return LayoutId::nr8_kr4_s8;
#else
  return LayoutId::nr8_kr4;
#endif
}

LayoutId storage_layout(LayoutId layout, int bits) {
  const bool kr8 = layout_info(layout).kr == 8;
  if (bits == 4) return kr8 ? LayoutId::nr8_kr8 : LayoutId::nr8_kr4;
  return layout == LayoutId::nr8_kr8 ? LayoutId::nr8_kr8_s8 : layout;
}

int64_t storage_block(int64_t k, int64_t group_size) {
  return group_size >= k ? std::min<int64_t>(round_up(k, 32), 256) : group_size;
}

WeightGeometry make_geometry(int64_t n, int64_t k, int bits, int64_t group_size, bool symmetric,
                             LayoutId layout) {
  if (bits != 4 && bits != 8)
    throw std::invalid_argument("bits must be 4 or 8, got " + std::to_string(bits));
  if (n <= 0 || k <= 0)
    throw std::invalid_argument("weight must be non-empty, got shape [" + std::to_string(n) +
                                ", " + std::to_string(k) + "]");
  if (n > (int64_t(1) << 31) || k > (int64_t(1) << 31))
    throw std::invalid_argument("weight dimensions must be below 2^31");
  if (group_size <= 0)
    throw std::invalid_argument("group_size must be positive, got " + std::to_string(group_size));
  if (group_size < k && (group_size % 32 != 0 || group_size > 256))
    throw std::invalid_argument(
        "group_size must be a multiple of 32 up to 256 (32, 64, 128, 256), or >= K for "
        "per-channel scales; got " + std::to_string(group_size));
  layout = storage_layout(layout, bits);
  const LayoutInfo& info = layout_info(layout);
  WeightGeometry g;
  g.n = n; g.k = k; g.bits = bits; g.symmetric = symmetric;
  g.group_size = std::min(group_size, k);
  g.ngroups = ceil_div(k, g.group_size);
  g.block = storage_block(k, group_size);
  g.nblocks = ceil_div(k, g.block);
  g.layout = layout; g.nr = info.nr; g.kr = info.kr;
  g.code_xor = bits == 8 ? info.int8_xor : 0;
  g.npanels = ceil_div(n, g.nr);
  g.code_bytes = int64_t(g.nr) * g.block * bits / 8;
  g.block_bytes = g.code_bytes + int64_t(g.nr) * 2 * (symmetric ? 1 : 2);
  g.panel_bytes = g.nblocks * g.block_bytes;
  g.total_bytes = g.npanels * g.panel_bytes;
  return g;
}

WeightGeometry make_composite_geometry(const std::vector<WeightGeometry>& parts) {
  if (parts.empty()) throw std::invalid_argument("a weight of parts needs at least one part");
  auto list = std::make_shared<std::vector<WeightPart>>();
  WeightGeometry g = parts[0];
  g.n = 0; g.total_bytes = 0;
  for (const WeightGeometry& p : parts) {
    if (p.is_composite()) throw std::invalid_argument("a part cannot itself have parts");
    if (p.k != g.k)
      throw std::invalid_argument("parts of one weight need the same K, got " + std::to_string(g.k) + " and " + std::to_string(p.k));
    list->push_back({p, g.n, g.total_bytes});
    g.n += p.n;
    g.total_bytes += p.total_bytes;
    g.block = std::max(g.block, p.block);
    g.bits = std::max(g.bits, p.bits);
  }
  g.group_size = g.block;  // act_block "group": the largest part's block (a multiple of every part's)
  g.nblocks = g.ngroups = ceil_div(g.k, g.block);
  g.npanels = 0; g.panel_bytes = 0; g.code_bytes = 0; g.block_bytes = 0;
  g.format = Format::affine;  // the parts carry the formats
  g.parts = std::move(list);
  return g;
}

}  // namespace qlinear
