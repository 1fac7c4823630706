#pragma once
/// \file layer_write.hpp
/// The reference write of one layer (SPEC 3-4 line by line: per token, per element, layout
/// formula). It validates the whole call first (spec::validate_write, check_layer_caches) and
/// writes nothing on bad input. The CPU emulations of the fused and unfused kernels that must agree
/// with it byte for byte are subjects (kvo/subjects/cpu_write.hpp).

#include <cstdint>
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

/// `t` with every element cast to `dtype` (SPEC 2: one rounding from its fp32 value, satfinite):
/// e.g. fp8 index-Q from activation values.
spec::HostTensor cast_tensor(const spec::HostTensor& t, spec::DType dtype);

}  // namespace kvo::reference
