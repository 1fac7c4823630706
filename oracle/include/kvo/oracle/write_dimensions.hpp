#pragma once
/// \file write_dimensions.hpp
/// Every dimension of a write case that a user can fix, one row each: its name (the Python
/// keyword; for a mode, mode detection's axis), its command-line flag and help, the CaseOverrides
/// field that holds it, what a given value does to the model configuration and, for a mode of
/// SPEC 2-3, the ops it is a detection axis of and when it can change a byte. CaseOverrides's
/// to_flags, apply_overrides, the command line's flags, the Python package's keywords and mode
/// detection's axes all read these rows: a new mode is one row here (and its field in
/// spec::ModelConfig and CaseOverrides).

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::oracle {

/// Which ops a mode row is a detection axis of (SPEC 7): every write mode is the write op's; the
/// dense insert has no index-K, so the blockscale modes are not its.
enum class ModeScope : std::uint8_t { kNotAMode, kWriteOnly, kWriteAndDense };

/// What the configuration chosen so far says about whether a mode can change a byte of a part of
/// a layer's buffers (the K/V buffers, or the index-K buffer).
struct ModeFacts {
  const spec::ModelConfig& config;
  bool kv_part;          ///< judging the K/V buffers (else the index-K buffer)
  bool negative_slots;   ///< the case's slot mappings hold a slot < 0
  bool sparse_layers;    ///< the write has sparse layers (index-K buffers)
  bool computed_values;  ///< the values cast are computed (the dense insert's k), not the inputs
};

namespace mode_reach {
inline bool kv(const ModeFacts& f) { return f.kv_part; }
inline bool index(const ModeFacts& f) { return !f.kv_part && f.sparse_layers; }
/// The saturation mode reaches the K/V cast and the flat index-K cast (blockscale saturates).
inline bool fp8_cast(const ModeFacts& f) {
  return kv(f) ? spec::is_fp8(f.config.kv.cache_dtype)
               : index(f) && f.config.index.layout == spec::IndexLayout::kFlat &&
                     spec::is_fp8(f.config.index.flat_dtype);
}
/// Rounding to the activation dtype changes nothing for f32 activations, nor for unscaled inputs
/// (already in the activation dtype).
inline bool value_rounding(const ModeFacts& f) {
  return kv(f) && f.config.act_dtype != spec::DType::kF32 &&
         (f.config.kv.scale_mode != spec::ScaleMode::kNone || f.computed_values);
}
inline bool scale_rounding(const ModeFacts& f) {
  return kv(f) && f.config.act_dtype != spec::DType::kF32 &&
         f.config.kv.scale_mode != spec::ScaleMode::kNone;
}
inline bool blockscale(const ModeFacts& f) {
  return index(f) && f.config.index.layout == spec::IndexLayout::kBlockScale;
}
inline bool slots(const ModeFacts& f) { return f.negative_slots && (kv(f) || index(f)); }
}  // namespace mode_reach

/// The fixed part of a row. For a mode: `reaches` says when it can change a byte (detection
/// judges it only there), `admitted` (null: always) when the configuration admits a value other
/// than the contract's default at all (detection leaves the default elsewhere).
struct DimensionInfo {
  std::string_view name;
  std::string_view flag;
  std::string_view help;
  ModeScope mode = ModeScope::kNotAMode;
  bool (*reaches)(const ModeFacts&) = nullptr;
  bool (*admitted)(const spec::ModelConfig&) = nullptr;
};

/// A given value as its flag takes it: a number, true/false, an enumerator's name, a stride
/// text, the layer mix as written.
template <class T>
std::string dimension_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_enum_v<T>) {
    return std::string(spec::name_of(v));
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return std::to_string(v);
  } else if constexpr (std::is_same_v<T, spec::KvStrides>) {
    return spec::kv_strides_text(v);
  } else if constexpr (std::is_same_v<T, spec::IndexStrides>) {
    return spec::index_strides_text(v);
  } else {
    return v;
  }
}

/// Calls visit(info, member, set) for every row, in table order (a mode's values are its enum's
/// names or false/true, the contract's default first): `member` points to the CaseOverrides field
/// (a std::optional<T>), `set(config, value)` is what a given value does to the configuration
/// (nullptr: nothing; the case generator reads the override itself).
template <class Visit>
void visit_write_dimensions(Visit&& visit) {
  using C = spec::ModelConfig;
  using O = CaseOverrides;
  using std::int64_t;
  visit(
      DimensionInfo{"layers", "--layers",
                    "layer mix: run-length (3D57S) or one letter per layer (DDSS); D dense, S "
                    "sparse"},
      &O::layers, +[](C& c, const std::string& v) { c.layers = spec::parse_layer_mix(v); });
  visit(
      DimensionInfo{"num_blocks", "--num-blocks", "cache blocks (pages)"}, &O::num_blocks,
      +[](C& c, const int64_t& v) { c.geometry.num_blocks = v; });
  visit(
      DimensionInfo{"block_size", "--block-size", "tokens per block (page size), >= 1"},
      &O::block_size, +[](C& c, const int64_t& v) { c.geometry.block_size = v; });
  visit(
      DimensionInfo{"num_kv_heads", "--num-kv-heads", "KV heads"}, &O::num_kv_heads,
      +[](C& c, const int64_t& v) { c.geometry.num_kv_heads = v; });
  visit(
      DimensionInfo{"head_dim", "--head-dim", "head dimension, a multiple of 8"}, &O::head_dim,
      +[](C& c, const int64_t& v) { c.geometry.head_dim = v; });
  visit(
      DimensionInfo{"index_dim", "--index-dim",
                    "index-K dimension (a multiple of 128 with blockscale)"},
      &O::index_dim, +[](C& c, const int64_t& v) { c.geometry.index_dim = v; });
  visit(DimensionInfo{"tokens", "--tokens", "tokens written per step (before the -1 padding)"},
        &O::tokens, nullptr);
  visit(DimensionInfo{"requests", "--requests", "requests the step's tokens are split over evenly"},
        &O::requests, nullptr);
  visit(
      DimensionInfo{"act_dtype", "--act-dtype", "activation dtype"}, &O::act_dtype,
      +[](C& c, const spec::DType& v) { c.act_dtype = v; });
  visit(
      DimensionInfo{"kv_dtype", "--kv-dtype", "K/V cache dtype"}, &O::kv_dtype,
      +[](C& c, const spec::DType& v) { c.kv.cache_dtype = v; });
  visit(
      DimensionInfo{"index_dtype", "--index-dtype", "flat index-K cache dtype"}, &O::index_dtype,
      +[](C& c, const spec::DType& v) { c.index.flat_dtype = v; });
  visit(
      DimensionInfo{"layout", "--layout", "K/V cache layout"}, &O::layout,
      +[](C& c, const spec::KvLayout& v) { c.layout = v; });
  visit(
      DimensionInfo{"saturation", "--sat", "fp8 saturation", ModeScope::kWriteAndDense,
                    mode_reach::fp8_cast},
      &O::saturation, +[](C& c, const spec::Saturation& v) { c.kv.saturation = v; });
  visit(
      DimensionInfo{"scale_mode", "--scale-mode", "KV scale mode", ModeScope::kWriteAndDense,
                    mode_reach::kv},
      &O::scale_mode, +[](C& c, const spec::ScaleMode& v) { c.kv.scale_mode = v; });
  visit(
      DimensionInfo{"index_layout", "--index-layout", "index-K cache layout"}, &O::index_layout,
      +[](C& c, const spec::IndexLayout& v) { c.index.layout = v; });
  visit(
      DimensionInfo{"per_head_scale", "--per-head-scale",
                    "one KV scale per head instead of per tensor"},
      &O::per_head_scale, +[](C& c, const bool& v) { c.kv.per_head_scale = v; });
  visit(
      DimensionInfo{"via_model_dtype", "--via-model-dtype",
                    "round the scaled value to the activation dtype first",
                    ModeScope::kWriteAndDense, mode_reach::value_rounding},
      &O::via_model_dtype, +[](C& c, const bool& v) { c.kv.via_model_dtype = v; });
  visit(
      DimensionInfo{"scale_in_model_dtype", "--scale-in-model-dtype",
                    "round the KV scale to the activation dtype before scaling (torch's "
                    "promotion)",
                    ModeScope::kWriteAndDense, mode_reach::scale_rounding},
      &O::scale_in_model_dtype, +[](C& c, const bool& v) { c.kv.scale_in_model_dtype = v; });
  visit(
      DimensionInfo{"blockscale_scale", "--blockscale-scale",
                    "index-K block scale: amax / 448 (divide) or amax * fl(1/448) (mul_recip)",
                    ModeScope::kWriteOnly, mode_reach::blockscale,
                    +[](const C& c) { return c.index.layout == spec::IndexLayout::kBlockScale; }},
      &O::blockscale_scale,
      +[](C& c, const spec::BlockScaleFormula& v) { c.index.blockscale_scale = v; });
  visit(
      DimensionInfo{"ue8m0", "--ue8m0", "power-of-two index-K block scales", ModeScope::kWriteOnly,
                    mode_reach::blockscale},
      &O::ue8m0, +[](C& c, const bool& v) { c.index.ue8m0 = v; });
  visit(
      DimensionInfo{"slot_mode", "--slot-mode", "meaning of negative slots",
                    ModeScope::kWriteAndDense, mode_reach::slots},
      &O::slot_mode, +[](C& c, const spec::SlotMode& v) { c.slot_mode = v; });
  visit(
      DimensionInfo{"slot_type", "--slot-type", "slot mapping storage type"}, &O::slot_type,
      +[](C& c, const spec::SlotType& v) { c.slot_type = v; });
  visit(DimensionInfo{"allocator", "--allocator", "how the step's blocks are handed out"},
        &O::allocator, nullptr);
  visit(
      DimensionInfo{"separate_index_slots", "--separate-index-slots",
                    "index-K through its own slot mapping"},
      &O::separate_index_slots, +[](C& c, const bool& v) { c.separate_index_slots = v; });
  visit(DimensionInfo{"edge_values", "--edge-values",
                      "mix in edge values (zeros, ties, fp8 maxima, inf, NaN)"},
        &O::edge_values, nullptr);
  visit(
      DimensionInfo{"kv_strides", "--kv-strides",
                    "K/V caches as strided views (SPEC 3): dense, or "
                    "block,token,head,kv_part,offset in elements"},
      &O::kv_strides, +[](C& c, const spec::KvStrides& v) { c.kv_strides = v; });
  visit(
      DimensionInfo{"index_strides", "--index-strides",
                    "the index-K cache as a strided view (SPEC 3): dense, or block,token,offset "
                    "(flat: elements; blockscale: bytes, token 0)"},
      &O::index_strides, +[](C& c, const spec::IndexStrides& v) { c.index_strides = v; });
}

}  // namespace kvo::oracle
