// The host side of every call (call_inputs.hpp) and the cache views of device_caches.hpp, built
// with or without CUDA: a user's function in host memory gets the same views as one on the device.
#include "call_inputs.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu {

std::int64_t kv_buffer_bytes(const spec::ModelConfig& c) {
  const spec::CacheGeometry& g = c.geometry;
  if (!c.kv_strides.dense()) {
    // SPEC 3: a strided view's body ends with its outermost axis (its last block; or V of one
    // allocation).
    const spec::KvAxis outer = spec::kv_axes(c).axes[0];
    return (c.kv_strides.offset +
            spec::axis_count(g, outer) * spec::stride_of(c.kv_strides, outer)) *
           static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  }
  const std::int64_t one = g.num_blocks * g.block_size * g.num_kv_heads * g.head_dim *
                           static_cast<std::int64_t>(spec::dtype_bytes(c.kv.cache_dtype));
  return spec::kv_in_one_tensor(c) ? 2 * one : one;
}

std::int64_t index_buffer_bytes(const spec::ModelConfig& c) {
  // SPEC 3: the view's blocks past its offset (dense: offset 0, blocks back to back).
  const spec::IndexStrides iv = spec::index_view(c);
  return (iv.offset + c.geometry.num_blocks * iv.block) * spec::index_stride_bytes(c);
}

namespace detail {

void require_buffers(const spec::ModelConfig& c, const spec::LayerCaches& caches) {
  struct Wanted {
    spec::BufferKind kind;
    std::int64_t bytes;
  };
  std::vector<Wanted> want;
  if (spec::kv_in_one_tensor(c)) {
    want.push_back({spec::BufferKind::kKv, kv_buffer_bytes(c)});
  } else {
    want.push_back({spec::BufferKind::kK, kv_buffer_bytes(c)});
    want.push_back({spec::BufferKind::kV, kv_buffer_bytes(c)});
  }
  if (caches.kind == spec::LayerKind::kSparse) {
    want.push_back({spec::BufferKind::kIndexK, index_buffer_bytes(c)});
  }
  if (caches.buffers.size() != want.size()) {
    throw spec::InvalidInput("caches", -1, std::to_string(caches.buffers.size()) + " buffers",
                             "a " + std::string(spec::name_of(caches.kind)) + " layer has " +
                                 std::to_string(want.size()));
  }
  for (const Wanted& x : want) {
    const spec::CacheBuffer* b = caches.find(x.kind);
    if (b == nullptr || b->guard_bytes < 0 || b->body_bytes() != x.bytes) {
      throw spec::InvalidInput("caches", -1, std::string(spec::name_of(x.kind)),
                               "missing, or not of " + std::to_string(x.bytes) + " body bytes");
    }
  }
}

KvStrides kv_strides(const spec::CacheGeometry& g, spec::KvLayout layout) {
  const std::int64_t bs = g.block_size, nkv = g.num_kv_heads, hd = g.head_dim;
  switch (layout) {
    case spec::KvLayout::kNhd:  // [nb, bs, nkv, hd]
      return {bs * nkv * hd, nkv * hd, hd, 0};
    case spec::KvLayout::kHnd:  // [nb, nkv, bs, hd]
      return {nkv * bs * hd, hd, bs * hd, 0};
    case spec::KvLayout::kPackedHnd:  // [nb, nkv, bs, 2*hd], V at hd
      return {nkv * bs * 2 * hd, 2 * hd, bs * 2 * hd, hd};
    case spec::KvLayout::kPackedNhd:  // [nb, bs, nkv, 2*hd]
      return {bs * nkv * 2 * hd, nkv * 2 * hd, 2 * hd, hd};
    case spec::KvLayout::kSplitNhd:  // [nb, 2, bs, nkv, hd]
      return {2 * bs * nkv * hd, nkv * hd, hd, bs * nkv * hd};
    case spec::KvLayout::kSplitHnd:  // [nb, 2, nkv, bs, hd]
      return {2 * nkv * bs * hd, hd, bs * hd, nkv * bs * hd};
  }
  return {};
}

KvStrides kv_strides(const spec::ModelConfig& c) {
  const spec::KvStrides& s = c.kv_strides;
  if (s.dense()) return kv_strides(c.geometry, c.layout);
  return {s.block, s.token, s.head, s.kv_part, s.offset};
}

std::vector<std::int64_t> layout_shape(spec::KvLayout layout, const spec::CacheGeometry& g) {
  const std::int64_t nb = g.num_blocks, bs = g.block_size, h = g.num_kv_heads, d = g.head_dim;
  switch (layout) {
    case spec::KvLayout::kNhd:
      return {nb, bs, h, d};
    case spec::KvLayout::kHnd:
      return {nb, h, bs, d};
    case spec::KvLayout::kPackedHnd:
      return {nb, h, bs, 2 * d};
    case spec::KvLayout::kPackedNhd:
      return {nb, bs, h, 2 * d};
    case spec::KvLayout::kSplitNhd:
      return {nb, 2, bs, h, d};
    case spec::KvLayout::kSplitHnd:
      return {nb, 2, h, bs, d};
  }
  return {};
}

std::vector<std::uint8_t> slot_storage(const spec::SlotMapping& m) {
  const std::size_t eb = m.type == spec::SlotType::kI64 ? 8 : 4;
  std::vector<std::uint8_t> out(m.slots.size() * eb);
  for (std::size_t i = 0; i < m.slots.size(); ++i) {
    if (eb == 8) {
      std::memcpy(out.data() + i * 8, &m.slots[i], 8);
    } else {
      const auto v = static_cast<std::int32_t>(m.slots[i]);
      std::memcpy(out.data() + i * 4, &v, 4);
    }
  }
  return out;
}

QueryRows::QueryRows(const spec::ModelConfig& c, const spec::ReadBatch& b) {
  spec::validate_batch(c, b);
  for (std::int64_t r = 0; r < b.num_requests(); ++r) {
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                               b.query_start_loc[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < q_len; ++j) {
      request.push_back(r);
      position.push_back(b.seq_lens[static_cast<std::size_t>(r)] - q_len + j);
    }
  }
}

std::int64_t QueryRows::n_valid(const spec::ReadBatch& b, std::int64_t row, std::int64_t sb) const {
  const auto i = static_cast<std::size_t>(row);
  return b.seq_lens[static_cast<std::size_t>(request[i])] == 0 ? 0 : position[i] / sb + 1;
}

std::int64_t QueryRows::max_n_valid(const spec::ReadBatch& b, std::int64_t sb) const {
  std::int64_t m = 1;
  for (std::int64_t i = 0; i < size(); ++i) m = std::max(m, n_valid(b, i, sb));
  return m;
}

void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dt, std::int64_t rows,
                  std::int64_t heads, std::int64_t dim) {
  if (t.dtype != dt || t.shape != std::vector<std::int64_t>{rows, heads, dim} ||
      static_cast<std::int64_t>(t.bytes.size()) !=
          rows * heads * dim * static_cast<std::int64_t>(spec::dtype_bytes(dt))) {
    throw spec::InvalidInput(field, -1, "tensor",
                             "expected " + std::string(spec::name_of(dt)) + " [" +
                                 std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                                 std::to_string(dim) + "]");
  }
}

void check_selection(const spec::ModelConfig& c, const QueryRows& rows,
                     const std::vector<std::int32_t>& selection, std::int64_t topk) {
  const std::int64_t tq = rows.size(), nkv = c.geometry.num_kv_heads;
  if (topk < 1 || static_cast<std::int64_t>(selection.size()) != tq * nkv * topk) {
    throw spec::InvalidInput(
        "selection", -1, std::to_string(selection.size()) + " ids",
        "expected [" + std::to_string(tq) + ", " + std::to_string(nkv) + ", topk]");
  }
  for (std::int64_t qi = 0; qi < tq; ++qi) {
    for (std::int64_t g = 0; g < nkv; ++g) {
      const std::int32_t* row = &selection[static_cast<std::size_t>((qi * nkv + g) * topk)];
      for (std::int64_t k = 0; k < topk; ++k) {
        const std::int32_t id = row[k];
        // SPEC 6: -1 anywhere and ids past n_valid select nothing; the same id twice is invalid.
        if (id >= 0 && std::find(row, row + k, id) != row + k) {
          throw spec::InvalidInput("selection", (qi * nkv + g) * topk + k, std::to_string(id),
                                   "the same block twice in one row");
        }
      }
    }
  }
}

QueryRows check_indexer_inputs(const spec::ModelConfig& c, const spec::IndexerParams& p,
                               const spec::ReadBatch& b, const spec::HostTensor& index_q,
                               spec::LayerKind caches) {
  spec::validate(c);
  QueryRows rows(c, b);
  spec::validate_indexer(c, p);
  check_tensor(index_q, "index_q", spec::index_q_dtype(c, p), rows.size(), p.num_index_heads,
               c.geometry.index_dim);
  if (caches != spec::LayerKind::kSparse) {
    throw spec::InvalidInput("caches.kind", -1, std::string(spec::name_of(caches)),
                             "the indexer reads a sparse layer's index-K");
  }
  return rows;
}

QueryRows check_attention_inputs(const spec::ModelConfig& c, const spec::AttentionParams& p,
                                 const spec::ReadBatch& b, const spec::HostTensor& q,
                                 const std::vector<float>& k_scale,
                                 const std::vector<float>& v_scale,
                                 const std::vector<std::int32_t>& selection, std::int64_t topk) {
  spec::validate(c);
  QueryRows rows(c, b);
  spec::validate_attention(c, p);
  spec::validate_scales(c, k_scale, "k_scale");
  spec::validate_scales(c, v_scale, "v_scale");
  check_tensor(q, "q", c.act_dtype, rows.size(), p.num_q_heads, c.geometry.head_dim);
  if (!selection.empty()) check_selection(c, rows, selection, topk);
  return rows;
}

}  // namespace detail

DeviceKvCaches cache_views(const spec::ModelConfig& c, void* k_body, void* v_body,
                           void* index_body) {
  const spec::CacheGeometry& g = c.geometry;
  const ElementType et = element_type_of(c.kv.cache_dtype);
  const auto eb = static_cast<std::int64_t>(element_bytes(et));
  const detail::KvStrides st = detail::kv_strides(c);
  // The tensors start at their first element: a strided view's offset in (SPEC 3).
  const auto first = [&](void* body, std::int64_t elements) {
    return body == nullptr ? nullptr : static_cast<std::uint8_t*>(body) + elements * eb;
  };
  // The layout's shape with the view's strides; the packed layouts' 2*hd rows stay one dim (their
  // kv_part is hd).
  std::vector<std::int64_t> shaped;
  const spec::LayoutAxes& la = spec::layout_axes(c.layout);  // nhd / hnd: K's and V's own axes
  for (int i = 0; i < la.rank; ++i) {
    const spec::KvAxis axis = la.axes[static_cast<std::size_t>(i)];
    if (axis == spec::KvAxis::kKv && i == la.rank - 2) continue;
    shaped.push_back(axis == spec::KvAxis::kBlock   ? st.block
                     : axis == spec::KvAxis::kToken ? st.token
                     : axis == spec::KvAxis::kHead  ? st.head
                     : axis == spec::KvAxis::kKv    ? st.kv_part
                                                    : 1);
  }
  DeviceKvCaches v;
  v.k_cache = {first(k_body, st.offset), et, detail::layout_shape(c.layout, g), shaped};
  if (v_body != nullptr) {
    v.v_cache = {first(v_body, st.offset), et, detail::layout_shape(c.layout, g), shaped};
  } else if (!spec::kv_in_one_tensor(c.layout)) {
    // nhd / hnd as views of one allocation (vLLM's kv_cache[0], kv_cache[1]): V kv_part after K.
    v.v_cache = {first(k_body, st.offset + st.kv_part), et, detail::layout_shape(c.layout, g),
                 shaped};
  }
  const std::vector<std::int64_t> logical{g.num_blocks, g.block_size, g.num_kv_heads, g.head_dim};
  const std::vector<std::int64_t> strides{st.block, st.token, st.head, 1};
  v.k = {first(k_body, st.offset), et, logical, strides};
  v.v = {v_body != nullptr ? first(v_body, st.offset) : first(k_body, st.offset + st.kv_part), et,
         logical, strides};
  if (index_body != nullptr) {
    // The index-K view (SPEC 3): from its first element, with its strides.
    const spec::IndexStrides iv = spec::index_view(c);
    void* index_first =
        static_cast<std::uint8_t*>(index_body) + iv.offset * spec::index_stride_bytes(c);
    if (c.index.layout == spec::IndexLayout::kBlockScale) {
      const std::int64_t block_bytes = spec::blockscale_block_bytes(g);
      v.index_cache = {index_first, ElementType::kU8, {g.num_blocks, block_bytes}, {iv.block, 1}};
    } else {
      v.index_cache = {index_first,
                       element_type_of(c.index.flat_dtype),
                       {g.num_blocks, g.block_size, g.index_dim},
                       {iv.block, iv.token, 1}};
    }
  }
  return v;
}

}  // namespace kvo::gpu
