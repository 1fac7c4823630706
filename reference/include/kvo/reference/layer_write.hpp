#pragma once
/// \file layer_write.hpp
/// The reference write of one layer (SPEC 3-4 line by line: per token, per element, layout
/// formula). It validates the whole call first (spec::validate_write, check_layer_caches) and
/// writes nothing on bad input. The CPU emulations of the fused and unfused kernels that must agree
/// with it byte for byte are subjects (kvo/subjects/cpu_write.hpp).

#include <cstdint>
#include <cstring>
#include <vector>

#include "kvo/reference/numbers.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// The reference write. `caches` must hold the buffers of a layer of this kind, each of its size
/// (check_layer_caches); the oracle allocates them guarded and poisoned.
void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                 spec::LayerCaches& caches);

/// One element of a layer's caches by meaning (SPEC 3): K or V (kv, block, offset, head, dim), or
/// an index-K value (block, offset, dim) or blockscale scale (block, offset, group).
struct CacheElement {
  spec::BufferKind buffer = spec::BufferKind::kK;  ///< kK/kV/kKv (with kv) or kIndexK
  int kv = 0;                                      ///< 0 K, 1 V
  std::int64_t block = 0, offset = 0, head = 0, dim = 0;
  bool is_scale = false;
  std::int64_t group = 0;
};

/// True when the contract admits more than one result for some element of this write (SPEC 7):
/// the div_approx scale mode, or a legacy-wrap race (two tokens on one slot). Otherwise
/// write_layer's bytes are the only answer.
bool admits_several(const spec::ModelConfig& config, const spec::LayerWrite& write);

/// The codes SPEC 7 admits at `element` after the write: the union, over every token that lands on
/// its slot, of that token's admissible codes (admissible_kv_codes; one code for index-K). Empty
/// when no token writes the element (its bytes must stay as they were). Sorted, no duplicates.
std::vector<std::uint32_t> admissible_codes(const spec::ModelConfig& config,
                                            const spec::LayerWrite& write,
                                            const CacheElement& element);

/// Element i of a host tensor, widened to float32 (exact).
inline float source_value(const spec::HostTensor& t, std::int64_t i) {
  const auto eb = static_cast<std::int64_t>(spec::dtype_bytes(t.dtype));
  return decode(load_code(t.bytes.data() + i * eb, t.dtype), t.dtype);
}

/// SPEC 2 with scale none: a K/V element's code is a function of its source code alone, so
/// quantize_kv can be tabulated over every 16-bit source code, table[c] = quantize_kv(decode(c,
/// src), 1, q, act): the same function, one lookup an element instead of a decode, a scaling
/// switch and an encode (the replay's per-element cost). Null unless q.scale_mode is none and src
/// is a 16-bit dtype. Built once per (src, act, cache dtype, saturation, via_model_dtype) for the
/// process; thread-safe.
const std::uint32_t* unscaled_kv_codes(spec::DType src, const spec::KvQuant& q, spec::DType act);

/// The code of element i of K or V `t`: quantize_kv(source_value(t, i), s, q, act), looked up in
/// `table` (unscaled_kv_codes of t's dtype) when it is not null.
inline std::uint32_t kv_element_code(const spec::HostTensor& t, std::int64_t i, float s,
                                     const spec::KvQuant& q, spec::DType act,
                                     const std::uint32_t* table) {
  if (table != nullptr) return table[load_code(t.bytes.data() + i * 2, t.dtype)];
  return quantize_kv(source_value(t, i), s, q, act);
}

/// Elements i0 .. i0 + n - 1 of K or V `t`, each kv_element_code, stored as codes of the cache
/// dtype at out [n][its bytes]: a K/V head row, with the table's 16-bit loads and the 16- or 8-bit
/// stores out of store_code's and load_code's dtype switches.
inline void store_kv_codes(const spec::HostTensor& t, std::int64_t i0, std::int64_t n, float s,
                           const spec::KvQuant& q, spec::DType act, const std::uint32_t* table,
                           std::uint8_t* out) {
  const int eb = spec::dtype_bytes(q.cache_dtype);
  if (table != nullptr && eb <= 2) {
    const std::uint8_t* in = t.bytes.data() + i0 * 2;
    for (std::int64_t j = 0; j < n; ++j) {
      std::uint16_t c;
      std::memcpy(&c, in + 2 * j, sizeof c);
      const std::uint32_t code = table[c];
      if (eb == 2) {
        const auto half = static_cast<std::uint16_t>(code);
        std::memcpy(out + 2 * j, &half, sizeof half);
      } else {
        out[j] = static_cast<std::uint8_t>(code);
      }
    }
    return;
  }
  for (std::int64_t j = 0; j < n; ++j)
    store_code(kv_element_code(t, i0 + j, s, q, act, table), q.cache_dtype, out + j * eb);
}

/// `t` with every element cast to `dtype` (SPEC 2: one rounding from its fp32 value, satfinite):
/// e.g. fp8 index-Q from activation values.
spec::HostTensor cast_tensor(const spec::HostTensor& t, spec::DType dtype);

}  // namespace kvo::reference
