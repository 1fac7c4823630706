#include "kvo/oracle/write_case.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <sstream>
#include <type_traits>

#include "kvo/oracle/write_dimensions.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using reference::GenTensor;
using reference::SplitMix64;

/// Page sizes drawn: powers of two engines use, and odd sizes that straddle nothing nicely.
constexpr std::array<std::int64_t, 12> kBlockSizes{1, 2, 3, 5, 7, 8, 16, 17, 31, 32, 64, 128};
constexpr std::array<std::int64_t, 8> kHeadDims{8, 16, 24, 32, 40, 64, 128, 256};
constexpr std::array<std::int64_t, 5> kKvHeads{1, 2, 3, 4, 8};
/// Upper bound on one K/V buffer's elements, so a case stays a few milliseconds.
constexpr std::int64_t kMaxBufferElements = 1 << 17;

template <class E>
E pick_enum(SplitMix64& rng) {
  const auto& names = spec::EnumInfo<E>::kNames;
  return names[static_cast<std::size_t>(
                   rng.uniform(0, static_cast<std::int64_t>(names.size()) - 1))]
      .value;
}

template <class T, std::size_t N>
T pick(SplitMix64& rng, const std::array<T, N>& a) {
  return a[static_cast<std::size_t>(rng.uniform(0, static_cast<std::int64_t>(N) - 1))];
}

std::vector<spec::LayerKind> random_mix(SplitMix64& rng) {
  std::vector<spec::LayerKind> mix(static_cast<std::size_t>(rng.uniform(1, 4)));
  for (auto& k : mix) k = rng.chance(1, 2) ? spec::LayerKind::kDense : spec::LayerKind::kSparse;
  return mix;
}

std::vector<float> make_scales(SplitMix64& rng, std::int64_t n) {
  std::vector<float> s(static_cast<std::size_t>(n));
  for (float& x : s) {
    // Powers of two (where divide and mul_recip agree) and arbitrary values (where they may not).
    x = rng.chance(1, 3)
            ? std::ldexp(1.0f, static_cast<int>(rng.uniform(-4, 4)))
            : static_cast<float>(rng.uniform(1, 1 << 20)) / static_cast<float>(1 << 16);
  }
  return s;
}

}  // namespace

std::string CaseOverrides::to_flags() const {
  std::string flags;
  visit_write_dimensions([&](const DimensionInfo& d, auto member, auto) {
    if (const auto& v = this->*member)
      flags += " " + std::string(d.flag) + " " + dimension_text(*v);
  });
  return flags;
}

void apply_overrides(const CaseOverrides& o, spec::ModelConfig& c) {
  visit_write_dimensions([&](const DimensionInfo&, auto member, auto set) {
    if constexpr (!std::is_null_pointer_v<decltype(set)>) {
      if (const auto& v = o.*member) set(c, *v);
    }
  });
}

std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index) {
  const std::uint64_t h = reference::mix64(campaign_seed ^ reference::mix64(index + 0x51ED2705ull));
  return h - theme_slot(h) + index % kThemeSlots;
}

std::string WriteCase::describe() const {
  std::ostringstream s;
  std::int64_t tokens = padding;
  for (const auto& r : requests) tokens += r.q_len;
  s << spec::describe(config) << " allocator=" << spec::name_of(allocator)
    << " requests=" << requests.size() << " tokens=" << tokens << " (padding " << padding
    << (padding_interleaved ? ", interleaved" : "") << ")";
  if (zero_rows > 0) s << " zero_rows=" << zero_rows;
  return s.str();
}

spec::KvStrides draw_kv_strides(std::uint64_t seed, const spec::ModelConfig& c) {
  SplitMix64 rng(reference::mix64(seed ^ 0x57121DEull));
  const spec::CacheGeometry& g = c.geometry;
  const auto step = 16 / static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const spec::LayoutAxes& la = spec::layout_axes(c.layout);
  const std::int64_t sure = rng.uniform(0, la.rank - 1);  // rank - 1: the offset
  spec::KvStrides s;
  std::int64_t extent = g.head_dim;
  for (int i = la.rank - 2; i >= 0; --i) {
    const spec::KvAxis axis = la.axes[static_cast<std::size_t>(i)];
    const bool row_halves = axis == spec::KvAxis::kKv && i == la.rank - 2;  // packed
    const std::int64_t stride =
        row_halves ? g.head_dim : extent + step * (rng.uniform(0, 2) + (i == sure ? 1 : 0));
    *spec::stride_field(s, axis) = stride;  // the loop stops before kDim
    extent += (spec::axis_count(g, axis) - 1) * stride;
  }
  s.offset = step * (rng.uniform(0, 3) + (sure == la.rank - 1 ? 1 : 0));
  // nhd / hnd: in half the views K and V are views of one allocation, V after K's whole extent
  // (vLLM's [2, nb, ...]), from their own stream so that every older view is drawn as it was.
  SplitMix64 one(reference::mix64(seed ^ 0x2A110Cull));
  if (!spec::kv_in_one_tensor(c.layout) && one.chance(1, 2)) {
    s.kv_part = extent + step * one.uniform(0, 2);
  }
  return s;
}

std::int64_t draw_huge_blocks(std::uint64_t seed, const spec::ModelConfig& c, HugeReach reach) {
  SplitMix64 rng(reference::mix64(seed ^ 0x4A6E5ull));
  // Past 2^32 (so past 2^31 too), by up to 2^28 bytes.
  const std::int64_t target = (std::int64_t{1} << 32) + rng.uniform(1, std::int64_t{1} << 28);
  // Per buffer: bytes per block and the fixed part (a view's offset), so the blocks it needs.
  spec::ModelConfig probe = c;
  probe.geometry.num_blocks = 1;
  const reference::PagedCacheLayout one(probe);
  probe.geometry.num_blocks = 2;
  const reference::PagedCacheLayout two(probe);
  std::vector<spec::BufferKind> buffers{one.kv_buffer(0), one.kv_buffer(1)};
  const bool sparse =
      std::find(c.layers.begin(), c.layers.end(), spec::LayerKind::kSparse) != c.layers.end();
  if (reach == HugeReach::kEveryBuffer && sparse) buffers.push_back(spec::BufferKind::kIndexK);
  std::int64_t blocks = -1;
  for (const spec::BufferKind b : buffers) {
    const std::int64_t per = std::max<std::int64_t>(two.buffer_bytes(b) - one.buffer_bytes(b), 1);
    const std::int64_t fixed = one.buffer_bytes(b) - per;
    const std::int64_t need = (target - fixed + per - 1) / per;
    // kLargestKv: the first buffer past the target; kEveryBuffer: the last.
    blocks = blocks < 0                       ? need
             : reach == HugeReach::kLargestKv ? std::min(blocks, need)
                                              : std::max(blocks, need);
  }
  return blocks;
}

spec::IndexStrides draw_index_strides(std::uint64_t seed, const spec::ModelConfig& c) {
  SplitMix64 rng(reference::mix64(seed ^ 0x1D3E5ull));
  const spec::CacheGeometry& g = c.geometry;
  const bool block_scale = c.index.layout == spec::IndexLayout::kBlockScale;
  // Steps of 16 bytes, in the view's units (elements of the flat dtype; bytes for blockscale).
  const std::int64_t step =
      block_scale ? 16 : 16 / static_cast<std::int64_t>(spec::dtype_bytes(c.index.flat_dtype));
  // The surely padded axis: 0 token (flat only), 1 block, 2 offset.
  const std::int64_t sure = rng.uniform(block_scale ? 1 : 0, 2);
  const auto pad = [&](std::int64_t axis) { return step * (rng.uniform(0, 2) + (axis == sure)); };
  spec::IndexStrides s;
  std::int64_t extent = g.index_dim;
  if (block_scale) {
    extent = spec::blockscale_block_bytes(g);
  } else {
    s.token = g.index_dim + pad(0);
    extent += (g.block_size - 1) * s.token;
  }
  s.block = extent + pad(1);
  s.offset = pad(2);
  return s;
}

void choose_strides(std::uint64_t seed, const std::optional<spec::KvStrides>& kv,
                    const std::optional<spec::IndexStrides>& index, spec::ModelConfig& c) {
  if (kv) {
    c.kv_strides = *kv;
  } else if (theme_slot(seed) == kThemeStrided) {
    c.kv_strides = draw_kv_strides(seed, c);
  }
  if (index) {
    c.index_strides = *index;
  } else if (theme_slot(seed) == kThemeStrided &&
             std::find(c.layers.begin(), c.layers.end(), spec::LayerKind::kSparse) !=
                 c.layers.end()) {
    c.index_strides = draw_index_strides(seed, c);
  }
}

WriteCase make_write_case(std::uint64_t seed, const CaseOverrides& o, CaseValues values) {
  SplitMix64 rng(seed);
  WriteCase wc;
  wc.seed = seed;
  spec::ModelConfig& c = wc.config;
  // Draw everything first (so an override never shifts the draws of the others), then override.
  c.layers = random_mix(rng);
  c.geometry.block_size = pick(rng, kBlockSizes);
  c.geometry.num_kv_heads = pick(rng, kKvHeads);
  c.geometry.head_dim = pick(rng, kHeadDims);
  c.geometry.index_dim = 128 * rng.uniform(1, 2);
  if (rng.chance(1, 4))
    c.geometry.index_dim = 8 * rng.uniform(1, 24);  // flat layouts take any multiple of 8
  c.act_dtype =
      std::array{spec::DType::kBF16, spec::DType::kF16, spec::DType::kF32}[rng.uniform(0, 2)];
  const std::vector<spec::DType> cache_formats = spec::drawn_cache_formats();
  c.kv.cache_dtype = cache_formats[static_cast<std::size_t>(
      rng.uniform(0, static_cast<std::int64_t>(cache_formats.size()) - 1))];
  c.layout = pick_enum<spec::KvLayout>(rng);
  c.kv.saturation = pick_enum<spec::Saturation>(rng);
  c.kv.scale_mode = pick_enum<spec::ScaleMode>(rng);
  c.kv.per_head_scale = rng.chance(1, 2);
  c.kv.via_model_dtype = rng.chance(1, 4);
  c.index.layout = pick_enum<spec::IndexLayout>(rng);
  c.index.flat_dtype = rng.chance(1, 2) ? spec::DType::kBF16 : spec::DType::kFp8E4M3;
  c.index.ue8m0 = rng.chance(1, 2);
  c.slot_mode = rng.chance(1, 8) ? spec::SlotMode::kLegacyWrap : spec::SlotMode::kStrict;
  c.slot_type = rng.chance(1, 2) ? spec::SlotType::kI32 : spec::SlotType::kI64;
  c.separate_index_slots = rng.chance(1, 4);
  // The modes added later (SPEC 2) draw from their own stream, so every older seed keeps its case.
  SplitMix64 later_modes(reference::mix64(seed ^ 0x4D0DE5ull));
  c.kv.scale_in_model_dtype = later_modes.chance(1, 6);
  c.index.blockscale_scale = later_modes.chance(1, 3) ? spec::BlockScaleFormula::kMulRecip
                                                      : spec::BlockScaleFormula::kDivide;
  bool edge_values = rng.chance(1, 3);
  std::int64_t tokens = rng.uniform(1, 48);
  std::int64_t padding = rng.chance(1, 2) ? rng.uniform(1, 7) : 0;

  apply_overrides(o, c);
  // Its stress theme (write_case.hpp): a head row with a vector store's tail.
  if (theme_slot(seed) == kThemeVectorTail) {
    if (!o.head_dim) c.geometry.head_dim = 40;
    if (!o.kv_dtype) c.kv.cache_dtype = spec::DType::kFp8E4M3;
  }
  // The strided theme views the index-K cache too: a mix of dense layers only gets a sparse last.
  if (theme_slot(seed) == kThemeStrided && !o.layers &&
      std::find(c.layers.begin(), c.layers.end(), spec::LayerKind::kSparse) == c.layers.end()) {
    c.layers.back() = spec::LayerKind::kSparse;
  }
  // Drawn modes that the configuration makes meaningless take their defaults; an override that
  // contradicts another is the user's to fix (spec::validate names it).
  // A drawn dimension that an override needs yields to it (a rounded scale needs a scale mode;
  // a blockscale formula needs the blockscale layout).
  if (c.kv.scale_in_model_dtype && c.kv.scale_mode == spec::ScaleMode::kNone) {
    if (!o.scale_in_model_dtype) {
      c.kv.scale_in_model_dtype = false;
    } else if (!o.scale_mode) {
      c.kv.scale_mode = spec::ScaleMode::kDivide;
    }
  }
  if (c.index.blockscale_scale != spec::BlockScaleFormula::kDivide &&
      c.index.layout != spec::IndexLayout::kBlockScale) {
    if (!o.blockscale_scale) {
      c.index.blockscale_scale = spec::BlockScaleFormula::kDivide;
    } else if (!o.index_layout) {
      c.index.layout = spec::IndexLayout::kBlockScale;
    }
  }
  if (o.edge_values) edge_values = *o.edge_values;
  if (o.tokens) tokens = *o.tokens;
  if (c.index.layout == spec::IndexLayout::kBlockScale &&
      c.geometry.index_dim % spec::kScaleGroup != 0 && !o.index_dim) {
    c.geometry.index_dim = 128;
  }
  if (tokens < 1) throw spec::InvalidInput("tokens", -1, std::to_string(tokens), "must be >= 1");
  // The huge-cache theme (write_case.hpp): at most two layers (each a device mirror of its full
  // size), blocks of at least 4 KiB (so that the free list stays short), written near the end.
  // (Not over a fixed view of one allocation: its kv_part is fixed, so blocks would not fit.)
  const bool huge =
      theme_slot(seed) == kThemeHugeCache && !o.num_blocks &&
      !(o.kv_strides && o.kv_strides->kv_part != 0 && !spec::kv_in_one_tensor(c.layout));
  if (huge) {
    if (!o.layers && c.layers.size() > kHugeCacheMostLayers) c.layers.resize(kHugeCacheMostLayers);
    if (!o.block_size) c.geometry.block_size = std::max<std::int64_t>(c.geometry.block_size, 64);
    if (!o.head_dim) c.geometry.head_dim = std::max<std::int64_t>(c.geometry.head_dim, 64);
  }
  // A long mix (the 60-layer MiniMax-M3 shape) draws smaller per-layer caches: the wide shapes are
  // covered by short mixes, and a long one then costs about what a short one does.
  if (c.layers.size() > 8) {
    if (!o.head_dim) c.geometry.head_dim = std::min<std::int64_t>(c.geometry.head_dim, 64);
    if (!o.num_kv_heads)
      c.geometry.num_kv_heads = std::min<std::int64_t>(c.geometry.num_kv_heads, 2);
    if (!o.block_size) c.geometry.block_size = std::min<std::int64_t>(c.geometry.block_size, 32);
  }
  spec::validate(c);

  // Requests: split the tokens into decode (q_len 1) and prefill chunks, each after a context of
  // already cached tokens; then size the cache (unless fixed) and hand out blocks from a shuffled
  // free list, as a paged allocator does after some churn.
  const std::int64_t bs = c.geometry.block_size;
  if (o.requests && (*o.requests < 1 || *o.requests > tokens)) {
    throw spec::InvalidInput("requests", -1, std::to_string(*o.requests),
                             "must be in [1, tokens = " + std::to_string(tokens) + "]");
  }
  AllocatorShape shape = o.allocator.value_or(pick_enum<AllocatorShape>(rng));
  if (huge && !o.allocator) shape = AllocatorShape::kNearCapacity;
  wc.allocator = shape;
  // Shared prefix: every request continues the same cached prefix of `shared_context` tokens.
  const std::int64_t shared_context =
      shape == AllocatorShape::kSharedPrefix ? rng.uniform(bs, 3 * bs) : 0;
  std::int64_t left = tokens;
  while (left > 0) {
    StepRequest r;
    if (o.requests) {
      const auto remaining = *o.requests - static_cast<std::int64_t>(wc.requests.size());
      r.q_len = left / remaining;
    } else {
      r.q_len = std::min(rng.chance(1, 2) ? 1 : rng.uniform(1, left), left);
    }
    if (shape == AllocatorShape::kSharedPrefix) {
      r.context = shared_context;
    } else if (rng.chance(1, 3)) {
      r.context =
          std::max<std::int64_t>(0, rng.uniform(1, 2) * bs + rng.uniform(-1, 1));  // a block edge
    } else {
      r.context = rng.uniform(0, 3 * bs);
    }
    left -= r.q_len;
    wc.requests.push_back(std::move(r));
  }
  // Blocks of the shared prefix (full blocks only: a partly filled one is each request's own copy).
  auto shared_blocks = [&] {
    return shape == AllocatorShape::kSharedPrefix ? wc.requests.front().context / bs : 0;
  };
  auto blocks_needed = [&] {
    std::int64_t n = shared_blocks();
    for (const auto& r : wc.requests) n += (r.context + r.q_len + bs - 1) / bs - shared_blocks();
    return n;
  };
  if (o.num_blocks) {
    if (blocks_needed() > c.geometry.num_blocks) {
      for (auto& r : wc.requests) r.context = 0;  // a small fixed cache holds only the new tokens
    }
    if (blocks_needed() > c.geometry.num_blocks) {
      throw spec::InvalidInput("num_blocks", -1, std::to_string(c.geometry.num_blocks),
                               "too few blocks: the step's " + std::to_string(tokens) +
                                   " tokens need " + std::to_string(blocks_needed()));
    }
  } else {
    const std::int64_t needed = blocks_needed();
    const std::int64_t per_block =
        std::max<std::int64_t>(bs * c.geometry.num_kv_heads * c.geometry.head_dim, 1);
    // The cache bound holds for the whole mix, so a 60-layer case costs what a 1-layer one does.
    const auto layers = static_cast<std::int64_t>(c.layers.size());
    const std::int64_t room =
        std::max(needed, kMaxBufferElements / per_block / std::max<std::int64_t>(1, layers / 4));
    c.geometry.num_blocks = rng.uniform(needed, std::min(room, 2 * needed + 8));
  }
  choose_strides(seed, o.kv_strides, o.index_strides, c);
  // The step's blocks come off the top of the free list (kNearCapacity): past the blocks that
  // reach the target, so that every written block, not only the last, starts past byte 2^32.
  if (huge) c.geometry.num_blocks = draw_huge_blocks(seed, c) + blocks_needed();
  spec::validate(c);
  const spec::CacheGeometry& g = c.geometry;
  std::vector<std::int64_t> free_blocks(static_cast<std::size_t>(g.num_blocks));
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  if (shape == AllocatorShape::kNearCapacity) std::reverse(free_blocks.begin(), free_blocks.end());
  if (shape == AllocatorShape::kFragmented || shape == AllocatorShape::kSharedPrefix) {
    rng.shuffle(free_blocks);
  }
  const auto shared = static_cast<std::size_t>(shared_blocks());
  std::size_t next_free = shared;
  for (auto& r : wc.requests) {
    const auto nblocks = static_cast<std::size_t>((r.context + r.q_len + bs - 1) / bs);
    r.block_table.assign(free_blocks.begin(),
                         free_blocks.begin() + static_cast<std::ptrdiff_t>(shared));
    r.block_table.insert(
        r.block_table.end(), free_blocks.begin() + static_cast<std::ptrdiff_t>(next_free),
        free_blocks.begin() + static_cast<std::ptrdiff_t>(next_free + nblocks - shared));
    next_free += nblocks - shared;
  }
  wc.padding = padding;

  // The slot mapping of the step and the (request, position) key of every source row.
  spec::SlotMapping slots;
  slots.type = c.slot_type;
  std::vector<reference::RowKey> row_keys;
  for (std::size_t ri = 0; ri < wc.requests.size(); ++ri) {
    const StepRequest& r = wc.requests[ri];
    for (std::int64_t j = 0; j < r.q_len; ++j) {
      const std::int64_t p = r.context + j;
      slots.slots.push_back(r.block_table[static_cast<std::size_t>(p / g.block_size)] *
                                g.block_size +
                            p % g.block_size);
      row_keys.push_back({static_cast<std::int64_t>(ri), p});
    }
  }
  for (std::int64_t i = 0; i < padding; ++i) {
    slots.slots.push_back(-1);
    row_keys.push_back({-1, i});
  }
  // Reach conditions from their own stream (so older seeds keep every other draw): in half the
  // cases with padding the -1 entries are scattered among the real tokens (a kernel that stops at
  // the first -1 shows), and in a quarter of the cases a few source rows are all zero.
  SplitMix64 reach(reference::mix64(seed ^ 0x7E4C4ull));
  const std::uint64_t theme = theme_slot(seed);
  if (theme == kThemeLegacyWrap && !o.slot_mode) c.slot_mode = spec::SlotMode::kLegacyWrap;
  if ((theme == kThemeMinusOneInside || theme == kThemeLegacyWrap) && padding == 0) {
    for (std::int64_t i = reach.uniform(1, 3); i > 0; --i) {  // -1 rows to scatter
      slots.slots.push_back(-1);
      row_keys.push_back({-1, padding++});
    }
    wc.padding = padding;
  }
  wc.padding_interleaved = padding > 0 && (theme == kThemeMinusOneInside || reach.chance(1, 2));
  if (wc.padding_interleaved) {
    std::vector<std::size_t> order(slots.slots.size());
    std::iota(order.begin(), order.end(), 0);
    reach.shuffle(order);
    std::vector<std::int64_t> permuted_slots;
    std::vector<reference::RowKey> permuted_keys;
    for (std::size_t i : order) {
      permuted_slots.push_back(slots.slots[i]);
      permuted_keys.push_back(row_keys[i]);
    }
    slots.slots = std::move(permuted_slots);
    row_keys = std::move(permuted_keys);
  }
  const auto mapped_rows = static_cast<std::int64_t>(slots.slots.size());
  std::vector<std::int64_t> zero_rows;
  if (theme == kThemeZeros || reach.chance(1, 4)) {
    for (std::int64_t i = reach.uniform(1, 3); i > 0; --i)
      zero_rows.push_back(reach.uniform(0, mapped_rows - 1));
  }
  wc.zero_rows = static_cast<std::int64_t>(zero_rows.size());
  // Source tensors padded past the mapping, as CUDA-graph captures are: those rows must stay
  // unread.
  const std::int64_t extra_rows = rng.chance(1, 2) ? rng.uniform(1, 3) : 0;
  for (std::int64_t i = 0; i < extra_rows; ++i) row_keys.push_back({-2, i});
  spec::SlotMapping index_slots;
  index_slots.type = c.slot_type;
  if (c.separate_index_slots) {
    // The index cache is managed apart: a permutation of the main slots over the same blocks.
    std::vector<std::int64_t> perm(static_cast<std::size_t>(c.geometry.num_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    rng.shuffle(perm);
    for (std::int64_t s : slots.slots) {
      index_slots.slots.push_back(
          s < 0
              ? s
              : perm[static_cast<std::size_t>(s / g.block_size)] * g.block_size + s % g.block_size);
    }
  }

  WriteValues plan;
  plan.gen.seed = rng.next();
  plan.gen.act = c.act_dtype;
  plan.gen.edge_values = edge_values;
  plan.gen.allow_nonfinite = edge_values;
  plan.gen.range = std::ldexp(1.0f, static_cast<int>(rng.uniform(-2, 9)));
  plan.row_keys = std::move(row_keys);
  plan.zero_rows = std::move(zero_rows);
  const std::int64_t nscale = c.kv.per_head_scale ? g.num_kv_heads : 1;
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    spec::LayerWrite w;
    w.kind = c.layers[l];
    if (w.kind == spec::LayerKind::kSparse) w.index_slots = index_slots;
    w.slots = slots;
    w.k_scale = make_scales(rng, nscale);
    w.v_scale = make_scales(rng, nscale);
    wc.writes.push_back(std::move(w));
  }
  wc.values = std::move(plan);
  if (values == CaseValues::kGenerated) fill_write_values(wc);
  return wc;
}

void fill_write_values(WriteCase& wc) {
  if (!wc.values) return;
  const WriteValues& plan = *wc.values;
  const spec::CacheGeometry& g = wc.config.geometry;
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    spec::LayerWrite& w = wc.writes[l];
    if (!w.k.bytes.empty()) continue;  // filled already
    const auto layer = static_cast<std::int64_t>(l);
    w.k = reference::generated_rows(plan.gen, layer, GenTensor::kK, plan.row_keys, g.num_kv_heads,
                                    g.head_dim);
    w.v = reference::generated_rows(plan.gen, layer, GenTensor::kV, plan.row_keys, g.num_kv_heads,
                                    g.head_dim);
    if (w.kind == spec::LayerKind::kSparse) {
      w.index_k = reference::generated_rows(plan.gen, layer, GenTensor::kIndexK, plan.row_keys, 0,
                                            g.index_dim);
    }
    for (spec::HostTensor* t : {&w.k, &w.v, &w.index_k}) {
      if (t->bytes.empty()) continue;
      const std::size_t row_bytes = t->bytes.size() / plan.row_keys.size();
      for (std::int64_t r : plan.zero_rows) {
        std::fill_n(
            t->bytes.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * row_bytes),
            row_bytes, std::uint8_t{0});
      }
    }
  }
}

}  // namespace kvo::oracle
