// Layer writes resident on the device (kvo/gpu/resident.hpp): SPEC 8's values generated on the
// device, each layer's copies as DeviceCacheMirrors, comparisons of copies on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "convert.cuh"
#include "kvo/gpu/device_caches.hpp"
#include "kvo/gpu/resident.hpp"
#include "kvo/spec/cache_storage.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"
#include "staging.cuh"

namespace kvo::gpu {
namespace {

using detail::check_cuda;
using detail::DeviceBuffer;
using detail::DType;

/// One tensor a generation launch fills: [rows, heads, dim] activation codes at `out`.
struct GenTensor {
  void* out = nullptr;
  std::int64_t tensor = 0;  ///< the generator's tensor field (reference::GenTensor's value)
  std::int64_t heads = 1, dim = 0;
};
/// A generation launch: up to three tensors of the same rows (a layer's K, V and index-K), for
/// gridDim.y layers: layer y's tensors start `layer_stride` bytes after layer y - 1's.
struct GenLaunch {
  std::uint64_t seed = 0;
  spec::GeneratedValueRule rule;
  const std::int64_t* layers = nullptr;  ///< [gridDim.y] the generator's layer keys
  std::int64_t layer_stride = 0;
  const GeneratedRowKey* keys = nullptr;  ///< [rows]
  std::int64_t rows = 0;
  GenTensor t[3];
  int count = 0;
};

/// Element i of tensor `g` of layer y gets the value of key (seed, layers[y], tensor, keys[row],
/// head, dim), rounded by the device's own conversion (round_to_act) and stored as its code.
template <DType A>
__global__ void generate_kernel(GenLaunch p) {
  const std::int64_t layer = p.layers[blockIdx.y];
  for (int which = 0; which < p.count; ++which) {
    const GenTensor& g = p.t[which];
    auto* out = static_cast<std::uint8_t*>(g.out) + blockIdx.y * p.layer_stride;
    const std::int64_t per_row = g.heads * g.dim, n = p.rows * per_row;
    for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
      const std::int64_t row = i / per_row, head = (i % per_row) / g.dim, dim = i % g.dim;
      const GeneratedRowKey k = p.keys[row];
      const std::uint64_t key = spec::key_chain(
          spec::key_chain(spec::row_key(p.seed, layer, g.tensor, k.request, k.position), head),
          dim);
      const float v = spec::generated_value(
          key, p.rule, [](float x) { return detail::round_to_act<A>(x); },
          [](std::uint32_t bits) { return __uint_as_float(bits); });
      // v is rounded already: its narrowing is exact (NaN: the dtype's canonical NaN, as on the
      // CPU).
      if constexpr (A == DType::kBF16) {
        reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
      } else if constexpr (A == DType::kF16) {
        reinterpret_cast<__half*>(out)[i] = __float2half_rn(v);
      } else {
        reinterpret_cast<float*>(out)[i] = v;
      }
    }
  }
}

void launch_generate(DType act, const GenLaunch& p, unsigned layers, cudaStream_t stream) {
  std::int64_t most = 0;
  for (int i = 0; i < p.count; ++i) most = std::max(most, p.rows * p.t[i].heads * p.t[i].dim);
  if (most == 0 || layers == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((most + 255) / 256, 1024)), layers);
  switch (act) {
    case DType::kBF16:
      generate_kernel<DType::kBF16><<<grid, 256, 0, stream>>>(p);
      break;
    case DType::kF16:
      generate_kernel<DType::kF16><<<grid, 256, 0, stream>>>(p);
      break;
    case DType::kF32:
      generate_kernel<DType::kF32><<<grid, 256, 0, stream>>>(p);
      break;
    default:
      throw spec::Unsupported("generated values in " + std::string(spec::name_of(act)) +
                              " (an activation dtype is f32, bf16 or f16)");
  }
  check_cuda(cudaGetLastError(), "generate_kernel");
}

/// Generated inputs of all layers at once up to this many bytes (else one layer at a time).
constexpr std::int64_t kAllLayersInputBytes = std::int64_t{512} << 20;

/// The slots of the pointer table of one layer copy: its buffers, then the whole allocation.
constexpr int kMaxBuffers = 3;
constexpr int kAllocationSlot = kMaxBuffers;
struct CopyPointers {
  const std::uint8_t* p[kMaxBuffers + 1];
  std::int64_t bytes[kMaxBuffers + 1];
  std::int32_t buffers;
};
/// A piece of a compared range: one CUDA block compares [begin, end) of slot `slot`.
struct CompareTile {
  std::int32_t slot;
  std::int64_t begin, end;
};
/// Per layer: the first differing byte as (slot << 56 | byte) and the count of differing bytes.
struct CompareResult {
  unsigned long long first;
  unsigned long long count;
};
constexpr std::int64_t kTileBytes = 64 << 10;

/// Block (tile, layer): the differing bytes of the tile between copy a and copy b of the layer.
__global__ void compare_kernel(const CopyPointers* a, const CopyPointers* b,
                               const CompareTile* tiles, CompareResult* out) {
  const CompareTile t = tiles[blockIdx.x];
  const std::int64_t layer = blockIdx.y;
  const CopyPointers& x = a[layer];
  const CopyPointers& y = b[layer];
  if (t.slot != kAllocationSlot && t.slot >= x.buffers) return;  // a buffer this layer lacks
  const std::int64_t end = min(t.end, x.bytes[t.slot]);
  const std::uint8_t* px = x.p[t.slot];
  const std::uint8_t* py = y.p[t.slot];
  unsigned long long first = ~0ull, count = 0;
  // 8-byte words where both sides are aligned alike (the mirrors place buffers alike), bytes at
  // the ends.
  const std::int64_t head = min(end, (t.begin + 7) / 8 * 8);
  const std::int64_t tail = max(head, end / 8 * 8);
  const auto note = [&](std::int64_t at) {
    first = min(first, static_cast<unsigned long long>(at));
    ++count;
  };
  for (std::int64_t i = t.begin + threadIdx.x; i < head; i += blockDim.x) {
    if (px[i] != py[i]) note(i);
  }
  for (std::int64_t w = head / 8 + threadIdx.x; w < tail / 8; w += blockDim.x) {
    const std::uint64_t d = reinterpret_cast<const std::uint64_t*>(px)[w] ^
                            reinterpret_cast<const std::uint64_t*>(py)[w];
    if (d == 0) continue;
    for (int k = 0; k < 8; ++k) {
      if ((d >> (8 * k)) & 0xFF) note(8 * w + k);
    }
  }
  for (std::int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    if (px[i] != py[i]) note(i);
  }
  if (count == 0) return;
  atomicMin(&out[layer].first, (static_cast<unsigned long long>(t.slot) << 56) | first);
  atomicAdd(&out[layer].count, count);
}

__global__ void init_results_kernel(CompareResult* out, unsigned layers) {
  for (unsigned i = threadIdx.x; i < layers; i += blockDim.x) out[i] = {~0ull, 0};
}

/// One page a download brings back: [begin, end) of a buffer's storage (at most kPage bytes), to
/// `at` in the gathered bytes.
struct PageCopy {
  std::int64_t begin, end, at;
};
/// Block i copies page i of buffer storage `src` (a layer copy's buffers) into `out`.
__global__ void gather_pages_kernel(const std::uint8_t* const* src, const std::int32_t* buffer,
                                    const PageCopy* pages, std::uint8_t* out) {
  const PageCopy p = pages[blockIdx.x];
  const std::uint8_t* from = src[buffer[blockIdx.x]];
  for (std::int64_t i = p.begin + threadIdx.x; i < p.end; i += blockDim.x)
    out[p.at + (i - p.begin)] = from[i];
}

/// The tiles of `ranges` (slot, begin, end), each at most kTileBytes.
void append_tiles(std::vector<CompareTile>& tiles, std::int32_t slot, std::int64_t begin,
                  std::int64_t end) {
  for (std::int64_t at = begin; at < end; at += kTileBytes) {
    tiles.push_back({slot, at, std::min(end, at + kTileBytes)});
  }
}

std::string gib(std::int64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(v) / (1ll << 30));
  return text;
}

}  // namespace

std::vector<std::uint8_t> generated_rows_on_device(const GeneratedValues& values,
                                                   std::int64_t layer, std::int64_t tensor,
                                                   std::span<const GeneratedRowKey> keys,
                                                   std::int64_t heads, std::int64_t dim) {
  const auto rows = static_cast<std::int64_t>(keys.size());
  const std::size_t bytes =
      static_cast<std::size_t>(rows * heads * dim) * spec::dtype_bytes(values.act);
  std::vector<std::uint8_t> out(bytes);
  if (bytes == 0) return out;
  const DeviceBuffer d_keys(keys.data(), keys.size_bytes());
  const DeviceBuffer d_layer(&layer, sizeof layer);
  const DeviceBuffer d_out(bytes);
  GenLaunch p;
  p.seed = values.seed;
  p.rule = values.rule;
  p.layers = d_layer.as<const std::int64_t>();
  p.keys = d_keys.as<const GeneratedRowKey>();
  p.rows = rows;
  p.t[0] = {d_out.data(), tensor, heads, dim};
  p.count = 1;
  const cudaStream_t stream = detail::call_stream();
  launch_generate(values.act, p, 1, stream);
  check_cuda(cudaStreamSynchronize(stream), "generate_kernel");
  d_out.download(out.data(), bytes);
  return out;
}

struct ResidentReplay::Impl {
  spec::ModelConfig config;
  std::vector<std::int64_t> layers;
  std::vector<spec::LayerKind> kinds;
  GeneratedValues values;
  std::int64_t max_tokens = 0;
  cudaStream_t stream = nullptr;
  /// [copies][layers]
  std::vector<std::vector<std::unique_ptr<DeviceCacheMirror>>> copies;
  std::int64_t device_bytes = 0;
  /// Per copy, the pointer table of every layer ([layers] CopyPointers on the device).
  std::vector<DeviceBuffer> pointer_tables;
  DeviceBuffer k_scale, v_scale;  ///< [1] or [nkv] f32
  std::int64_t scale_count = 1;
  // The staged step.
  std::int64_t tokens = 0;
  const GeneratedRowKey* keys_d = nullptr;  ///< [tokens], in `staged`
  std::uint8_t* slots_d = nullptr;          ///< [tokens] slot type, in `staged`
  std::uint8_t* index_slots_d = nullptr;    ///< [tokens] (separate_index_slots), or null
  /// The generated inputs: per layer (all layers at once where they fit in
  /// kAllLayersInputBytes, else one slot reused layer after layer) K [max_tokens, nkv, hd], V the
  /// same, index-K [max_tokens, index_dim], `input_stride` bytes a layer.
  DeviceBuffer inputs;
  std::int64_t input_stride = 0, kv_input_bytes = 0;
  bool all_layers = false;
  DeviceBuffer layer_ids;  ///< [layers] int64: the generator's layer keys
  /// Per copy and layer, the call its writer receives (inputs and T set per step).
  std::vector<std::vector<DeviceWriteCall>> calls;
  /// The staged step's upload: keys, slots, index slots and its comparison's tiles, from pinned
  /// host memory in one copy.
  std::uint8_t* pinned = nullptr;
  std::size_t pinned_bytes = 0;
  DeviceBuffer staged;
  std::int64_t step_tiles = 0;
  const CompareTile* step_tiles_d = nullptr;
  DeviceBuffer whole_tiles;  ///< every byte of the largest allocation, as tiles
  std::int64_t whole_tile_count = 0;
  DeviceBuffer results;                ///< [layers] CompareResult
  CompareResult* results_h = nullptr;  ///< pinned [layers]

  /// Generates the inputs of layers [first, first + count) of the staged step, layer first + y
  /// into input slot y.
  void generate_layers(std::size_t first, std::size_t count) {
    const spec::CacheGeometry& g = config.geometry;
    GenLaunch p;
    p.seed = values.seed;
    p.rule = values.rule;
    p.layers = layer_ids.as<const std::int64_t>() + first;
    p.layer_stride = input_stride;
    p.keys = keys_d;
    p.rows = tokens;
    // The tensor fields are reference::GenTensor's: K 0, V 1, index-K 2 (generated for every
    // layer of the launch: a dense layer's is not read).
    p.t[0] = {inputs.data(), 0, g.num_kv_heads, g.head_dim};
    p.t[1] = {inputs.data() + kv_input_bytes, 1, g.num_kv_heads, g.head_dim};
    p.count = 2;
    if (std::find(kinds.begin(), kinds.end(), spec::LayerKind::kSparse) != kinds.end())
      p.t[p.count++] = {inputs.data() + 2 * kv_input_bytes, 2, 1, g.index_dim};
    launch_generate(values.act, p, static_cast<unsigned>(count), stream);
  }

  /// Pinned host memory of at least `bytes` (its old contents dropped).
  void reserve_pinned(std::size_t bytes) {
    if (bytes <= pinned_bytes) return;
    if (pinned != nullptr) cudaFreeHost(pinned);
    pinned = nullptr;
    pinned_bytes = 0;
    check_cuda(cudaMallocHost(&pinned, bytes), "cudaMallocHost(resident staging)");
    pinned_bytes = bytes;
  }
  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (pinned != nullptr) cudaFreeHost(pinned);
    if (results_h != nullptr) cudaFreeHost(results_h);
  }
};

std::int64_t ResidentReplay::device_bytes_needed(const spec::ModelConfig& config,
                                                 const std::vector<spec::LayerCaches>& initial,
                                                 std::size_t copies) {
  std::int64_t per_copy = 0;
  for (const spec::LayerCaches& c : initial) per_copy += DeviceCacheMirror::device_bytes(config, c);
  return per_copy * static_cast<std::int64_t>(copies);
}

ResidentReplay::ResidentReplay(const spec::ModelConfig& config, std::vector<std::int64_t> layers,
                               const std::vector<spec::LayerCaches>& initial, std::size_t copies,
                               const GeneratedValues& values, const std::vector<float>& k_scale,
                               const std::vector<float>& v_scale, std::int64_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  spec::validate(config);
  if (copies < 1 || layers.size() != initial.size()) {
    throw spec::InvalidInput("copies", -1, std::to_string(copies),
                             "expected at least one copy and one set of caches per layer");
  }
  m.config = config;
  m.layers = std::move(layers);
  m.values = values;
  m.max_tokens = std::max<std::int64_t>(max_tokens, 1);
  const std::int64_t needed = device_bytes_needed(config, initial, copies);
  std::size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  // The inputs, tables and tiles are small next to the caches; a sixteenth is left to them.
  if (needed > static_cast<std::int64_t>(free_bytes) / 16 * 15) {
    throw spec::FailedToRun("the caches resident on the device need " + gib(needed) + " (" +
                            std::to_string(initial.size()) + " layers x " + std::to_string(copies) +
                            " copies) and the device has " +
                            gib(static_cast<std::int64_t>(free_bytes)) + " free of " +
                            gib(static_cast<std::int64_t>(total_bytes)) +
                            ": replay fewer layers (--layers) or subjects (--subject)");
  }
  m.stream = detail::call_stream();
  for (const spec::LayerCaches& c : initial) m.kinds.push_back(c.kind);
  m.copies.resize(copies);
  for (std::size_t c = 0; c < copies; ++c) {
    std::vector<CopyPointers> table;
    for (const spec::LayerCaches& caches : initial) {
      auto mirror = std::make_unique<DeviceCacheMirror>(config, caches);
      m.device_bytes += DeviceCacheMirror::device_bytes(config, caches);
      CopyPointers t{};
      t.buffers = static_cast<std::int32_t>(mirror->buffer_count());
      for (std::size_t b = 0; b < mirror->buffer_count() && b < kMaxBuffers; ++b) {
        t.p[b] = mirror->storage(b);
        t.bytes[b] = mirror->storage_bytes(b);
      }
      t.p[kAllocationSlot] = mirror->allocation();
      t.bytes[kAllocationSlot] = mirror->allocation_bytes();
      table.push_back(t);
      m.copies[c].push_back(std::move(mirror));
    }
    m.pointer_tables.emplace_back(table);
  }
  m.scale_count = static_cast<std::int64_t>(k_scale.size());
  if (k_scale.empty() || v_scale.size() != k_scale.size()) {
    throw spec::InvalidInput("k_scale", -1, std::to_string(k_scale.size()),
                             "expected [1] or [nkv] K and V scales of one length");
  }
  m.k_scale = DeviceBuffer(k_scale);
  m.v_scale = DeviceBuffer(v_scale);
  const spec::CacheGeometry& g = config.geometry;
  const std::size_t act = spec::dtype_bytes(config.act_dtype);
  const auto rows = static_cast<std::size_t>(m.max_tokens);
  const auto aligned = [](std::int64_t n) { return (n + 255) / 256 * 256; };
  m.kv_input_bytes = aligned(static_cast<std::int64_t>(rows * act) * g.num_kv_heads * g.head_dim);
  m.input_stride = 2 * m.kv_input_bytes + aligned(static_cast<std::int64_t>(rows * act) *
                                                  std::max<std::int64_t>(g.index_dim, 1));
  const auto layer_count = static_cast<std::int64_t>(m.layers.size());
  m.all_layers = layer_count * m.input_stride <= kAllLayersInputBytes;
  m.inputs = DeviceBuffer(static_cast<std::size_t>(
      (m.all_layers ? std::max<std::int64_t>(layer_count, 1) : 1) * m.input_stride));
  m.layer_ids = DeviceBuffer(m.layers);
  // The calls: everything but the inputs' pointers and T is fixed for the replay.
  const ElementType act_type = element_type_of(config.act_dtype);
  const ElementType slot_type =
      config.slot_type == spec::SlotType::kI32 ? ElementType::kI32 : ElementType::kI64;
  m.calls.resize(copies);
  for (std::size_t c = 0; c < copies; ++c) {
    for (std::size_t li = 0; li < m.layers.size(); ++li) {
      DeviceWriteCall call;
      call.config = &m.config;
      call.kind = m.kinds[li];
      call.k = contiguous_tensor(nullptr, act_type, {0, g.num_kv_heads, g.head_dim});
      call.v = contiguous_tensor(nullptr, act_type, {0, g.num_kv_heads, g.head_dim});
      if (call.kind == spec::LayerKind::kSparse)
        call.index_k = contiguous_tensor(nullptr, act_type, {0, g.index_dim});
      call.slot_mapping = contiguous_tensor(nullptr, slot_type, {0});
      call.index_slot_mapping = contiguous_tensor(nullptr, slot_type, {0});
      call.k_scale = contiguous_tensor(m.k_scale.data(), ElementType::kF32, {m.scale_count});
      call.v_scale = contiguous_tensor(m.v_scale.data(), ElementType::kF32, {m.scale_count});
      call.caches = m.copies[c][li]->views();
      call.stream = m.stream;
      m.calls[c].push_back(std::move(call));
    }
  }
  m.results = DeviceBuffer(std::max<std::size_t>(m.layers.size(), 1) * sizeof(CompareResult));
  check_cuda(cudaMallocHost(&m.results_h,
                            std::max<std::size_t>(m.layers.size(), 1) * sizeof(CompareResult)),
             "cudaMallocHost(comparison results)");
  std::vector<CompareTile> whole;
  std::int64_t most = 0;
  for (const auto& mirror : m.copies.front()) most = std::max(most, mirror->allocation_bytes());
  append_tiles(whole, kAllocationSlot, 0, most);
  m.whole_tiles = DeviceBuffer(whole);
  m.whole_tile_count = static_cast<std::int64_t>(whole.size());
  check_cuda(cudaDeviceSynchronize(), "resident caches");
}

ResidentReplay::~ResidentReplay() = default;

std::int64_t ResidentReplay::device_bytes() const { return impl_->device_bytes; }

void ResidentReplay::stage_step(std::span<const GeneratedRowKey> keys,
                                const spec::SlotMapping& slots,
                                const spec::SlotMapping* index_slots,
                                std::span<const BufferByteRange> compared) {
  Impl& m = *impl_;
  const auto t = static_cast<std::int64_t>(slots.slots.size());
  if (t > m.max_tokens || static_cast<std::int64_t>(keys.size()) != t ||
      (index_slots != nullptr && static_cast<std::int64_t>(index_slots->slots.size()) != t)) {
    throw spec::InvalidInput("slot_mapping", -1, std::to_string(t),
                             "expected at most " + std::to_string(m.max_tokens) +
                                 " tokens, one generator key and one index slot per token");
  }
  std::vector<CompareTile> tiles;
  for (const BufferByteRange& r : compared) {
    if (r.buffer < 0 || r.buffer >= kMaxBuffers) {
      throw spec::InvalidInput("compared", -1, std::to_string(r.buffer),
                               "expected a buffer index below " + std::to_string(kMaxBuffers));
    }
    append_tiles(tiles, r.buffer, r.begin, r.end);
  }
  // One upload: [keys | slots | index slots | tiles], each part 256-byte aligned.
  const auto aligned = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::vector<std::uint8_t> s = detail::slot_storage(slots);
  const std::vector<std::uint8_t> is =
      index_slots != nullptr ? detail::slot_storage(*index_slots) : std::vector<std::uint8_t>{};
  const std::size_t at_slots = aligned(keys.size_bytes());
  const std::size_t at_index = at_slots + aligned(s.size());
  const std::size_t at_tiles = at_index + aligned(is.size());
  const std::size_t total = at_tiles + tiles.size() * sizeof(CompareTile);
  // The previous step's launches read the staged bytes until the stream is done with them.
  check_cuda(cudaStreamSynchronize(m.stream), "resident step");
  m.reserve_pinned(total);
  std::memcpy(m.pinned, keys.data(), keys.size_bytes());
  std::memcpy(m.pinned + at_slots, s.data(), s.size());
  if (!is.empty()) std::memcpy(m.pinned + at_index, is.data(), is.size());
  if (!tiles.empty())
    std::memcpy(m.pinned + at_tiles, tiles.data(), tiles.size() * sizeof(CompareTile));
  if (m.staged.size() < total) m.staged = DeviceBuffer(total);
  check_cuda(cudaMemcpyAsync(m.staged.data(), m.pinned, total, cudaMemcpyHostToDevice, m.stream),
             "cudaMemcpyAsync(resident step)");
  m.tokens = t;
  m.keys_d = m.staged.as<const GeneratedRowKey>();
  m.slots_d = m.staged.data() + at_slots;
  m.index_slots_d = index_slots != nullptr ? m.staged.data() + at_index : nullptr;
  m.step_tiles_d = reinterpret_cast<const CompareTile*>(m.staged.data() + at_tiles);
  m.step_tiles = static_cast<std::int64_t>(tiles.size());
  if (m.all_layers) m.generate_layers(0, m.layers.size());
}

void ResidentReplay::generate(std::size_t li) {
  Impl& m = *impl_;
  if (m.all_layers) return;  // stage_step generated every layer
  m.generate_layers(li, 1);
}

void ResidentReplay::write(std::size_t li, std::size_t copy, const DeviceWriteFunction& fn) {
  Impl& m = *impl_;
  DeviceWriteCall& call = m.calls.at(copy).at(li);
  std::uint8_t* in =
      m.inputs.data() + (m.all_layers ? static_cast<std::int64_t>(li) : 0) * m.input_stride;
  call.k.data = in;
  call.v.data = in + m.kv_input_bytes;
  call.k.shape[0] = call.v.shape[0] = m.tokens;
  if (call.kind == spec::LayerKind::kSparse) {
    call.index_k.data = in + 2 * m.kv_input_bytes;
    call.index_k.shape[0] = m.tokens;
  }
  call.slot_mapping.data = m.slots_d;
  call.slot_mapping.shape[0] = m.tokens;
  const bool index_slots = call.kind == spec::LayerKind::kSparse && m.index_slots_d != nullptr;
  call.index_slot_mapping.data = index_slots ? m.index_slots_d : nullptr;
  call.index_slot_mapping.shape[0] = index_slots ? m.tokens : 0;
  fn(call);
}

std::vector<ResidentDifference> ResidentReplay::compare(std::size_t copy, bool whole) {
  Impl& m = *impl_;
  const auto layers = static_cast<unsigned>(m.layers.size());
  std::vector<ResidentDifference> out(layers);
  if (layers == 0) return out;
  const std::int64_t tiles = whole ? m.whole_tile_count : m.step_tiles;
  init_results_kernel<<<1, 256, 0, m.stream>>>(m.results.as<CompareResult>(), layers);
  check_cuda(cudaGetLastError(), "init_results_kernel");
  if (tiles > 0) {
    // The largest grid dimension x is 2^31 - 1 tiles (128 TiB a layer): never reached.
    const dim3 grid(static_cast<unsigned>(tiles), layers);
    compare_kernel<<<grid, 256, 0, m.stream>>>(
        m.pointer_tables.at(0).as<const CopyPointers>(),
        m.pointer_tables.at(copy).as<const CopyPointers>(),
        whole ? m.whole_tiles.as<const CompareTile>() : m.step_tiles_d,
        m.results.as<CompareResult>());
    check_cuda(cudaGetLastError(), "compare_kernel");
  }
  check_cuda(cudaMemcpyAsync(m.results_h, m.results.data(), layers * sizeof(CompareResult),
                             cudaMemcpyDeviceToHost, m.stream),
             "cudaMemcpyAsync(compare results to host)");
  check_cuda(cudaStreamSynchronize(m.stream), "the resident step's writes and comparison");
  for (unsigned l = 0; l < layers; ++l) {
    const CompareResult& r = m.results_h[l];
    if (r.count == 0) continue;
    out[l].count = static_cast<std::int64_t>(r.count);
    const auto slot = static_cast<std::int32_t>(r.first >> 56);
    auto at = static_cast<std::int64_t>(r.first & ((1ull << 56) - 1));
    if (slot != kAllocationSlot) {
      out[l] = {out[l].count, slot, at};
      continue;
    }
    // A byte of the allocation: inside a buffer's storage, or in a margin.
    const DeviceCacheMirror& mirror = *m.copies.at(copy).at(l);
    out[l].byte = at;
    for (std::size_t b = 0; b < mirror.buffer_count(); ++b) {
      const std::int64_t from = mirror.storage(b) - mirror.allocation();
      if (at >= from && at < from + mirror.storage_bytes(b)) {
        out[l].buffer = static_cast<std::int32_t>(b);
        out[l].byte = at - from;
      }
    }
  }
  return out;
}

void ResidentReplay::resync(std::size_t li, std::size_t copy) {
  Impl& m = *impl_;
  const DeviceCacheMirror& from = *m.copies.at(0).at(li);
  const DeviceCacheMirror& to = *m.copies.at(copy).at(li);
  check_cuda(cudaMemcpyAsync(to.allocation(), from.allocation(),
                             static_cast<std::size_t>(from.allocation_bytes()),
                             cudaMemcpyDeviceToDevice, m.stream),
             "cudaMemcpyAsync(resync)");
}

void ResidentReplay::download(std::size_t li, std::size_t copy,
                              std::span<const BufferByteRange> ranges, spec::LayerCaches& into) {
  Impl& m = *impl_;
  const DeviceCacheMirror& mirror = *m.copies.at(copy).at(li);
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  // The pages, each once, by buffer and offset.
  std::vector<std::pair<std::int32_t, std::int64_t>> wanted;
  for (const BufferByteRange& r : ranges) {
    const auto b = static_cast<std::size_t>(r.buffer);
    if (r.buffer < 0 || b >= mirror.buffer_count() || b >= into.buffers.size()) continue;
    const std::int64_t end = std::min(mirror.storage_bytes(b), r.end);
    for (std::int64_t q = std::max<std::int64_t>(0, r.begin) / kPage; q * kPage < end; ++q)
      wanted.emplace_back(r.buffer, q * kPage);
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  if (wanted.empty()) return;
  // Gathered on the device into one run of bytes, brought back in one copy.
  std::vector<PageCopy> pages;
  std::vector<std::int32_t> buffers;
  std::int64_t total = 0;
  for (const auto& [b, begin] : wanted) {
    const std::int64_t end =
        std::min(begin + kPage, mirror.storage_bytes(static_cast<std::size_t>(b)));
    pages.push_back({begin, end, total});
    buffers.push_back(b);
    total += end - begin;
  }
  std::vector<const std::uint8_t*> sources;
  for (std::size_t b = 0; b < mirror.buffer_count(); ++b) sources.push_back(mirror.storage(b));
  const DeviceBuffer d_sources(sources);
  const DeviceBuffer d_buffers(buffers);
  const DeviceBuffer d_pages(pages);
  const DeviceBuffer d_out(static_cast<std::size_t>(total));
  gather_pages_kernel<<<static_cast<unsigned>(pages.size()), 256, 0, m.stream>>>(
      d_sources.as<const std::uint8_t* const>(), d_buffers.as<const std::int32_t>(),
      d_pages.as<const PageCopy>(), d_out.data());
  check_cuda(cudaGetLastError(), "gather_pages_kernel");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(total));
  check_cuda(
      cudaMemcpyAsync(bytes.data(), d_out.data(), bytes.size(), cudaMemcpyDeviceToHost, m.stream),
      "cudaMemcpyAsync(resident pages to host)");
  check_cuda(cudaStreamSynchronize(m.stream), "the resident pages' download");
  // Stored a run of consecutive pages at a time.
  for (std::size_t i = 0; i < pages.size();) {
    std::size_t j = i + 1;
    while (j < pages.size() && buffers[j] == buffers[i] && pages[j].begin == pages[j - 1].end) ++j;
    const std::span<const std::uint8_t> run(
        bytes.data() + pages[i].at, static_cast<std::size_t>(pages[j - 1].end - pages[i].begin));
    into.buffers[static_cast<std::size_t>(buffers[i])].storage.store(pages[i].begin, run);
    i = j;
  }
}

void ResidentReplay::synchronize() {
  check_cuda(cudaStreamSynchronize(impl_->stream), "the resident replay's stream");
}

}  // namespace kvo::gpu
