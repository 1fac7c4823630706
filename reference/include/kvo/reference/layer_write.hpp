#pragma once
/// \file layer_write.hpp
/// The reference write of one layer (SPEC 3-4 line by line: per token, per element, layout
/// formula). It validates the whole call first (spec::validate_write, check_layer_caches) and
/// writes nothing on bad input. The CPU emulations of the fused and unfused kernels that must agree
/// with it byte for byte are subjects (kvo/subjects/cpu_write.hpp).

#include <cstdint>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// The reference write. `caches` must hold the buffers of a layer of this kind, each of its size
/// (check_layer_caches); the oracle allocates them guarded and poisoned.
void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                 spec::LayerCaches& caches);

/// Element i of a host tensor, widened to float32 (exact).
float source_value(const spec::HostTensor& t, std::int64_t i);

}  // namespace kvo::reference
