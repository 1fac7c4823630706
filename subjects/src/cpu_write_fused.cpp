// CPU model of the fused one-launch write kernel: per token, the page and the in-page offset are
// computed once; K and V are written in the same pass through one stride descriptor per layout;
// sparse layers add the index-K row (flat, or block-scaled with its own amax pass).
#include <cmath>
#include <utility>
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
using reference::f32_to_fp8;
using reference::float_of;
using reference::PagedCacheLayout;
using reference::quantize_kv;
using reference::source_value;
using reference::store_code;
using spec::BufferKind;
using spec::KvLayout;

KvStrides kv_strides(const spec::CacheGeometry& g, KvLayout layout) {
  const std::int64_t bs = g.block_size, nkv = g.num_kv_heads, hd = g.head_dim;
  switch (layout) {
    case KvLayout::kNhd:
      return {bs * nkv * hd, nkv * hd, hd, 0};
    case KvLayout::kHnd:
      return {nkv * bs * hd, hd, bs * hd, 0};
    case KvLayout::kPackedHnd:
      return {nkv * bs * 2 * hd, 2 * hd, bs * 2 * hd, hd};
    case KvLayout::kPackedNhd:
      return {bs * nkv * 2 * hd, nkv * 2 * hd, 2 * hd, hd};
    case KvLayout::kSplitNhd:
      return {2 * bs * nkv * hd, nkv * hd, hd, bs * nkv * hd};
    case KvLayout::kSplitHnd:
      return {2 * nkv * bs * hd, hd, bs * hd, nkv * bs * hd};
  }
  return {0, 0, 0, 0};
}

KvView kv_view(const spec::ModelConfig& config, spec::LayerCaches& caches) {
  const bool one_tensor = spec::kv_in_one_tensor(config);
  KvView view;
  // A strided view (SPEC 3) as the kernel is handed it: its strides, its first element `offset`
  // elements into each buffer.
  const spec::KvStrides& s = config.kv_strides;
  view.strides = s.dense() ? kv_strides(config.geometry, config.layout)
                           : KvStrides{s.block, s.token, s.head, s.kv_part};
  view.block_size = config.geometry.block_size;
  const auto first = s.offset * static_cast<std::int64_t>(spec::dtype_bytes(config.kv.cache_dtype));
  for (spec::CacheBuffer& b : caches.buffers) {
    if (b.kind == BufferKind::kK || b.kind == BufferKind::kKv) view.k = b.body() + first;
    if (b.kind == BufferKind::kV) view.v = b.body() + first;
  }
  if (one_tensor) {
    view.v = view.k;
    view.v_part = view.strides.kv_part;
  }
  if (view.k == nullptr || view.v == nullptr) {
    throw spec::InvalidInput("caches", -1, std::string(spec::name_of(config.layout)),
                             "the layer has no K/V buffers of this layout");
  }
  return view;
}

std::int64_t resolve_slot(std::int64_t slot, std::int64_t capacity, spec::SlotMode mode) {
  if (slot < 0 && mode == spec::SlotMode::kLegacyWrap) return slot + capacity;
  return slot;
}

namespace {

/// fl(x / s) moved by a deterministic k in [-2, 2] ulp, k a hash of both operands: an
/// approximate division within 2 ulp of the correctly rounded one (never across zero).
float approx_quotient(float x, float s) {
  const float exact = reference::arithmetic_result(x / s);
  if (!std::isfinite(exact) || exact == 0.0f) return exact;
  std::uint64_t h = (static_cast<std::uint64_t>(bits_of(x)) << 32) | bits_of(s);
  h = (h ^ (h >> 31)) * 0x9E3779B97F4A7C15ull;
  const int k = static_cast<int>((h >> 59) % 5) - 2;
  float y = exact;
  for (int i = 0; i < (k < 0 ? -k : k); ++i) {
    const float next = std::nextafter(y, k < 0 ? 0.0f : std::copysign(INFINITY, y));
    if (next == 0.0f) break;
    y = next;
  }
  return y;
}

/// One K/V element as the mutated kernel quantizes it (quantize_kv, but for the mutation).
std::uint32_t quantize_element(float x, float s, const spec::ModelConfig& config,
                               WriteMutation mutation) {
  if (mutation == WriteMutation::kNone) return quantize_kv(x, s, config.kv, config.act_dtype);
  spec::KvQuant q = config.kv;
  if (mutation == WriteMutation::kE4m3IntoE5m2 && q.cache_dtype == spec::DType::kFp8E5M2)
    q.cache_dtype = spec::DType::kFp8E4M3;
  const bool divides =
      q.scale_mode == spec::ScaleMode::kDivide || q.scale_mode == spec::ScaleMode::kDivApprox;
  const bool fp8 = spec::is_fp8(q.cache_dtype);
  if (fp8 &&
      (mutation == WriteMutation::kFp8FlushToZero || mutation == WriteMutation::kRoundHalfAway)) {
    float v =
        reference::apply_scale(x, reference::effective_scale(s, q, config.act_dtype), q.scale_mode);
    if (q.via_model_dtype) v = reference::round_to(v, config.act_dtype);
    std::uint32_t code = encode(v, q.cache_dtype, q.saturation);
    const std::uint32_t sign = spec::sign_bit(q.cache_dtype);
    const std::uint32_t magnitude = code & (sign - 1u);
    const int mantissa_bits = spec::format_of(q.cache_dtype).mantissa_bits;
    if (mutation == WriteMutation::kFp8FlushToZero) {
      const bool subnormal = magnitude != 0 && (magnitude >> mantissa_bits) == 0;
      return subnormal ? code & sign : code;
    }
    // A tie: v exactly halfway between its code and the next code away from zero.
    const std::uint32_t away =
        encode(std::nextafter(v, std::copysign(INFINITY, v)), q.cache_dtype, q.saturation);
    if (std::isfinite(v) && away != code &&
        std::fabs(reference::decode(away, q.cache_dtype) - v) ==
            std::fabs(reference::decode(code, q.cache_dtype) - v)) {
      code = away;
    }
    return code;
  }
  if (mutation != WriteMutation::kApproxDivision || !divides)
    return quantize_kv(x, s, q, config.act_dtype);
  float v = approx_quotient(x, reference::effective_scale(s, q, config.act_dtype));
  if (q.via_model_dtype) v = reference::round_to(v, config.act_dtype);
  return encode(v, q.cache_dtype, q.saturation);
}

/// Stores a code only where its bytes lie inside `buffer`'s storage, guards included: a planted
/// out-of-bounds write shows in the guard band and never corrupts the host's memory.
void store_inside(std::uint32_t code, spec::DType dtype, std::uint8_t* at,
                  spec::CacheBuffer& buffer) {
  const std::uint8_t* lo = buffer.storage.data();
  const std::uint8_t* hi = lo + buffer.storage.size();
  if (at >= lo && at + spec::dtype_bytes(dtype) <= hi) store_code(code, dtype, at);
}

/// kTruncatingMinusOne: the padding tokens' K and V at page 0, offset slot % bs (C++ and Triton
/// both truncate toward zero: -1 gives offset -1).
void write_truncated_padding(const spec::ModelConfig& config, const spec::LayerWrite& w,
                             spec::LayerCaches& caches, const KvView& view) {
  const spec::CacheGeometry& g = config.geometry;
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(config.kv.cache_dtype));
  const bool one_tensor = spec::kv_in_one_tensor(config);
  spec::CacheBuffer* kbuf = caches.find(one_tensor ? BufferKind::kKv : BufferKind::kK);
  spec::CacheBuffer* vbuf = caches.find(one_tensor ? BufferKind::kKv : BufferKind::kV);
  for (std::size_t t = 0; t < w.slots.slots.size(); ++t) {
    const std::int64_t slot = w.slots.slots[t];
    if (slot >= 0) continue;
    const std::int64_t page = slot / g.block_size;  // 0 for -bs < slot < 0
    const std::int64_t in_page = slot % g.block_size;
    const std::int64_t token_base = page * view.strides.block + in_page * view.strides.token;
    const auto ti = static_cast<std::int64_t>(t);
    for (std::int64_t h = 0; h < g.num_kv_heads; ++h) {
      const std::size_t si = config.kv.per_head_scale ? static_cast<std::size_t>(h) : 0;
      for (std::int64_t d = 0; d < g.head_dim; ++d) {
        const std::int64_t src = (ti * g.num_kv_heads + h) * g.head_dim + d;
        const std::int64_t at = token_base + h * view.strides.head + d;
        store_inside(
            quantize_kv(source_value(w.k, src), w.k_scale[si], config.kv, config.act_dtype),
            config.kv.cache_dtype, view.k + at * eb, *kbuf);
        store_inside(
            quantize_kv(source_value(w.v, src), w.v_scale[si], config.kv, config.act_dtype),
            config.kv.cache_dtype, view.v + (at + view.v_part) * eb, *vbuf);
      }
    }
  }
}

}  // namespace

void write_layer_fused(const spec::ModelConfig& config, const spec::LayerWrite& w,
                       spec::LayerCaches& caches) {
  write_layer_fused_mutated(config, w, caches, WriteMutation::kNone);
}

void write_layer_fused_mutated(const spec::ModelConfig& config, const spec::LayerWrite& w,
                               spec::LayerCaches& caches, WriteMutation mutation) {
  spec::validate_write(config, w);
  const PagedCacheLayout layout(config);
  const spec::CacheGeometry& g = config.geometry;
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(config.kv.cache_dtype));

  check_layer_caches(layout, w.kind, caches);
  spec::ModelConfig seen = config;  // what the kernel takes the cache for
  if (mutation == WriteMutation::kStridedAssumedDense) {
    seen.kv_strides = {};
    seen.index_strides = {};
    if (spec::kv_in_one_tensor(config) && !spec::kv_in_one_tensor(config.layout)) {
      // nhd / hnd of one allocation, taken for the dense [2, nb, ...] tensor.
      const KvStrides d = kv_strides(g, config.layout);
      seen.kv_strides = {d.block, d.token, d.head, g.num_blocks * d.block, 0};
    }
  }
  KvView view = kv_view(seen, caches);
  if (mutation == WriteMutation::kSwapTokenHeadStrides)
    std::swap(view.strides.token, view.strides.head);
  std::uint8_t* index_base = nullptr;
  for (spec::CacheBuffer& b : caches.buffers) {
    if (b.kind == BufferKind::kIndexK) index_base = b.body();
  }
  // A mutant's K/V rows land where its kernel's would; what falls outside the buffer's storage
  // (guards included) is dropped, as a GPU would fault or scribble on memory that is not the cache.
  const auto k_or_kv =
      caches.find(spec::kv_in_one_tensor(config) ? BufferKind::kKv : BufferKind::kK);
  const auto v_or_kv =
      caches.find(spec::kv_in_one_tensor(config) ? BufferKind::kKv : BufferKind::kV);
  const auto put = [&](const spec::CacheBuffer* b, std::uint8_t* at, std::int64_t bytes,
                       auto&& write) {
    if (mutation == WriteMutation::kNone ||
        (at >= b->storage.data() && at + bytes <= b->storage.data() + b->storage.size()))
      write();
  };
  const bool sparse = w.kind == spec::LayerKind::kSparse;
  // A K/V element offset as the kernel computes it (kInt32Offset: in int32, two's complement).
  const auto element_offset = [&](std::int64_t e) -> std::int64_t {
    if (mutation != WriteMutation::kInt32Offset) return e;
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(e));
  };

  const std::int64_t row = g.num_kv_heads * g.head_dim;
  const std::int64_t groups = g.index_dim / spec::kScaleGroup;
  // Scale none and no planted bug: whole head rows through quantize_kv tabulated over the source
  // codes (the same codes, reference::store_kv_codes).
  const std::uint32_t* table =
      mutation == WriteMutation::kNone && w.v.dtype == w.k.dtype
          ? reference::unscaled_kv_codes(w.k.dtype, config.kv, config.act_dtype)
          : nullptr;
  // The index-K view (SPEC 3): flat strides in elements, blockscale in bytes.
  const spec::IndexStrides index_view = spec::index_view(seen);
  std::vector<float> index_row(static_cast<std::size_t>(g.index_dim));
  const auto num_tokens = static_cast<std::int64_t>(w.slots.slots.size());
  for (std::int64_t t = 0; t < num_tokens; ++t) {
    if (mutation == WriteMutation::kMinusOneStopsWrite &&
        w.slots.slots[static_cast<std::size_t>(t)] < 0)
      break;
    const std::int64_t slot =
        resolve_slot(w.slots.slots[static_cast<std::size_t>(t)], g.capacity(), config.slot_mode);
    if (slot >= 0) {
      const std::int64_t token_base = view.token_offset(slot);
      for (std::int64_t h = 0; h < g.num_kv_heads; ++h) {
        const std::size_t si =
            config.kv.per_head_scale && mutation != WriteMutation::kPerHeadScaleAsHead0
                ? static_cast<std::size_t>(h)
                : 0;
        const float ks = w.k_scale[si];
        const float vs = w.v_scale[si];
        std::uint8_t* kd = view.k + (token_base + h * view.strides.head) * eb;
        std::uint8_t* vd = view.v + (token_base + h * view.strides.head + view.v_part) * eb;
        if (table != nullptr) {
          reference::store_kv_codes(w.k, t * row + h * g.head_dim, g.head_dim, ks, config.kv,
                                    config.act_dtype, table, kd);
          reference::store_kv_codes(w.v, t * row + h * g.head_dim, g.head_dim, vs, config.kv,
                                    config.act_dtype, table, vd);
          continue;
        }
        for (std::int64_t d = 0; d < g.head_dim; ++d) {
          const std::int64_t src = t * row + h * g.head_dim + d;
          const std::int64_t e = token_base + h * view.strides.head + d;
          std::uint8_t* kp = view.k + element_offset(e) * eb;
          std::uint8_t* vp = view.v + element_offset(e + view.v_part) * eb;
          put(k_or_kv, kp, eb, [&] {
            store_code(quantize_element(source_value(w.k, src), ks, config, mutation),
                       config.kv.cache_dtype, kp);
          });
          put(v_or_kv, vp, eb, [&] {
            store_code(quantize_element(source_value(w.v, src), vs, config, mutation),
                       config.kv.cache_dtype, vp);
          });
        }
        const std::int64_t tail = g.head_dim * eb % 16;
        if (mutation == WriteMutation::kVectorTailOverrun && tail != 0) {
          for (const auto& row : {std::pair{k_or_kv, kd}, std::pair{v_or_kv, vd}}) {
            std::uint8_t* past = row.second + g.head_dim * eb;  // (a lambda captures no binding)
            put(row.first, past, 16 - tail, [&] { std::fill_n(past, 16 - tail, std::uint8_t{0}); });
          }
        }
      }
    }
    if (!sparse) continue;
    const std::int64_t islot = config.separate_index_slots
                                   ? resolve_slot(w.index_slots.slots[static_cast<std::size_t>(t)],
                                                  g.capacity(), config.slot_mode)
                                   : slot;
    if (islot < 0) continue;
    const std::int64_t page = islot / g.block_size;
    const std::int64_t in_page = islot - page * g.block_size;
    for (std::int64_t d = 0; d < g.index_dim; ++d) {
      index_row[static_cast<std::size_t>(d)] = source_value(w.index_k, t * g.index_dim + d);
    }
    if (config.index.layout == spec::IndexLayout::kFlat) {
      const auto ib = static_cast<std::int64_t>(spec::dtype_bytes(config.index.flat_dtype));
      std::uint8_t* dst =
          index_base +
          (index_view.offset + page * index_view.block + in_page * index_view.token) * ib;
      for (std::int64_t d = 0; d < g.index_dim; ++d) {
        store_code(encode(index_row[static_cast<std::size_t>(d)], config.index.flat_dtype,
                          config.kv.saturation),
                   config.index.flat_dtype, dst + d * ib);
      }
      continue;
    }
    std::uint8_t* block = index_base + index_view.offset + page * index_view.block;
    std::uint8_t* values = block + in_page * g.index_dim;
    std::uint8_t* scales = block + g.block_size * g.index_dim + in_page * groups * 4;
    for (std::int64_t gi = 0; gi < groups; ++gi) {
      const float* x = index_row.data() + gi * spec::kScaleGroup;
      float amax = 0.0f;
      // NaN elements are ignored: a comparison is false for every NaN, signalling ones included
      // (glibc's fmax returns NaN for a signalling NaN; CUDA's fmaxf does not).
      for (std::int64_t i = 0; i < spec::kScaleGroup; ++i) {
        const float a = std::fabs(x[i]);
        if (a > amax) amax = a;
      }
      if (!(amax > spec::kBlockScaleAmaxFloor) && mutation != WriteMutation::kZeroGroupScale)
        amax = spec::kBlockScaleAmaxFloor;
      // SPEC 2's two formulas: vLLM/TRT-LLM divide, SGLang/DeepSeek multiply by fl(1/448).
      float s = config.index.blockscale_scale == spec::BlockScaleFormula::kMulRecip
                    ? amax * (1.0f / spec::kFp8E4M3Max)
                    : amax / spec::kFp8E4M3Max;
      if (config.index.ue8m0) {
        const std::uint32_t u = bits_of(s);
        s = float_of((((u >> 23) & 0xFFu) + ((u & 0x7FFFFFu) ? 1u : 0u)) << 23);
      }
      for (std::int64_t i = 0; i < spec::kScaleGroup; ++i) {
        const float scaled = mutation == WriteMutation::kBlockscaleNanToMin && std::isnan(x[i])
                                 ? -spec::kFp8E4M3Max
                                 : reference::arithmetic_result(x[i] / s);
        values[gi * spec::kScaleGroup + i] =
            f32_to_fp8(scaled, spec::DType::kFp8E4M3, spec::Saturation::kSatFinite);
      }
      store_code(bits_of(s), spec::DType::kF32, scales + gi * 4);
    }
  }
  if (mutation == WriteMutation::kTruncatingMinusOne && config.slot_mode == spec::SlotMode::kStrict)
    write_truncated_padding(config, w, caches, view);
}

}  // namespace kvo::subjects
