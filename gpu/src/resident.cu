// Layer writes resident on the device (kvo/gpu/resident.hpp): SPEC 8's values generated on the
// device, each layer's copies as DeviceCacheMirrors, comparisons of copies on the device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
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
  bool biased = false;  ///< GeneratedValues::biased: each value round(x + bias)
  float bias = 0.0f;
};
/// A generation launch: up to three tensors of the same rows (a layer's K, V and index-K), for
/// gridDim.y layers: layer y's tensors start `layer_stride` bytes after layer y - 1's.
struct GenLaunch {
  std::uint64_t seed = 0;
  spec::GeneratedValueRule rule;
  const std::int64_t* layers = nullptr;  ///< [gridDim.y] the generator's layer keys
  std::int64_t layer_stride = 0;
  const GeneratedRowKey* keys = nullptr;  ///< [rows]
  const std::uint8_t* zero = nullptr;     ///< [rows] 1: the row is all zero; null: none is
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
      // A zero row (a write case's all-zero source row) is +0: every byte of its code 0.
      const float v = p.zero != nullptr && p.zero[row] != 0
                          ? 0.0f
                          : spec::generated_value(
                                key, p.rule, [](float x) { return detail::round_to_act<A>(x); },
                                [](std::uint32_t bits) { return __uint_as_float(bits); });
      const float biased = g.biased ? detail::round_to_act<A>(v + g.bias) : v;
      // v is rounded already: its narrowing is exact (NaN: the dtype's canonical NaN, as on the
      // CPU).
      if constexpr (A == DType::kBF16) {
        reinterpret_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(biased);
      } else if constexpr (A == DType::kF16) {
        reinterpret_cast<__half*>(out)[i] = __float2half_rn(biased);
      } else {
        reinterpret_cast<float*>(out)[i] = biased;
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

/// Patch i of `patches` stored into the generated rows of every layer of the launch (gridDim.y):
/// tensor t's element (row, element) of layer y at out[t] + y * layer_stride, `act_bytes` a code.
struct PatchLaunch {
  std::uint8_t* out[3] = {nullptr, nullptr, nullptr};  ///< K, V, index-K rows [rows, heads * dim]
  std::int64_t row_elements[3] = {0, 0, 0};
  std::int64_t layer_stride = 0;
  const SourcePatch* patches = nullptr;
  std::int64_t count = 0;
  int act_bytes = 2;
};
__global__ void patch_kernel(PatchLaunch p) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < p.count; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const SourcePatch q = p.patches[i];
    std::uint8_t* at = p.out[q.tensor] + blockIdx.y * p.layer_stride +
                       (q.row * p.row_elements[q.tensor] + q.element) * p.act_bytes;
    for (int b = 0; b < p.act_bytes; ++b) at[b] = static_cast<std::uint8_t>(q.code >> (8 * b));
  }
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
/// A piece [begin, end) of a layer's allocation in a whole comparison whose copy 0 is defined only
/// in part (DefinedCopies::kFirst): compared with copy 0, or (`poisoned`) with the poison of the
/// buffer storage it lies in (`salt`; `first`: the storage offset of `begin`). A layer's pieces
/// are ascending and cover its allocation.
struct WholeSegment {
  std::int64_t begin, end, first;
  std::uint64_t salt;
  std::int32_t poisoned;
};

constexpr int kCompareWords = 4;

/// The differing bytes of [begin, end) (offsets of px and py) noted by the block's threads: 8-byte
/// words where both sides are aligned alike (the mirrors place buffers alike), bytes at the ends.
template <typename Note>
__device__ void compare_bytes(const std::uint8_t* px, const std::uint8_t* py, std::int64_t begin,
                              std::int64_t end, Note&& note) {
  const std::int64_t head = min(end, (begin + 7) / 8 * 8);
  const std::int64_t tail = max(head, end / 8 * 8);
  for (std::int64_t i = begin + threadIdx.x; i < head; i += blockDim.x) {
    if (px[i] != py[i]) note(i);
  }
  // kCompareWords words a thread loaded before any is compared: the loads in flight are what a
  // whole comparison of a huge copy is bound by.
  const auto* wx = reinterpret_cast<const std::uint64_t*>(px);
  const auto* wy = reinterpret_cast<const std::uint64_t*>(py);
  for (std::int64_t w0 = head / 8 + threadIdx.x; w0 < tail / 8;
       w0 += kCompareWords * static_cast<std::int64_t>(blockDim.x)) {
    std::uint64_t d[kCompareWords];
#pragma unroll
    for (int u = 0; u < kCompareWords; ++u) {
      const std::int64_t w = w0 + u * static_cast<std::int64_t>(blockDim.x);
      d[u] = w < tail / 8 ? __ldcs(wx + w) ^ __ldcs(wy + w) : 0;
    }
#pragma unroll
    for (int u = 0; u < kCompareWords; ++u) {
      if (d[u] == 0) continue;
      const std::int64_t w = w0 + u * static_cast<std::int64_t>(blockDim.x);
      for (int k = 0; k < 8; ++k) {
        if ((d[u] >> (8 * k)) & 0xFF) note(8 * w + k);
      }
    }
  }
  for (std::int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    if (px[i] != py[i]) note(i);
  }
}

/// The bytes of [begin, end) of px that differ from the poison of a storage with `salt` whose
/// offset `first` is px + begin (the storage 8-byte aligned, as a salted poison's is), noted.
template <typename Note>
__device__ void compare_poison(const std::uint8_t* px, std::int64_t begin, std::int64_t end,
                               std::uint64_t salt, std::int64_t first, Note&& note) {
  // k = i - begin + first is the storage offset of byte i; words where k is a multiple of 8.
  const std::int64_t shift = first - begin;
  const std::int64_t head = min(end, (first + 7) / 8 * 8 - shift);
  const std::int64_t tail = max(head, (end + shift) / 8 * 8 - shift);
  for (std::int64_t i = begin + threadIdx.x; i < head; i += blockDim.x) {
    if (px[i] != spec::poison_byte(salt, static_cast<std::uint64_t>(i + shift))) note(i);
  }
  const std::int64_t words_end = (tail + shift) / 8;
  for (std::int64_t w0 = (head + shift) / 8 + threadIdx.x; w0 < words_end;
       w0 += kCompareWords * static_cast<std::int64_t>(blockDim.x)) {
    std::uint64_t v[kCompareWords];  // loaded first, as compare_bytes
#pragma unroll
    for (int u = 0; u < kCompareWords; ++u) {
      const std::int64_t w = w0 + u * static_cast<std::int64_t>(blockDim.x);
      v[u] = w < words_end ? __ldcs(reinterpret_cast<const std::uint64_t*>(px + 8 * w - shift)) : 0;
    }
#pragma unroll
    for (int u = 0; u < kCompareWords; ++u) {
      const std::int64_t w = w0 + u * static_cast<std::int64_t>(blockDim.x);
      if (w >= words_end) break;
      const std::uint64_t d = v[u] ^ spec::poison_word(salt, static_cast<std::uint64_t>(w));
      if (d == 0) continue;
      for (int k = 0; k < 8; ++k) {
        if ((d >> (8 * k)) & 0xFF) note(8 * w - shift + k);
      }
    }
  }
  for (std::int64_t i = tail + threadIdx.x; i < end; i += blockDim.x) {
    if (px[i] != spec::poison_byte(salt, static_cast<std::uint64_t>(i + shift))) note(i);
  }
}

/// Block (tile, layer): the differing bytes of the tile between copy a and copy b of the layer.
/// `tiles` null: tile i is [i, i + 1) * kTileBytes of the whole allocation (a whole comparison),
/// read through the layer's pieces when `segments` is given (`segment_first` [layers + 1]: layer
/// l's are segments[segment_first[l] .. segment_first[l + 1])): copy b against copy a or against
/// the poison, piece by piece. Eight blocks an SM (32 registers): a huge copy's comparison is
/// bound by the loads in flight and the poison's hash, not by one block's work.
__global__ void __launch_bounds__(256, 8)
    compare_kernel(const CopyPointers* a, const CopyPointers* b, const CompareTile* tiles,
                   const WholeSegment* segments, const std::int32_t* segment_first,
                   CompareResult* out) {
  const CompareTile t =
      tiles != nullptr
          ? tiles[blockIdx.x]
          : CompareTile{kAllocationSlot, static_cast<std::int64_t>(blockIdx.x) * kTileBytes,
                        static_cast<std::int64_t>(blockIdx.x + 1) * kTileBytes};
  const std::int64_t layer = blockIdx.y;
  const CopyPointers& x = a[layer];
  const CopyPointers& y = b[layer];
  if (t.slot != kAllocationSlot && t.slot >= x.buffers) return;  // a buffer this layer lacks
  const std::int64_t end = min(t.end, x.bytes[t.slot]);
  const std::uint8_t* px = x.p[t.slot];
  const std::uint8_t* py = y.p[t.slot];
  unsigned long long first = ~0ull, count = 0;
  const auto note = [&](std::int64_t at) {
    first = min(first, static_cast<unsigned long long>(at));
    ++count;
  };
  if (segments == nullptr || tiles != nullptr) {
    compare_bytes(px, py, t.begin, end, note);
  } else if (t.begin < end) {
    // The first piece that ends past the tile's start (binary search), then each piece the tile
    // overlaps.
    int lo = segment_first[layer], hi = segment_first[layer + 1];
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (segments[mid].end <= t.begin) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    for (int k = lo; k < segment_first[layer + 1] && segments[k].begin < end; ++k) {
      const WholeSegment sg = segments[k];
      const std::int64_t from = max(sg.begin, t.begin), to = min(sg.end, end);
      if (sg.poisoned != 0) {
        compare_poison(py, from, to, sg.salt, sg.first + (from - sg.begin), note);
      } else {
        compare_bytes(px, py, from, to, note);
      }
    }
  }
  if (count == 0) return;
  atomicMin(&out[layer].first, (static_cast<unsigned long long>(t.slot) << 56) | first);
  atomicAdd(&out[layer].count, count);
}

/// Ranges blockIdx.y, blockIdx.y + gridDim.y, ... of `list` (`ranges` of them) poisoned
/// (PendingPoison: salted 8-byte words, or a fill byte). A huge cache's copy gets one range per run
/// of its table's pages per buffer: past 65,535 (the grid's y limit) the rows stride.
__global__ void pending_poison_kernel(const PendingPoison* list, std::uint64_t ranges) {
  const std::uint64_t start = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t r = blockIdx.y; r < ranges; r += gridDim.y) {
    const PendingPoison q = list[r];
    const auto n = static_cast<std::uint64_t>(q.bytes);
    if (!q.salted) {
      for (std::uint64_t i = start; i < n; i += stride) q.data[i] = q.fill;
      continue;
    }
    const std::uint64_t words = n / 8;
    const auto first = static_cast<std::uint64_t>(q.first);
    for (std::uint64_t w = start; w < words; w += stride)
      reinterpret_cast<std::uint64_t*>(q.data)[w] = spec::poison_word(q.salt, first / 8 + w);
    for (std::uint64_t i = 8 * words + start; i < n; i += stride)
      q.data[i] = spec::poison_byte(q.salt, first + i);
  }
}

__global__ void init_results_kernel(CompareResult* out, unsigned layers) {
  for (unsigned i = threadIdx.x; i < layers; i += blockDim.x) out[i] = {~0ull, 0};
}

/// One page a download brings back: [begin, end) of a buffer's storage (at most kPage bytes), to
/// `at` in the gathered bytes.
struct PageCopy {
  std::int64_t begin, end, at;
};
/// Block i copies page i of buffer storage `src[buffer[i]]` (the listed layers' buffers) into
/// `out` (pinned host memory: 16-byte or 8-byte stores where both sides allow, since each store
/// crosses the bus).
__global__ void gather_pages_kernel(const std::uint8_t* const* src, const std::int32_t* buffer,
                                    const PageCopy* pages, std::uint8_t* out) {
  const PageCopy p = pages[blockIdx.x];
  const std::uint8_t* from = src[buffer[blockIdx.x]] + p.begin;
  std::uint8_t* to = out + p.at;
  const std::int64_t n = p.end - p.begin;
  const auto aligned = [&](std::uintptr_t a) {
    return ((reinterpret_cast<std::uintptr_t>(from) | reinterpret_cast<std::uintptr_t>(to) |
             static_cast<std::uintptr_t>(n)) &
            (a - 1)) == 0;
  };
  if (aligned(16)) {
    for (std::int64_t i = threadIdx.x; i < n / 16; i += blockDim.x)
      reinterpret_cast<uint4*>(to)[i] = reinterpret_cast<const uint4*>(from)[i];
  } else if (aligned(8)) {
    for (std::int64_t i = threadIdx.x; i < n / 8; i += blockDim.x)
      reinterpret_cast<std::uint64_t*>(to)[i] = reinterpret_cast<const std::uint64_t*>(from)[i];
  } else {
    for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) to[i] = from[i];
  }
}

/// The tiles of `ranges` (slot, begin, end), each at most kTileBytes.
void append_tiles(std::vector<CompareTile>& tiles, std::int32_t slot, std::int64_t begin,
                  std::int64_t end) {
  for (std::int64_t at = begin; at < end; at += kTileBytes) {
    tiles.push_back({slot, at, std::min(end, at + kTileBytes)});
  }
}

/// Pinned host memory reused across ResidentReplays (a campaign builds one per case, and
/// cudaMallocHost costs more than a small case): blocks by power-of-two size, kept for the process.
class PinnedPool {
 public:
  static PinnedPool& instance() {
    static PinnedPool* pool = new PinnedPool;  // never destroyed: CUDA may be gone at exit
    return *pool;
  }
  /// A block of at least `bytes` (its size in `capacity`): a free one of the request's
  /// power-of-two size or up to four times it (requests that vary around a size reuse blocks
  /// rather than pin more: pinning memory costs more than the copies it serves), else a new one.
  std::uint8_t* acquire(std::size_t bytes, std::size_t& capacity) {
    capacity = 256;
    while (capacity < bytes) capacity *= 2;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.lower_bound(capacity); it != free_.end() && it->first <= 4 * capacity;
           ++it) {
        if (it->second.empty()) continue;
        std::uint8_t* p = it->second.back();
        it->second.pop_back();
        capacity = it->first;
        return p;
      }
    }
    void* p = nullptr;
    check_cuda(cudaMallocHost(&p, capacity), "cudaMallocHost(resident staging)");
    return static_cast<std::uint8_t*>(p);
  }
  void release(std::uint8_t* p, std::size_t capacity) {
    if (p == nullptr) return;
    const std::lock_guard<std::mutex> lock(mu_);
    free_[capacity].push_back(p);
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::vector<std::uint8_t*>> free_;
};

std::string gib(std::int64_t v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(v) / (1ll << 30));
  return text;
}

/// Each buffer's runs of `defined` (indexed by BufferByteRange::buffer) rounded out to whole
/// ResidentReplay pages, ascending, disjoint and not adjacent: the same for every layer and copy,
/// found once (a huge cache's table names thousands of blocks).
using PageRuns = std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>>;
PageRuns page_runs(std::span<const BufferByteRange> defined) {
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  PageRuns runs;
  for (const BufferByteRange& r : defined) {
    if (r.buffer < 0) continue;
    const std::int64_t from = std::max<std::int64_t>(0, r.begin) / kPage * kPage;
    const std::int64_t to = (r.end + kPage - 1) / kPage * kPage;
    if (from >= to) continue;
    if (runs.size() <= static_cast<std::size_t>(r.buffer)) runs.resize(r.buffer + 1);
    runs[static_cast<std::size_t>(r.buffer)].emplace_back(from, to);
  }
  for (auto& pages : runs) {
    if (!std::is_sorted(pages.begin(), pages.end())) std::sort(pages.begin(), pages.end());
    std::size_t kept = 0;
    for (const auto& [from, to] : pages) {
      if (kept > 0 && from <= pages[kept - 1].second) {
        pages[kept - 1].second = std::max(pages[kept - 1].second, to);  // overlapping or adjacent
      } else {
        pages[kept++] = {from, to};
      }
    }
    pages.resize(kept);
  }
  return runs;
}

/// The pending poison of `mirror`'s lazy buffers limited to `runs` (page_runs): each salted entry
/// over a whole buffer storage becomes one per run of that buffer. `limited`, when given, receives
/// the salt of each buffer so limited (by buffer index; 0 and `has` false for the others).
struct LimitedBuffers {
  std::vector<std::uint64_t> salt;
  std::vector<bool> has;
};
void limit_poison(const DeviceCacheMirror& mirror, const PageRuns& runs,
                  std::vector<PendingPoison>& pending, LimitedBuffers* limited = nullptr) {
  if (limited != nullptr) {
    limited->salt.assign(mirror.buffer_count(), 0);
    limited->has.assign(mirror.buffer_count(), false);
  }
  std::vector<PendingPoison> out;
  for (const PendingPoison& q : pending) {
    std::size_t b = mirror.buffer_count();
    for (std::size_t i = 0; i < mirror.buffer_count(); ++i) {
      if (q.salted && q.data == mirror.storage(i) && q.bytes == mirror.storage_bytes(i)) b = i;
    }
    if (b == mirror.buffer_count()) {
      out.push_back(q);
      continue;
    }
    if (limited != nullptr) {
      limited->salt[b] = q.salt;
      limited->has[b] = true;
    }
    if (b >= runs.size()) continue;
    for (const auto& [from, end] : runs[b]) {
      const std::int64_t to = std::min(q.bytes, end);
      if (from < to) out.push_back({q.data + from, to - from, q.salt, 0, true, from});
    }
  }
  pending = std::move(out);
}

/// The pieces of a whole comparison of `mirror`'s allocation (copy 0 of a layer, its `limited`
/// buffers defined over `runs` alone): inside a limited buffer, its runs against copy 0 and the
/// rest against the buffer's poison; everything else (margins, pads, the other buffers) against
/// copy 0.
std::vector<WholeSegment> whole_segments(const DeviceCacheMirror& mirror, const PageRuns& runs,
                                         const LimitedBuffers& limited) {
  std::vector<WholeSegment> out;
  std::int64_t at = 0;  // allocation offset covered so far
  const auto against_copy = [&](std::int64_t to) {
    if (to > at) out.push_back({at, to, 0, 0, 0});
    at = std::max(at, to);
  };
  std::vector<std::size_t> order;
  for (std::size_t b = 0; b < mirror.buffer_count(); ++b) {
    if (limited.has[b]) order.push_back(b);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t x, std::size_t y) { return mirror.storage(x) < mirror.storage(y); });
  for (const std::size_t b : order) {
    const std::int64_t start = mirror.storage(b) - mirror.allocation();
    const std::int64_t size = mirror.storage_bytes(b);
    against_copy(start);
    std::int64_t k = 0;  // storage offset covered so far
    const auto poisoned = [&](std::int64_t to) {
      if (to > k) out.push_back({start + k, start + to, k, limited.salt[b], 1});
    };
    if (b < runs.size()) {
      for (const auto& [from, end] : runs[b]) {
        const std::int64_t lo = std::min(from, size), hi = std::min(end, size);
        if (lo >= hi) continue;
        poisoned(lo);
        out.push_back({start + lo, start + hi, 0, 0, 0});
        k = hi;
      }
    }
    poisoned(size);
    at = start + size;
  }
  against_copy(mirror.allocation_bytes());
  return out;
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
  const bool biased = values.biased && tensor >= 0 && tensor < 3;
  p.t[0] = {d_out.data(), tensor, heads,
            dim,          biased, biased ? values.bias[static_cast<std::size_t>(tensor)] : 0.0f};
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
  /// The fixed tables, uploaded once: per copy the pointer table of every layer ([copies, layers]
  /// CopyPointers), the K and V scales [layers, scale_count] f32, the generator's layer keys
  /// [layers] int64, the mirrors' pending poison.
  DeviceBuffer tables;
  const CopyPointers* pointer_tables = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  std::int64_t scale_count = 1;
  const std::int64_t* layer_ids = nullptr;
  // The staged step.
  std::int64_t tokens = 0;                  ///< T: the slot mappings' rows
  std::int64_t source_rows = 0;             ///< T_src: the generated rows
  const GeneratedRowKey* keys_d = nullptr;  ///< [source_rows], in `staged`
  const std::uint8_t* zero_d = nullptr;     ///< [source_rows] zero-row flags, or null
  const SourcePatch* patches_d = nullptr;   ///< [patch_count], in `staged`
  std::int64_t patch_count = 0;
  std::uint8_t* slots_d = nullptr;        ///< [tokens] slot type, in `staged`
  std::uint8_t* index_slots_d = nullptr;  ///< [tokens] (separate_index_slots), or null
  /// The generated inputs: per layer (all layers at once where they fit in
  /// kAllLayersInputBytes, else one slot reused layer after layer) K [max_tokens, nkv, hd], V the
  /// same, index-K [max_tokens, index_dim], `input_stride` bytes a layer.
  DeviceBuffer inputs;
  std::int64_t input_stride = 0, kv_input_bytes = 0;
  bool all_layers = false;
  /// Per copy and layer, the call its writer receives (inputs and T set per step).
  std::vector<std::vector<DeviceWriteCall>> calls;
  /// The staged step's upload: keys, slots, index slots and its comparison's tiles, from pinned
  /// host memory in one copy.
  std::uint8_t* pinned = nullptr;  ///< from PinnedPool
  std::size_t pinned_bytes = 0;
  /// The layer whose inputs are in the input slot (-1: none; every layer's when all_layers).
  std::int64_t generated = -1;
  bool staged_before = false;  ///< a step was staged: its upload may still read `pinned`
  /// The tables' upload (its own pinned block: the first step's staging does not wait for it).
  std::uint8_t* tables_pinned = nullptr;
  std::size_t tables_pinned_bytes = 0;
  DeviceBuffer staged;
  std::int64_t step_tiles = 0;
  const CompareTile* step_tiles_d = nullptr;
  std::int64_t whole_tile_count = 0;
  /// DefinedCopies::kFirst: the pieces of every layer's whole comparison (WholeSegment), layer
  /// l's at segment_first[l] .. segment_first[l + 1] ([layers + 1]), in `tables`; else null.
  const WholeSegment* segments = nullptr;
  const std::int32_t* segment_first = nullptr;
  DeviceBuffer results;                ///< [layers] CompareResult
  CompareResult* results_h = nullptr;  ///< pinned [layers], from PinnedPool
  std::size_t results_capacity = 0;

  /// Generates the inputs of layers [first, first + count) of the staged step, layer first + y
  /// into input slot y.
  void generate_layers(std::size_t first, std::size_t count) {
    const spec::CacheGeometry& g = config.geometry;
    GenLaunch p;
    p.seed = values.seed;
    p.rule = values.rule;
    p.layers = layer_ids + first;
    p.layer_stride = input_stride;
    p.keys = keys_d;
    p.zero = zero_d;
    p.rows = source_rows;
    // The tensor fields are reference::GenTensor's: K 0, V 1, index-K 2 (generated for every
    // layer of the launch: a dense layer's is not read).
    const bool b = values.biased;
    p.t[0] = {inputs.data(), 0, g.num_kv_heads, g.head_dim, b, values.bias[0]};
    p.t[1] = {inputs.data() + kv_input_bytes, 1, g.num_kv_heads, g.head_dim, b, values.bias[1]};
    p.count = 2;
    const bool sparse =
        std::find(kinds.begin(), kinds.end(), spec::LayerKind::kSparse) != kinds.end();
    if (sparse) {
      p.t[p.count++] = {inputs.data() + 2 * kv_input_bytes, 2, 1, g.index_dim, b, values.bias[2]};
    }
    launch_generate(values.act, p, static_cast<unsigned>(count), stream);
    if (patch_count == 0) return;
    PatchLaunch q;
    q.out[0] = static_cast<std::uint8_t*>(p.t[0].out);
    q.out[1] = static_cast<std::uint8_t*>(p.t[1].out);
    q.out[2] = sparse ? inputs.data() + 2 * kv_input_bytes : nullptr;
    q.row_elements[0] = q.row_elements[1] = g.num_kv_heads * g.head_dim;
    q.row_elements[2] = g.index_dim;
    q.layer_stride = input_stride;
    q.patches = patches_d;
    q.count = patch_count;
    q.act_bytes = static_cast<int>(spec::dtype_bytes(values.act));
    const dim3 grid(static_cast<unsigned>(std::min<std::int64_t>((patch_count + 255) / 256, 256)),
                    static_cast<unsigned>(count));
    patch_kernel<<<grid, 256, 0, stream>>>(q);
    check_cuda(cudaGetLastError(), "patch_kernel");
  }

  /// The bytes of `ranges` of copy `copy` of each listed layer (indices into `layers`), rounded out
  /// to whole pages: one gather and one copy back for all of them, not waited for.
  std::unique_ptr<PagesInFlight> gather(std::size_t copy, std::span<const std::size_t> layers,
                                        std::span<const BufferByteRange> ranges);
  /// The pages `like` lists, of copy `copy`, gathered again.
  std::unique_ptr<PagesInFlight> gather_again(std::size_t copy, const PagesInFlight::State& like);
  /// Launches the gather of st's pages into pinned memory (st.pinned), recording st.copied.
  void launch_gather(PagesInFlight::State& st);
  /// Device buffers a launch not yet waited for reads (a gather's tables and bytes): kept until
  /// the stream is next waited for.
  std::vector<DeviceBuffer> in_flight;
  /// Waits for the stream (a CUDA error: spec::FailedToRun naming `what`).
  void wait(const char* what) {
    check_cuda(cudaStreamSynchronize(stream), what);
    in_flight.clear();
  }

  /// Pinned host memory of at least `bytes` (its old contents dropped).
  void reserve_pinned(std::size_t bytes) {
    if (bytes <= pinned_bytes) return;
    PinnedPool::instance().release(pinned, pinned_bytes);
    pinned = nullptr;
    pinned = PinnedPool::instance().acquire(bytes, pinned_bytes);
  }
  ~Impl() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    PinnedPool::instance().release(pinned, pinned_bytes);
    PinnedPool::instance().release(tables_pinned, tables_pinned_bytes);
    PinnedPool::instance().release(reinterpret_cast<std::uint8_t*>(results_h), results_capacity);
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
                               const GeneratedValues& values,
                               const std::vector<std::vector<float>>& k_scale,
                               const std::vector<std::vector<float>>& v_scale,
                               std::int64_t max_tokens, std::span<const BufferByteRange> defined,
                               DefinedCopies limits)
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
  const std::size_t layer_count = m.layers.size();
  // The scales: one set for every layer, or one per layer, each [1] or [nkv].
  const bool per_layer = k_scale.size() == layer_count && layer_count > 1;
  m.scale_count = k_scale.empty() ? 0 : static_cast<std::int64_t>(k_scale.front().size());
  const bool scales_ok =
      (k_scale.size() == 1 || k_scale.size() == layer_count) && v_scale.size() == k_scale.size() &&
      m.scale_count > 0 &&
      std::all_of(
          k_scale.begin(), k_scale.end(),
          [&](const std::vector<float>& s) { return s.size() == k_scale.front().size(); }) &&
      std::all_of(v_scale.begin(), v_scale.end(),
                  [&](const std::vector<float>& s) { return s.size() == k_scale.front().size(); });
  if (!scales_ok) {
    throw spec::InvalidInput("k_scale", -1, std::to_string(k_scale.size()),
                             "expected K and V scales ([1] or [nkv], one length) for every layer "
                             "or one set for all " +
                                 std::to_string(layer_count) + " layers");
  }
  const std::int64_t needed = device_bytes_needed(config, initial, copies);
  // A small set is not worth asking the driver about (cudaMemGetInfo costs more than a small
  // case); an allocation that still fails is FailedToRun from the pool.
  if (needed >= (std::int64_t{256} << 20)) {
    std::size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    // What this thread's pool holds idle (a resident campaign's kept copies of earlier cases)
    // is free to it. The inputs, tables and tiles are small next to the caches; a sixteenth is
    // left to them.
    free_bytes += detail::pool_idle_bytes();
    if (needed > static_cast<std::int64_t>(free_bytes) / 16 * 15) {
      throw spec::FailedToRun("the caches resident on the device need " + gib(needed) + " (" +
                              std::to_string(initial.size()) + " layers x " +
                              std::to_string(copies) + " copies) and the device has " +
                              gib(static_cast<std::int64_t>(free_bytes)) +
                              " free (what this thread's memory pool holds idle included) of " +
                              gib(static_cast<std::int64_t>(total_bytes)) +
                              ": replay fewer layers (--layers) or subjects (--subject)");
    }
  }
  m.stream = detail::call_stream();
  for (const spec::LayerCaches& c : initial) m.kinds.push_back(c.kind);
  // The mirrors: their poison pending (one launch below) where nothing of theirs is held on the
  // host; what is (dense buffers, held pages) is copied as they are made, on the legacy stream.
  std::vector<PendingPoison> pending;
  bool copied = false;
  for (const spec::LayerCaches& caches : initial) {
    for (const spec::CacheBuffer& b : caches.buffers) copied |= !b.storage.nothing_held();
  }
  const PageRuns runs = page_runs(defined);
  const bool first_only = limits == DefinedCopies::kFirst && !defined.empty();
  std::vector<WholeSegment> segments;
  std::vector<std::int32_t> segment_first;
  std::vector<CopyPointers> table;
  m.copies.resize(copies);
  for (std::size_t c = 0; c < copies; ++c) {
    for (const spec::LayerCaches& caches : initial) {
      auto mirror = std::make_unique<DeviceCacheMirror>(config, caches, &pending);
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
      if (first_only && c == 0) {
        LimitedBuffers limited;
        limit_poison(*mirror, runs, pending, &limited);
        segment_first.push_back(static_cast<std::int32_t>(segments.size()));
        const std::vector<WholeSegment> pieces = whole_segments(*mirror, runs, limited);
        segments.insert(segments.end(), pieces.begin(), pieces.end());
      } else if (!defined.empty() && !first_only) {
        limit_poison(*mirror, runs, pending);
      }
      m.copies[c].push_back(std::move(mirror));
    }
  }
  std::vector<float> k, v;
  for (std::size_t li = 0; li < layer_count; ++li) {
    const std::size_t from = per_layer ? li : 0;
    k.insert(k.end(), k_scale[from].begin(), k_scale[from].end());
    v.insert(v.end(), v_scale[from].begin(), v_scale[from].end());
  }
  std::int64_t most = 0, most_poison = 0;
  for (const auto& mirror : m.copies.front()) most = std::max(most, mirror->allocation_bytes());
  for (const PendingPoison& q : pending) most_poison = std::max(most_poison, q.bytes);
  // A whole comparison's tiles are implicit (compare_kernel without a list): as many as the
  // largest allocation has kTileBytes pieces.
  m.whole_tile_count = (most + kTileBytes - 1) / kTileBytes;
  if (first_only) segment_first.push_back(static_cast<std::int32_t>(segments.size()));
  // One upload: [pointer tables | K scales | V scales | layer keys | poison list | whole
  // comparison pieces | their first per layer], each part 256-byte aligned.
  const auto aligned = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::size_t parts[] = {table.size() * sizeof(CopyPointers),
                               k.size() * sizeof(float),
                               v.size() * sizeof(float),
                               m.layers.size() * sizeof(std::int64_t),
                               pending.size() * sizeof(PendingPoison),
                               segments.size() * sizeof(WholeSegment),
                               segment_first.size() * sizeof(std::int32_t)};
  const void* sources[] = {table.data(),        k.data(),       v.data(),
                           m.layers.data(),     pending.data(), segments.data(),
                           segment_first.data()};
  constexpr int kParts = 7;
  std::size_t at[kParts], total = 0;
  for (int i = 0; i < kParts; ++i) {
    at[i] = total;
    total += aligned(parts[i]);
  }
  m.tables_pinned = PinnedPool::instance().acquire(total, m.tables_pinned_bytes);
  for (int i = 0; i < kParts; ++i) {
    if (parts[i] > 0) std::memcpy(m.tables_pinned + at[i], sources[i], parts[i]);
  }
  m.tables = DeviceBuffer(std::max<std::size_t>(total, 1));
  check_cuda(
      cudaMemcpyAsync(m.tables.data(), m.tables_pinned, total, cudaMemcpyHostToDevice, m.stream),
      "cudaMemcpyAsync(resident tables)");
  m.pointer_tables = reinterpret_cast<const CopyPointers*>(m.tables.data() + at[0]);
  m.k_scale = reinterpret_cast<float*>(m.tables.data() + at[1]);
  m.v_scale = reinterpret_cast<float*>(m.tables.data() + at[2]);
  m.layer_ids = reinterpret_cast<const std::int64_t*>(m.tables.data() + at[3]);
  if (first_only) {
    m.segments = reinterpret_cast<const WholeSegment*>(m.tables.data() + at[5]);
    m.segment_first = reinterpret_cast<const std::int32_t*>(m.tables.data() + at[6]);
  }
  if (!pending.empty()) {
    const dim3 grid(
        static_cast<unsigned>(std::min<std::int64_t>((most_poison / 8 + 255) / 256 + 1, 1024)),
        static_cast<unsigned>(std::min<std::size_t>(pending.size(), 65535)));
    pending_poison_kernel<<<grid, 256, 0, m.stream>>>(
        reinterpret_cast<const PendingPoison*>(m.tables.data() + at[4]), pending.size());
    check_cuda(cudaGetLastError(), "pending_poison_kernel");
  }
  const spec::CacheGeometry& g = config.geometry;
  const std::size_t act = spec::dtype_bytes(config.act_dtype);
  const auto rows = static_cast<std::size_t>(m.max_tokens);
  m.kv_input_bytes = aligned(rows * act * static_cast<std::size_t>(g.num_kv_heads * g.head_dim));
  m.input_stride =
      2 * m.kv_input_bytes +
      static_cast<std::int64_t>(
          aligned(rows * act * static_cast<std::size_t>(std::max<std::int64_t>(g.index_dim, 1))));
  const auto layers_total = static_cast<std::int64_t>(layer_count);
  m.all_layers = layers_total * m.input_stride <= kAllLayersInputBytes;
  m.inputs = DeviceBuffer(static_cast<std::size_t>(
      (m.all_layers ? std::max<std::int64_t>(layers_total, 1) : 1) * m.input_stride));
  // The calls: everything but the inputs' pointers and T is fixed for the replay.
  const ElementType act_type = element_type_of(config.act_dtype);
  const ElementType slot_type =
      config.slot_type == spec::SlotType::kI32 ? ElementType::kI32 : ElementType::kI64;
  m.calls.resize(copies);
  for (std::size_t c = 0; c < copies; ++c) {
    for (std::size_t li = 0; li < layer_count; ++li) {
      DeviceWriteCall call;
      call.config = &m.config;
      call.kind = m.kinds[li];
      call.k = contiguous_tensor(nullptr, act_type, {0, g.num_kv_heads, g.head_dim});
      call.v = contiguous_tensor(nullptr, act_type, {0, g.num_kv_heads, g.head_dim});
      if (call.kind == spec::LayerKind::kSparse)
        call.index_k = contiguous_tensor(nullptr, act_type, {0, g.index_dim});
      call.slot_mapping = contiguous_tensor(nullptr, slot_type, {0});
      call.index_slot_mapping = contiguous_tensor(nullptr, slot_type, {0});
      const auto first = static_cast<std::int64_t>(li) * m.scale_count;
      call.k_scale = contiguous_tensor(m.k_scale + first, ElementType::kF32, {m.scale_count});
      call.v_scale = contiguous_tensor(m.v_scale + first, ElementType::kF32, {m.scale_count});
      call.caches = m.copies[c][li]->views();
      call.stream = m.stream;
      m.calls[c].push_back(std::move(call));
    }
  }
  m.results = DeviceBuffer(std::max<std::size_t>(layer_count, 1) * sizeof(CompareResult));
  m.results_h = reinterpret_cast<CompareResult*>(PinnedPool::instance().acquire(
      std::max<std::size_t>(layer_count, 1) * sizeof(CompareResult), m.results_capacity));
  // What the mirrors copied on the legacy stream is done before this stream's work reads it.
  if (copied) check_cuda(cudaDeviceSynchronize(), "resident caches");
}

ResidentReplay::~ResidentReplay() = default;

std::int64_t ResidentReplay::device_bytes() const { return impl_->device_bytes; }

void ResidentReplay::stage_step(std::span<const GeneratedRowKey> keys,
                                const spec::SlotMapping& slots,
                                const spec::SlotMapping* index_slots,
                                std::span<const BufferByteRange> compared,
                                std::span<const std::int64_t> zero_rows,
                                std::span<const SourcePatch> patches) {
  Impl& m = *impl_;
  const auto t = static_cast<std::int64_t>(slots.slots.size());
  const auto rows = static_cast<std::int64_t>(keys.size());
  if (rows > m.max_tokens || rows < t ||
      (index_slots != nullptr && static_cast<std::int64_t>(index_slots->slots.size()) != t)) {
    throw spec::InvalidInput("slot_mapping", -1, std::to_string(t),
                             "expected at most " + std::to_string(m.max_tokens) +
                                 " source rows, a generator key for each token's and one index "
                                 "slot per token");
  }
  std::vector<std::uint8_t> zero;
  if (!zero_rows.empty()) {
    zero.assign(static_cast<std::size_t>(rows), 0);
    for (const std::int64_t r : zero_rows) {
      if (r < 0 || r >= rows) {
        throw spec::InvalidInput("zero_rows", -1, std::to_string(r),
                                 "expected a source row in [0, " + std::to_string(rows) + ")");
      }
      zero[static_cast<std::size_t>(r)] = 1;
    }
  }
  const spec::CacheGeometry& g = m.config.geometry;
  const std::int64_t row_elements[3] = {g.num_kv_heads * g.head_dim, g.num_kv_heads * g.head_dim,
                                        g.index_dim};
  for (const SourcePatch& q : patches) {
    if (q.tensor < 0 || q.tensor > 2 || q.row < 0 || q.row >= rows || q.element < 0 ||
        q.element >= row_elements[q.tensor]) {
      throw spec::InvalidInput("patches", -1, std::to_string(q.tensor),
                               "expected a patch of tensor 0..2 inside its generated rows");
    }
  }
  std::vector<CompareTile> tiles;
  for (const BufferByteRange& r : compared) {
    if (r.buffer < 0 || r.buffer >= kMaxBuffers) {
      throw spec::InvalidInput("compared", -1, std::to_string(r.buffer),
                               "expected a buffer index below " + std::to_string(kMaxBuffers));
    }
    append_tiles(tiles, r.buffer, r.begin, r.end);
  }
  // One upload: [keys | slots | index slots | zero rows | patches | tiles], each part 256-byte
  // aligned.
  const auto aligned = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::vector<std::uint8_t> s = detail::slot_storage(slots);
  const std::vector<std::uint8_t> is =
      index_slots != nullptr ? detail::slot_storage(*index_slots) : std::vector<std::uint8_t>{};
  const std::size_t at_slots = aligned(keys.size_bytes());
  const std::size_t at_index = at_slots + aligned(s.size());
  const std::size_t at_zero = at_index + aligned(is.size());
  const std::size_t at_patches = at_zero + aligned(zero.size());
  const std::size_t at_tiles = at_patches + aligned(patches.size_bytes());
  const std::size_t total = at_tiles + tiles.size() * sizeof(CompareTile);
  // The previous step's launches read the staged bytes until the stream is done with them.
  if (m.staged_before) m.wait("resident step");
  m.staged_before = true;
  m.reserve_pinned(total);
  std::memcpy(m.pinned, keys.data(), keys.size_bytes());
  std::memcpy(m.pinned + at_slots, s.data(), s.size());
  if (!is.empty()) std::memcpy(m.pinned + at_index, is.data(), is.size());
  if (!zero.empty()) std::memcpy(m.pinned + at_zero, zero.data(), zero.size());
  if (!patches.empty()) std::memcpy(m.pinned + at_patches, patches.data(), patches.size_bytes());
  if (!tiles.empty())
    std::memcpy(m.pinned + at_tiles, tiles.data(), tiles.size() * sizeof(CompareTile));
  if (m.staged.size() < total) m.staged = DeviceBuffer(total);
  check_cuda(cudaMemcpyAsync(m.staged.data(), m.pinned, total, cudaMemcpyHostToDevice, m.stream),
             "cudaMemcpyAsync(resident step)");
  m.tokens = t;
  m.source_rows = rows;
  m.keys_d = m.staged.as<const GeneratedRowKey>();
  m.zero_d = zero.empty() ? nullptr : m.staged.data() + at_zero;
  m.patches_d = reinterpret_cast<const SourcePatch*>(m.staged.data() + at_patches);
  m.patch_count = static_cast<std::int64_t>(patches.size());
  m.slots_d = m.staged.data() + at_slots;
  m.index_slots_d = index_slots != nullptr ? m.staged.data() + at_index : nullptr;
  m.step_tiles_d = reinterpret_cast<const CompareTile*>(m.staged.data() + at_tiles);
  m.step_tiles = static_cast<std::int64_t>(tiles.size());
  m.generated = -1;
  if (m.all_layers) m.generate_layers(0, m.layers.size());
}

void ResidentReplay::write(std::size_t li, std::size_t copy, const DeviceWriteFunction& fn) {
  Impl& m = *impl_;
  DeviceWriteCall& call = m.calls.at(copy).at(li);
  // Every writer of a layer reads the same inputs: generated once while the writers follow one
  // another on the layer, again when another layer's came between (stage_step generated every
  // layer's at once where they fit).
  if (!m.all_layers && m.generated != static_cast<std::int64_t>(li)) {
    m.generate_layers(li, 1);
    m.generated = static_cast<std::int64_t>(li);
  }
  std::uint8_t* in =
      m.inputs.data() + (m.all_layers ? static_cast<std::int64_t>(li) : 0) * m.input_stride;
  call.k.data = in;
  call.v.data = in + m.kv_input_bytes;
  call.k.shape[0] = call.v.shape[0] = m.source_rows;
  if (call.kind == spec::LayerKind::kSparse) {
    call.index_k.data = in + 2 * m.kv_input_bytes;
    call.index_k.shape[0] = m.source_rows;
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
    compare_kernel<<<grid, 256, 0, m.stream>>>(m.pointer_tables, m.pointer_tables + copy * layers,
                                               whole ? nullptr : m.step_tiles_d, m.segments,
                                               m.segment_first, m.results.as<CompareResult>());
    check_cuda(cudaGetLastError(), "compare_kernel");
  }
  check_cuda(cudaMemcpyAsync(m.results_h, m.results.data(), layers * sizeof(CompareResult),
                             cudaMemcpyDeviceToHost, m.stream),
             "cudaMemcpyAsync(compare results to host)");
  m.wait("the resident step's writes and comparison");
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
  if (m.segments != nullptr) {
    throw spec::InvalidInput("copy", -1, std::to_string(copy),
                             "copy 0 is defined only over the replay's defined ranges "
                             "(DefinedCopies::kFirst): it cannot be resynced from");
  }
  const DeviceCacheMirror& from = *m.copies.at(0).at(li);
  const DeviceCacheMirror& to = *m.copies.at(copy).at(li);
  check_cuda(cudaMemcpyAsync(to.allocation(), from.allocation(),
                             static_cast<std::size_t>(from.allocation_bytes()),
                             cudaMemcpyDeviceToDevice, m.stream),
             "cudaMemcpyAsync(resync)");
}

/// What a PagesInFlight holds: the gathered pages in pinned host memory (`at` their offsets there)
/// once `copied` has completed, each with its source (a layer of the request and a buffer).
struct PagesInFlight::State {
  std::uint8_t* pinned = nullptr;  ///< from PinnedPool
  std::size_t capacity = 0;
  std::int64_t total = 0;
  cudaEvent_t copied = nullptr;
  struct Source {
    std::size_t layer, buffer;
  };
  std::vector<Source> sources;
  std::vector<const std::uint8_t*> source_storage;  ///< each source's storage on the device
  std::vector<PageCopy> pages;                      ///< ascending by source, then offset
  std::vector<std::int32_t> page_of;                ///< each page's source
  /// Per layer index, its pages [first, end) (a layer's sources are consecutive).
  std::vector<std::pair<std::size_t, std::size_t>> layer_pages;
  ~State() {
    if (copied != nullptr) {
      cudaEventSynchronize(copied);  // the copy may still write the pinned block
      cudaEventDestroy(copied);
    }
    PinnedPool::instance().release(pinned, capacity);
  }
};

PagesInFlight::PagesInFlight(std::unique_ptr<State> state) : state_(std::move(state)) {}

PagesInFlight::~PagesInFlight() = default;

std::int64_t PagesInFlight::bytes() const { return state_->total; }

void PagesInFlight::store(std::size_t li, spec::LayerCaches& into) const {
  const State& st = *state_;
  if (st.copied != nullptr)
    check_cuda(cudaEventSynchronize(st.copied), "the resident pages' copy to the host");
  if (li >= st.layer_pages.size()) return;
  // Stored a run of consecutive pages at a time.
  const auto [first, end] = st.layer_pages[li];
  for (std::size_t i = first; i < end;) {
    std::size_t j = i + 1;
    while (j < end && st.page_of[j] == st.page_of[i] && st.pages[j].begin == st.pages[j - 1].end)
      ++j;
    const std::span<const std::uint8_t> run(
        st.pinned + st.pages[i].at,
        static_cast<std::size_t>(st.pages[j - 1].end - st.pages[i].begin));
    into.buffers[st.sources[static_cast<std::size_t>(st.page_of[i])].buffer].storage.store(
        st.pages[i].begin, run);
    i = j;
  }
}

bool PagesInFlight::same_as(std::size_t li, const spec::LayerCaches& caches) const {
  const State& st = *state_;
  if (st.copied != nullptr)
    check_cuda(cudaEventSynchronize(st.copied), "the resident pages' copy to the host");
  if (li >= st.layer_pages.size()) return true;
  const auto [first, end] = st.layer_pages[li];
  for (std::size_t i = first; i < end; ++i) {
    const PageCopy& p = st.pages[i];
    const spec::ByteStorage& storage =
        caches.buffers.at(st.sources[static_cast<std::size_t>(st.page_of[i])].buffer).storage;
    if (std::memcmp(storage.data() + p.begin, st.pinned + p.at,
                    static_cast<std::size_t>(p.end - p.begin)) != 0)
      return false;
  }
  return true;
}

void ResidentReplay::download(std::size_t li, std::size_t copy,
                              std::span<const BufferByteRange> ranges, spec::LayerCaches& into) {
  impl_->gather(copy, std::span(&li, 1), ranges)->store(li, into);
}

void ResidentReplay::download(std::size_t copy, std::span<const BufferByteRange> ranges,
                              std::span<spec::LayerCaches> into) {
  const std::unique_ptr<PagesInFlight> pages = download_async(copy, ranges);
  for (std::size_t li = 0; li < into.size(); ++li) pages->store(li, into[li]);
}

std::unique_ptr<PagesInFlight> ResidentReplay::download_async(
    std::size_t copy, std::span<const BufferByteRange> ranges, const PagesInFlight* like) {
  if (like != nullptr) return impl_->gather_again(copy, *like->state_);
  std::vector<std::size_t> layers(impl_->layers.size());
  for (std::size_t li = 0; li < layers.size(); ++li) layers[li] = li;
  return impl_->gather(copy, layers, ranges);
}

std::unique_ptr<PagesInFlight> ResidentReplay::Impl::gather(
    std::size_t copy, std::span<const std::size_t> layers,
    std::span<const BufferByteRange> ranges) {
  constexpr std::int64_t kPage = spec::ByteStorage::kPageBytes;
  auto st = std::make_unique<PagesInFlight::State>();
  // Every listed layer's buffers as one list of sources; the pages, each once, by source and
  // offset.
  std::vector<const DeviceCacheMirror*> mirror_of;  // per source
  std::vector<std::pair<std::int32_t, std::int64_t>> wanted;
  for (const std::size_t li : layers) {
    const DeviceCacheMirror& mirror = *copies.at(copy).at(li);
    const auto first = static_cast<std::int32_t>(st->sources.size());
    for (std::size_t b = 0; b < mirror.buffer_count(); ++b) {
      st->source_storage.push_back(mirror.storage(b));
      mirror_of.push_back(&mirror);
      st->sources.push_back({li, b});
    }
    for (const BufferByteRange& r : ranges) {
      const auto b = static_cast<std::size_t>(r.buffer);
      if (r.buffer < 0 || b >= mirror.buffer_count()) continue;
      const std::int64_t end = std::min(mirror.storage_bytes(b), r.end);
      for (std::int64_t q = std::max<std::int64_t>(0, r.begin) / kPage; q * kPage < end; ++q)
        wanted.emplace_back(first + r.buffer, q * kPage);
    }
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());
  for (const auto& [src, begin] : wanted) {
    const PagesInFlight::State::Source& from = st->sources[static_cast<std::size_t>(src)];
    const std::int64_t end = std::min(
        begin + kPage, mirror_of[static_cast<std::size_t>(src)]->storage_bytes(from.buffer));
    if (from.layer >= st->layer_pages.size()) st->layer_pages.resize(from.layer + 1, {0, 0});
    auto& range = st->layer_pages[from.layer];
    if (range.first == range.second) range.first = st->pages.size();
    range.second = st->pages.size() + 1;
    st->pages.push_back({begin, end, st->total});
    st->page_of.push_back(src);
    st->total += (end - begin + 15) / 16 * 16;  // every page 16-byte aligned in the gathered bytes
  }
  launch_gather(*st);
  return std::unique_ptr<PagesInFlight>(new PagesInFlight(std::move(st)));
}

std::unique_ptr<PagesInFlight> ResidentReplay::Impl::gather_again(
    std::size_t copy, const PagesInFlight::State& like) {
  auto st = std::make_unique<PagesInFlight::State>();
  st->total = like.total;
  st->sources = like.sources;
  st->pages = like.pages;
  st->page_of = like.page_of;
  st->layer_pages = like.layer_pages;
  for (const PagesInFlight::State::Source& from : st->sources)
    st->source_storage.push_back(copies.at(copy).at(from.layer)->storage(from.buffer));
  launch_gather(*st);
  return std::unique_ptr<PagesInFlight>(new PagesInFlight(std::move(st)));
}

void ResidentReplay::Impl::launch_gather(PagesInFlight::State& st) {
  if (st.pages.empty()) return;
  // Gathered on the device straight into pinned host memory. The tables are uploaded on the
  // stream that reads them (a pageable cudaMemcpy on the legacy stream is not ordered before this
  // non-blocking stream's kernel) and stay in `in_flight` until the stream is next waited for.
  const auto upload = [&](const auto& v) {
    DeviceBuffer d(v.size() * sizeof(v[0]));
    check_cuda(cudaMemcpyAsync(d.data(), v.data(), d.size(), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(page tables)");
    in_flight.push_back(std::move(d));
    return in_flight.back().data();
  };
  const auto* d_sources = reinterpret_cast<const std::uint8_t* const*>(upload(st.source_storage));
  const auto* d_buffers = reinterpret_cast<const std::int32_t*>(upload(st.page_of));
  const auto* d_pages = reinterpret_cast<const PageCopy*>(upload(st.pages));
  st.pinned = PinnedPool::instance().acquire(static_cast<std::size_t>(st.total), st.capacity);
  void* out = nullptr;
  check_cuda(cudaHostGetDevicePointer(&out, st.pinned, 0), "cudaHostGetDevicePointer");
  gather_pages_kernel<<<static_cast<unsigned>(st.pages.size()), 256, 0, stream>>>(
      d_sources, d_buffers, d_pages, static_cast<std::uint8_t*>(out));
  check_cuda(cudaGetLastError(), "gather_pages_kernel");
  // Blocking: the threads that store the pages sleep until then rather than spin.
  check_cuda(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming | cudaEventBlockingSync),
             "cudaEventCreate");
  check_cuda(cudaEventRecord(st.copied, stream), "cudaEventRecord(resident pages)");
}

void ResidentReplay::synchronize() { impl_->wait("the resident replay's stream"); }

const DeviceKvCaches& ResidentReplay::views(std::size_t li, std::size_t copy) const {
  return impl_->copies.at(copy).at(li)->views();
}

void* ResidentReplay::stream() const { return impl_->stream; }

}  // namespace kvo::gpu
