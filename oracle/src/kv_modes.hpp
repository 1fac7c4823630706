#pragma once
// Internal to the oracle: the write modes of SPEC 2-3 as mode-detection axes (SPEC 7), shared by
// the write and dense drivers: the mode rows of kvo/oracle/write_dimensions.hpp (each axis's
// values, how a value sets the configuration and the overrides, its default, and when it can
// change a byte).

#include <cstdint>
#include <vector>

#include "kvo/oracle/op_driver.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// The axes of `op` (kWrite or kDense), in table order.
std::vector<ModeAxis> kv_mode_axes(spec::Op op);

/// False for a combination the contract forbids (a scale rounded to the model dtype with no
/// scale).
bool kv_mode_possible(spec::Op op, const ModeChoice& choice);

/// Every axis pinned: the override's value when given, else the contract's default.
Overrides pin_kv_modes(spec::Op op, const Overrides& overrides, ModeChoice& pinned);

/// `config` with the modes of `choice`; a blockscale formula on a configuration without the
/// blockscale layout keeps the default (it cannot change a byte there).
spec::ModelConfig with_kv_modes(spec::Op op, spec::ModelConfig config, const ModeChoice& choice);

/// The buffers of a layer whose bytes depend on separate sets of modes: K/V on the KV scaling
/// modes, index-K on the block-scale modes (saturation and the slot mode on both). Judging each
/// part under its own modes makes detection's cost the sum of the parts' settings, not their
/// product.
enum class KvPart : std::uint8_t { kKvBuffers, kIndexBuffer };

/// True when `buffer` belongs to `part`.
bool in_part(KvPart part, spec::BufferKind buffer);

/// The choice with every axis that cannot change a byte of `part` in this case set to its first
/// value, so that equivalent combinations share one reference run. `negative_slots`: some slot is
/// < 0.
ModeChoice relevant_kv_modes(spec::Op op, KvPart part, const spec::ModelConfig& config,
                             ModeChoice choice, bool negative_slots);

/// True when any mapping of the writes has a slot < 0.
bool has_negative_slots(const std::vector<const spec::SlotMapping*>& mappings);

}  // namespace kvo::oracle
