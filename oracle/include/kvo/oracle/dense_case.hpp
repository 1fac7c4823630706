#pragma once
/// \file dense_case.hpp
/// The dense-layer fused insert (vLLM MiniMax-M3 qknorm + rope + insert, SPEC 4): random cases
/// (head dims 32..256, GQA ratios, every layout, cache dtype, saturation and scale mode, -1
/// padding) as a pure function of the seed and the overrides. Finite inputs only: a NaN in a head
/// makes the whole row NaN, and the NaN bits of fp32 arithmetic are not specified by SPEC 4.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/dense_insert.hpp"

namespace kvo::oracle {

/// Dimensions of the dense insert only; the shared ones (tokens, block size, KV heads, head dim,
/// dtypes, layout, saturation, scale mode, slot type, per-head scales, via_model_dtype, number of
/// blocks) come from CaseOverrides.
struct DenseOverrides {
  std::optional<std::int64_t> group_size;  ///< query heads per KV head
  std::optional<std::int64_t> rotary_dim;  ///< even, <= head_dim
  /// SPEC 4: K/V stored scaled or with scale 1 (identity); drawn identity in one case of four
  std::optional<spec::DenseFp8Store> fp8_store;

  /// Command-line flags of these fields (--group-size, --rotary-dim, --dense-fp8-store).
  std::string to_flags() const;
};

struct DenseCase {
  std::uint64_t seed = 0;
  spec::ModelConfig config;
  spec::DenseInsert in;

  std::string describe() const;
};

/// Draws the case of `seed`; every dimension is drawn, then the overrides replace theirs (so a
/// case without overrides is the same whatever else is fixed). Throws spec::InvalidInput naming
/// the flag when an override is out of range or inconsistent.
DenseCase make_dense_case(std::uint64_t seed, const CaseOverrides& shared = {},
                          const DenseOverrides& dense = {});

}  // namespace kvo::oracle
