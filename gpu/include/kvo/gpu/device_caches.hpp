#pragma once
/// \file device_caches.hpp
/// Device memory as a user's kernel sees it: a tensor view (pointer, element type, shape and
/// strides in elements), a layer's caches as views in their SPEC 3 layouts, and the one device
/// mirror of guarded host caches (spec::LayerCaches) that every CUDA subject uses: the built-in
/// kernels' host paths (write, dense insert, indexer, attention) and users' device subjects
/// (device_calls.hpp). No CUDA types here: host code links kvo_gpu without nvcc.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::gpu {

/// Element types of device tensors: the spec's value dtypes, then the integer types of slot
/// mappings, block tables, ids, positions, and raw bytes (blockscale index-K blocks).
enum class ElementType : std::uint8_t {
  kF32,
  kBF16,
  kF16,
  kFp8E4M3,
  kFp8E5M2,
  kI32,
  kI64,
  kU8,
};

/// Name ("bf16", "i64", ...) and bytes of an element type.
std::string_view name_of(ElementType t);
std::size_t element_bytes(ElementType t);
/// The element type of a value dtype (same enumerator order).
ElementType element_type_of(spec::DType t);

/// A tensor in device memory. `data` is null for a tensor a call does not have (index-K of a dense
/// layer, a selection of dense attention). Element (i0, i1, ...) lives at data + sum(ik *
/// strides[k]) elements.
struct DeviceTensor {
  void* data = nullptr;
  ElementType type = ElementType::kU8;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  ///< elements

  bool present() const { return data != nullptr; }
  std::int64_t numel() const;
  template <class T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

/// A contiguous (row-major) view of `shape`.
DeviceTensor contiguous_tensor(void* data, ElementType type, std::vector<std::int64_t> shape);

/// One layer's caches on the device (bodies only; the guard bands around them are the mirror's).
struct DeviceKvCaches {
  /// The K tensor in its layout's SPEC 3 shape (nhd [nb, bs, nkv, hd], hnd [nb, nkv, bs, hd]); for
  /// the one-tensor layouts the one KV tensor (packed_hnd [nb, nkv, bs, 2 hd], packed_nhd [nb, bs,
  /// nkv, 2 hd], split_nhd [nb, 2, bs, nkv, hd], split_hnd [nb, 2, nkv, bs, hd]).
  DeviceTensor k_cache;
  /// The V tensor of the separate layouts; absent for the one-tensor layouts.
  DeviceTensor v_cache;
  /// K and V of every layout as logical views [nb, bs, nkv, hd] (block, offset in block, KV head,
  /// dim) with the layout's strides: k[b][o][h][d] is SPEC 3's element of slot b * bs + o.
  DeviceTensor k, v;
  /// Sparse layers: index-K flat [nb, bs, index_dim] (bf16 or fp8), or blockscale
  /// [nb, bs * index_dim + bs * (index_dim / 128) * 4] bytes (values token-major, then fp32
  /// scales).
  DeviceTensor index_cache;
};

/// The views of a layer's caches whose bodies start at `k_body` (K, or the one KV tensor), `v_body`
/// (null for the one-tensor layouts) and `index_body` (null on dense layers), in device or host
/// memory alike: what every call of device_calls.hpp receives.
DeviceKvCaches cache_views(const spec::ModelConfig& config, void* k_body, void* v_body,
                           void* index_body);

/// Poisoning that a mirror leaves to its owner, to be done in one launch with other mirrors'
/// (kvo/gpu/resident.hpp): [bytes] at device `data`, byte i spec::poison_byte(salt, i) where
/// `salted` (data 8-byte aligned), else `fill`.
struct PendingPoison {
  std::uint8_t* data = nullptr;
  std::int64_t bytes = 0;
  std::uint64_t salt = 0;
  std::uint8_t fill = 0;
  bool salted = false;
  /// Salted: the storage offset of `data` (a multiple of 8): byte i of the range is the storage's
  /// poison byte first + i (a range of a buffer poisoned alone).
  std::int64_t first = 0;
};

/// The host buffers of one layer copied to the device, guard bands included, inside one device
/// allocation with a margin of one token row (at least 256 bytes) before the first buffer and after
/// the last: a kernel that writes a little outside a body writes into a guard band or the margin,
/// memory the mirror owns, as a real engine's neighbouring allocation would be, rather than fault
/// the context. download() brings every byte of every buffer back, guards included, so the diff
/// reports a stray write with its coordinates; a write into the margin (outside every guard band)
/// is spec::WroteOutside (a mismatch) naming the offset.
class DeviceCacheMirror {
 public:
  /// Checks that `caches` has exactly the buffers a `kind` layer of `config` has (K and V or the
  /// one KV tensor; index-K on sparse layers) with the body sizes the config implies
  /// (spec::InvalidInput naming the buffer otherwise), then uploads them.
  /// With `pending`, the margins' poison and that of the lazy buffers holding no page are appended
  /// there instead of launched (the caller poisons them, before any use of the mirror); the rest
  /// (dense buffers, held pages) is copied now either way, synchronously to the host, on the
  /// legacy default stream. `uploaded` (empty: every buffer) names the buffers a call reads: the
  /// others are not copied and hold the margins' poison (a read of the index-K alone need not
  /// move the K/V caches, tens of MB a case at long contexts).
  DeviceCacheMirror(const spec::ModelConfig& config, const spec::LayerCaches& caches,
                    std::vector<PendingPoison>* pending = nullptr,
                    const std::vector<spec::BufferKind>& uploaded = {});
  ~DeviceCacheMirror();
  DeviceCacheMirror(const DeviceCacheMirror&) = delete;
  DeviceCacheMirror& operator=(const DeviceCacheMirror&) = delete;

  /// The bodies as views (DeviceKvCaches).
  const DeviceKvCaches& views() const;
  /// The device body of a buffer (null when the layer has none).
  void* body(spec::BufferKind kind) const;
  /// Copies every byte of every buffer (guards included) back into `caches` (the same layer it was
  /// made from); spec::WroteOutside when a margin byte changed.
  void download(spec::LayerCaches& caches) const;

  // For comparisons on the device (kvo/gpu/resident.hpp): buffer i's storage (leading guard, body,
  // trailing guard: the bytes of the host caches' buffers[i]), and the whole allocation (margins
  // and the pads between buffers included). Device pointers.
  std::size_t buffer_count() const;
  std::uint8_t* storage(std::size_t i) const;
  std::int64_t storage_bytes(std::size_t i) const;
  std::uint8_t* allocation() const;
  std::int64_t allocation_bytes() const;
  /// The device bytes a mirror of `caches` takes (its allocation as the memory pool rounds it).
  static std::int64_t device_bytes(const spec::ModelConfig& config,
                                   const spec::LayerCaches& caches);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvo::gpu
