// CPU model of the pre-fusion torch path, op by op. Per tensor (K, V, index-K):
//   block_idx = slot_mapping // block_size          (op 1: division, floor semantics)
//   offset    = slot_mapping %  block_size          (op 2: remainder, floor semantics)
//   idx       = (block_idx, offset).long()          (op 3: index cast)
//   view[idx] = values.to(cache dtype)              (op 4: index_put through a strided view)
// 12 ops on a sparse layer, 8 on a dense one. In strict mode the padding rows are dropped by the
// index_put's mask; in legacy_wrap mode a negative block index counts from the end, as in torch.
#include <array>
#include <cmath>
#include <vector>

#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/numbers.hpp"
#include "kvo/reference/paged_cache.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::subjects {

using reference::bits_of;
using reference::check_layer_caches;
using reference::encode;
using reference::PagedCacheLayout;
using reference::quantize_group_blockscale;
using reference::quantize_kv;
using reference::source_value;
using reference::store_code;

namespace {

using spec::BufferKind;
using spec::KvLayout;

/// A torch-style strided view over a byte buffer: element (i0, i1, ...) at
/// base + sum(i_k * stride_k) elements of `elem_bytes` bytes.
struct StridedView {
  std::uint8_t* data = nullptr;
  std::int64_t elem_bytes = 1;
  std::int64_t base = 0;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> stride;

  static StridedView contiguous(std::uint8_t* data, std::int64_t elem_bytes,
                                std::vector<std::int64_t> shape) {
    StridedView v{data, elem_bytes, 0, std::move(shape), {}};
    v.stride.assign(v.shape.size(), 1);
    for (std::size_t i = v.shape.size() - 1; i > 0; --i) v.stride[i - 1] = v.stride[i] * v.shape[i];
    return v;
  }
  /// view.select(dim, index): drops a dimension.
  StridedView select(std::size_t dim, std::int64_t index) const {
    StridedView v = *this;
    v.base += index * stride[dim];
    v.shape.erase(v.shape.begin() + static_cast<std::ptrdiff_t>(dim));
    v.stride.erase(v.stride.begin() + static_cast<std::ptrdiff_t>(dim));
    return v;
  }
  /// view.narrow(dim, start, length).
  StridedView narrow(std::size_t dim, std::int64_t start, std::int64_t length) const {
    StridedView v = *this;
    v.base += start * stride[dim];
    v.shape[dim] = length;
    return v;
  }
  /// view.transpose(a, b).
  StridedView transpose(std::size_t a, std::size_t b) const {
    StridedView v = *this;
    std::swap(v.shape[a], v.shape[b]);
    std::swap(v.stride[a], v.stride[b]);
    return v;
  }
  std::uint8_t* at(std::initializer_list<std::int64_t> idx) const {
    std::int64_t e = base;
    std::size_t k = 0;
    for (std::int64_t i : idx) e += i * stride[k++];
    return data + e * elem_bytes;
  }
};

/// The [nb, bs, nkv, hd] view of K (kv = 0) or V (kv = 1), as an engine builds it from its cache.
StridedView kv_view(const spec::ModelConfig& c, spec::LayerCaches& caches, int kv) {
  const auto& g = c.geometry;
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  const std::int64_t nb = g.num_blocks, bs = g.block_size, nkv = g.num_kv_heads, hd = g.head_dim;
  auto body = [&](BufferKind kind) { return caches.find(kind)->body(); };
  if (!c.kv_strides.dense()) {
    // A strided cache (SPEC 3) as torch hands it: the layout's axes with the view's strides and
    // offset; K or V selected on the K/V axis, then [nb, bs, nkv, hd].
    const spec::LayoutAxes la = spec::kv_axes(c);  // nhd / hnd of one allocation: [2, ...]
    const bool one = spec::kv_in_one_tensor(c);
    StridedView v{body(one       ? BufferKind::kKv
                       : kv == 0 ? BufferKind::kK
                                 : BufferKind::kV),
                  eb,
                  c.kv_strides.offset,
                  {},
                  {}};
    std::vector<spec::KvAxis> axes;
    for (int i = 0; i < la.rank; ++i) {
      const spec::KvAxis a = la.axes[static_cast<std::size_t>(i)];
      if (a == spec::KvAxis::kKv) {
        v.base += kv * c.kv_strides.kv_part;
        continue;
      }
      axes.push_back(a);
      v.shape.push_back(spec::axis_count(g, a));
      v.stride.push_back(spec::stride_of(c.kv_strides, a));
    }
    return axes[1] == spec::KvAxis::kHead ? v.transpose(1, 2) : v;
  }
  switch (c.layout) {
    case KvLayout::kNhd:
      return StridedView::contiguous(body(kv == 0 ? BufferKind::kK : BufferKind::kV), eb,
                                     {nb, bs, nkv, hd});
    case KvLayout::kHnd:
      return StridedView::contiguous(body(kv == 0 ? BufferKind::kK : BufferKind::kV), eb,
                                     {nb, nkv, bs, hd})
          .transpose(1, 2);
    case KvLayout::kPackedHnd:  // kv_cache[..., kv*hd : (kv+1)*hd].transpose(1, 2)
      return StridedView::contiguous(body(BufferKind::kKv), eb, {nb, nkv, bs, 2 * hd})
          .narrow(3, kv * hd, hd)
          .transpose(1, 2);
    case KvLayout::kPackedNhd:
      return StridedView::contiguous(body(BufferKind::kKv), eb, {nb, bs, nkv, 2 * hd})
          .narrow(3, kv * hd, hd);
    case KvLayout::kSplitNhd:  // kv_cache[:, kv]
      return StridedView::contiguous(body(BufferKind::kKv), eb, {nb, 2, bs, nkv, hd}).select(1, kv);
    case KvLayout::kSplitHnd:
      return StridedView::contiguous(body(BufferKind::kKv), eb, {nb, 2, nkv, bs, hd})
          .select(1, kv)
          .transpose(1, 2);
  }
  return {};
}

/// torch's floor division and remainder on int64.
std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  const std::int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
std::int64_t floor_mod(std::int64_t a, std::int64_t b) { return a - floor_div(a, b) * b; }

/// Ops 1-3 for one tensor: the (block, offset) index pairs of the rows that index_put writes, in
/// token order, and the source row of each. Strict mode masks slot < 0 out; legacy_wrap lets a
/// negative block index count from the end.
struct ScatterIndex {
  std::vector<std::int64_t> block, offset, row;
};
ScatterIndex scatter_index(const spec::SlotMapping& m, const spec::ModelConfig& c, int& ops) {
  const auto& g = c.geometry;
  const std::size_t n = m.slots.size();
  std::vector<std::int64_t> block_idx(n), offset(n);
  for (std::size_t t = 0; t < n; ++t) block_idx[t] = floor_div(m.slots[t], g.block_size);  // op 1
  for (std::size_t t = 0; t < n; ++t) offset[t] = floor_mod(m.slots[t], g.block_size);     // op 2
  ScatterIndex out;  // op 3: .long()
  for (std::size_t t = 0; t < n; ++t) {
    if (c.slot_mode == spec::SlotMode::kStrict && m.slots[t] < 0) continue;
    out.block.push_back(block_idx[t] < 0 ? block_idx[t] + g.num_blocks : block_idx[t]);
    out.offset.push_back(offset[t]);
    out.row.push_back(static_cast<std::int64_t>(t));
  }
  ops += 3;
  return out;
}

}  // namespace

int write_layer_unfused(const spec::ModelConfig& c, const spec::LayerWrite& w,
                        spec::LayerCaches& caches) {
  spec::validate_write(c, w);
  const PagedCacheLayout layout(c);
  check_layer_caches(layout, w.kind, caches);
  const auto& g = c.geometry;
  int ops = 0;

  // K then V: cache_view[block_idx, offset] = (x / scale).to(cache dtype).
  for (int kv = 0; kv < 2; ++kv) {
    const spec::HostTensor& src = kv == 0 ? w.k : w.v;
    const std::vector<float>& scales = kv == 0 ? w.k_scale : w.v_scale;
    const ScatterIndex idx = scatter_index(w.slots, c, ops);
    const StridedView view = kv_view(c, caches, kv);
    for (std::size_t i = 0; i < idx.row.size(); ++i) {  // op 4: index_put
      const std::int64_t t = idx.row[i];
      for (std::int64_t h = 0; h < g.num_kv_heads; ++h) {
        const float s = scales[c.kv.per_head_scale ? static_cast<std::size_t>(h) : 0];
        for (std::int64_t d = 0; d < g.head_dim; ++d) {
          const float x = source_value(src, (t * g.num_kv_heads + h) * g.head_dim + d);
          store_code(quantize_kv(x, s, c.kv, c.act_dtype), c.kv.cache_dtype,
                     view.at({idx.block[i], idx.offset[i], h, d}));
        }
      }
    }
    ++ops;
  }
  if (w.kind != spec::LayerKind::kSparse) return ops;

  // Index-K, through its own mapping when the model has one.
  const spec::SlotMapping& imap = c.separate_index_slots ? w.index_slots : w.slots;
  const ScatterIndex idx = scatter_index(imap, c, ops);
  std::uint8_t* body = caches.find(BufferKind::kIndexK)->body();
  // The cache as torch sees it: a strided view (SPEC 3), its strides in elements of its dtype
  // (blockscale: bytes).
  const spec::IndexStrides st = spec::index_view(c);
  if (c.index.layout == spec::IndexLayout::kFlat) {
    const auto ib = static_cast<std::int64_t>(spec::dtype_bytes(c.index.flat_dtype));
    const StridedView view{
        body, ib, st.offset, {g.num_blocks, g.block_size, g.index_dim}, {st.block, st.token, 1}};
    for (std::size_t i = 0; i < idx.row.size(); ++i) {
      for (std::int64_t d = 0; d < g.index_dim; ++d) {
        const float x = source_value(w.index_k, idx.row[i] * g.index_dim + d);
        store_code(encode(x, c.index.flat_dtype, c.kv.saturation), c.index.flat_dtype,
                   view.at({idx.block[i], idx.offset[i], d}));
      }
    }
  } else {
    // The block-scaled quantization as a tensor op over all rows, then the scatter of values and
    // scales through byte views of the block-major layout.
    const std::int64_t groups = g.index_dim / spec::kScaleGroup;
    const StridedView values{
        body, 1, st.offset, {g.num_blocks, g.block_size, g.index_dim}, {st.block, g.index_dim, 1}};
    // fp32 scales addressed by byte (a view's blocks need not start 4-byte aligned).
    const StridedView scales{body,
                             1,
                             st.offset + g.block_size * g.index_dim,
                             {g.num_blocks, g.block_size, groups},
                             {st.block, groups * 4, 4}};
    std::vector<float> group(static_cast<std::size_t>(spec::kScaleGroup));
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(spec::kScaleGroup));
    for (std::size_t i = 0; i < idx.row.size(); ++i) {
      for (std::int64_t gi = 0; gi < groups; ++gi) {
        for (std::int64_t e = 0; e < spec::kScaleGroup; ++e) {
          group[static_cast<std::size_t>(e)] =
              source_value(w.index_k, idx.row[i] * g.index_dim + gi * spec::kScaleGroup + e);
        }
        const float s = quantize_group_blockscale(group, c.index, codes);
        for (std::int64_t e = 0; e < spec::kScaleGroup; ++e) {
          *values.at({idx.block[i], idx.offset[i], gi * spec::kScaleGroup + e}) =
              codes[static_cast<std::size_t>(e)];
        }
        store_code(bits_of(s), spec::DType::kF32, scales.at({idx.block[i], idx.offset[i], gi}));
      }
    }
  }
  ++ops;
  return ops;
}

}  // namespace kvo::subjects
