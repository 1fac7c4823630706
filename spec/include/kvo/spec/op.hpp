#pragma once
/// \file op.hpp
/// The ops of the contract that kvoracle judges (SPEC 4-6) and their one table of names. Every
/// other module names an op through this enum; the oracle's registry holds one driver per entry.

#include <array>
#include <cstdint>
#include <string_view>

#include "kvo/spec/types.hpp"

namespace kvo::spec {

enum class Op : std::uint8_t {
  kWrite,      ///< one layer's K, V (and index-K) cache write through a slot mapping (SPEC 4)
  kDense,      ///< the dense-layer fused qknorm + rope + insert (SPEC 4)
  kIndexer,    ///< index scores, block top-k (SPEC 5)
  kAttention,  ///< sparse attention over a selection, dense attention on dense layers (SPEC 6)
};

template <>
struct EnumInfo<Op> {
  static constexpr std::string_view kNoun = "op";
  static constexpr std::array<EnumName<Op>, 4> kNames{{{Op::kWrite, "write"},
                                                       {Op::kDense, "dense"},
                                                       {Op::kIndexer, "indexer"},
                                                       {Op::kAttention, "attention"}}};
};

}  // namespace kvo::spec
