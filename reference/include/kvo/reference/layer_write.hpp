#pragma once
/// \file layer_write.hpp
/// One layer's cache write (SPEC 4) in three independently written CPU forms that must give
/// identical bytes for every valid input:
///  - write_layer: the reference, SPEC 3-4 line by line (per token, per element, layout formula);
///  - write_layer_fused: the fused kernel's structure (page and offset once per token, one stride
///    descriptor per layout, K, V and index-K in one pass);
///  - write_layer_unfused: the pre-fusion torch path (per tensor: division, remainder, index cast,
///    then an index_put through a strided view of the cache; 12 ops on a sparse layer, 8 on a
///    dense).
/// Each validates the whole call first (spec::validate_write) and writes nothing on bad input.

#include <cstdint>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// The reference write. `caches` must come from make_layer_caches for this config and layer kind.
void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                 spec::LayerCaches& caches);

/// The CPU model of the fused one-launch kernel.
void write_layer_fused(const spec::ModelConfig& config, const spec::LayerWrite& write,
                       spec::LayerCaches& caches);

/// The CPU model of the unfused path. Returns the number of tensor ops (launches) it modelled.
int write_layer_unfused(const spec::ModelConfig& config, const spec::LayerWrite& write,
                        spec::LayerCaches& caches);

/// Element i of a host tensor, widened to float32 (exact).
float source_value(const spec::HostTensor& t, std::int64_t i);

}  // namespace kvo::reference
