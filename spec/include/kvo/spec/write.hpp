#pragma once
/// \file write.hpp
/// Plain data of one layer's cache write (SPEC 3-4): the host tensors a serving engine hands over,
/// the slot mappings, the scales, and the guarded cache buffers the write lands in. Validators here
/// reject bad input before any implementation writes a byte.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvo/spec/cache_storage.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::spec {

/// A dense row-major host tensor of raw little-endian element codes.
struct HostTensor {
  DType dtype = DType::kBF16;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  ///< numel() * dtype_bytes(dtype)

  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t s : shape) n *= s;
    return n;
  }
};

/// A slot mapping: one slot per token of the call (SPEC 3). Values are held as int64 whatever the
/// storage type; kI32 mappings must fit int32 (checked by validate_write).
struct SlotMapping {
  SlotType type = SlotType::kI64;
  std::vector<std::int64_t> slots;  ///< [T]; < 0 padding (kStrict) or wrapped (kLegacyWrap)
};

/// One layer's write call. T = slots.slots.size() tokens are written; the source tensors may hold
/// more rows (CUDA-graph padding), which must stay unread.
struct LayerWrite {
  LayerKind kind = LayerKind::kDense;
  HostTensor k;                ///< [T_src, nkv, hd], act dtype
  HostTensor v;                ///< [T_src, nkv, hd], act dtype
  HostTensor index_k;          ///< [T_src, index_dim], act dtype; sparse layers only
  SlotMapping slots;           ///< [T]
  SlotMapping index_slots;     ///< [T]; used when ModelConfig::separate_index_slots
  std::vector<float> k_scale;  ///< [1] or [nkv]
  std::vector<float> v_scale;  ///< [1] or [nkv]
};

/// Guard band on each side of every cache buffer, in bytes.
inline constexpr std::int64_t kGuardBytes = 256;

/// One cache buffer with its guard bands: [guard | body | guard]. Before any write the whole
/// storage is poisoned with a known pattern, so a write that should not have happened is visible.
/// A huge buffer's storage is lazy (cache_storage.hpp): only the pages a case touches exist.
struct CacheBuffer {
  BufferKind kind = BufferKind::kK;
  std::int64_t guard_bytes = kGuardBytes;
  ByteStorage storage;

  std::int64_t body_bytes() const { return storage.size() - 2 * guard_bytes; }
  std::uint8_t* body() { return storage.data() + guard_bytes; }
  const std::uint8_t* body() const { return storage.data() + guard_bytes; }
};

/// The buffers of one layer: K and V (or one KV tensor), and index-K on sparse layers.
struct LayerCaches {
  LayerKind kind = LayerKind::kDense;
  std::vector<CacheBuffer> buffers;

  CacheBuffer* find(BufferKind b) {
    for (auto& buf : buffers)
      if (buf.kind == b) return &buf;
    return nullptr;
  }
  const CacheBuffer* find(BufferKind b) const {
    for (const auto& buf : buffers)
      if (buf.kind == b) return &buf;
    return nullptr;
  }
};

/// Throws InvalidInput unless `m` is a legal mapping for a cache of `capacity` slots: every slot
/// < capacity; no non-negative slot twice; int32 values in range; in kLegacyWrap, no slot below
/// -capacity (torch would raise). Names the field, the token index and the value.
void validate_slots(const SlotMapping& m, std::int64_t capacity, SlotMode mode,
                    std::string_view field);

/// Throws InvalidInput on any inconsistency between a write call and the model: tensor dtypes and
/// shapes, fewer source rows than tokens, index-K on a dense layer or missing on a sparse one, the
/// index slot mapping's length, scales (validate_scales), slots (validate_slots).
void validate_write(const ModelConfig& config, const LayerWrite& write);

}  // namespace kvo::spec
