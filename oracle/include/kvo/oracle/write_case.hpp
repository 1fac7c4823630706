#pragma once
/// \file write_case.hpp
/// Random write cases: a model configuration, one step's requests and slot mapping (block tables
/// drawn like an allocator's, with a CUDA-graph -1 tail), and each layer's inputs from the value
/// generator of SPEC 8. Every case is a pure function of its 64-bit seed and the overrides.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kvo/reference/generator.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

/// How a step's blocks were handed out, so slot mappings look like a real allocator's.
enum class AllocatorShape : std::uint8_t {
  kFragmented,    ///< a shuffled free list: blocks anywhere, after hours of allocation and freeing
  kContiguous,    ///< a fresh cache: blocks in order from 0
  kNearCapacity,  ///< the last blocks first: slots next to num_blocks * block_size
  kSharedPrefix,  ///< every request shares the blocks of a common cached prefix
};

}  // namespace kvo::oracle

namespace kvo::spec {
template <>
struct EnumInfo<oracle::AllocatorShape> {
  static constexpr std::string_view kNoun = "allocator";
  static constexpr std::array<EnumName<oracle::AllocatorShape>, 4> kNames{
      {{oracle::AllocatorShape::kFragmented, "fragmented"},
       {oracle::AllocatorShape::kContiguous, "contiguous"},
       {oracle::AllocatorShape::kNearCapacity, "near_capacity"},
       {oracle::AllocatorShape::kSharedPrefix, "shared_prefix"}}};
};
}  // namespace kvo::spec

namespace kvo::oracle {

/// Dimensions the user fixes instead of drawing them (CLI flags of `kvoracle check`).
struct CaseOverrides {
  std::optional<std::string> layers;  ///< layer mix pattern
  std::optional<std::int64_t> num_blocks, block_size, num_kv_heads, head_dim, index_dim, tokens;
  std::optional<std::int64_t> requests;  ///< split the tokens evenly over this many requests
  std::optional<spec::DType> act_dtype, kv_dtype, index_dtype;
  std::optional<spec::KvLayout> layout;
  std::optional<spec::Saturation> saturation;
  std::optional<spec::ScaleMode> scale_mode;
  std::optional<spec::IndexLayout> index_layout;
  std::optional<spec::SlotMode> slot_mode;
  std::optional<spec::SlotType> slot_type;
  std::optional<spec::BlockScaleFormula> blockscale_scale;
  std::optional<AllocatorShape> allocator;
  std::optional<bool> per_head_scale, via_model_dtype, scale_in_model_dtype, ue8m0,
      separate_index_slots, edge_values;
  std::optional<spec::KvStrides> kv_strides;  ///< SPEC 3 strided K/V views (every op's caches)
  std::optional<spec::IndexStrides> index_strides;  ///< SPEC 3 strided index-K view

  /// The flags that reproduce these overrides on the command line ("--block-size 17 ...").
  std::string to_flags() const;
};

/// Which buffers a huge cache (draw_huge_blocks) takes past 2^32 bytes.
enum class HugeReach : std::uint8_t {
  kLargestKv,    ///< the larger K/V buffer (a write: its stores near the end)
  kEveryBuffer,  ///< K, V and the index-K of a sparse layer, all of them (a read case)
};

/// Reach (issue 14): the number of blocks that makes the buffers `reach` names pass 2^32 bytes
/// (the first of them by up to 2^28), so that byte offsets near their end pass int32's and
/// uint32's range (and, for 1- and 2-byte caches, element offsets int32's). Only the pages a case
/// touches exist (spec::ByteStorage), so the size costs the host nothing.
std::int64_t draw_huge_blocks(std::uint64_t seed, const spec::ModelConfig& c,
                              HugeReach reach = HugeReach::kLargestKv);

/// One request's part of the step: its new tokens' positions and its block table.
struct StepRequest {
  std::int64_t context = 0;  ///< tokens already cached
  std::int64_t q_len = 0;    ///< new tokens written in this step
  std::vector<std::int64_t> block_table;
};

/// Where a drawn write case's K, V and index-K come from (SPEC 8): every layer's rows generated
/// from `gen` under the source rows' keys, then `zero_rows` (source row indices) set to all zero
/// in each of them. fill_write_values fills the host tensors from it; the GPU tier generates the
/// same bytes on the device (kvo/gpu/resident.hpp).
struct WriteValues {
  reference::ValueGenerator gen;
  std::vector<reference::RowKey> row_keys;  ///< [T_src]: the slot mapping's rows, then padding
  std::vector<std::int64_t> zero_rows;
};

/// Whether make_write_case fills the layers' K, V and index-K tensors (kGenerated), or leaves them
/// empty for the device to generate from WriteCase::values (kDeferred; fill_write_values later).
enum class CaseValues : std::uint8_t { kGenerated, kDeferred };

/// A whole write case: configuration, the step's requests and one LayerWrite per layer.
struct WriteCase {
  std::uint64_t seed = 0;
  spec::ModelConfig config;
  std::vector<StepRequest> requests;
  std::int64_t padding = 0;  ///< -1 entries of the slot mapping (a tail unless interleaved)
  /// Reach (issue 14): the -1 entries scattered among the real tokens, not only at the tail; and
  /// source rows (token, all heads) of K, V and index-K that are all zero (an all-zero blockscale
  /// group, a zero amax).
  bool padding_interleaved = false;
  std::int64_t zero_rows = 0;
  AllocatorShape allocator = AllocatorShape::kFragmented;
  std::vector<spec::LayerWrite> writes;
  /// How the tensors of `writes` are generated (a drawn case; a case file's has none).
  std::optional<WriteValues> values;

  std::string describe() const;
};

/// Applies the overrides to a configuration (what `kvoracle layout` starts from).
void apply_overrides(const CaseOverrides& o, spec::ModelConfig& config);

/// Draws the case of `seed`, its values generated unless `values` defers them. Throws
/// spec::InvalidInput when the overrides are inconsistent.
WriteCase make_write_case(std::uint64_t seed, const CaseOverrides& overrides,
                          CaseValues values = CaseValues::kGenerated);
/// Generates the K, V and index-K of every layer of `wc` whose tensors are empty from
/// `wc.values` (nothing without it): the bytes make_write_case(..., kGenerated) holds.
void fill_write_values(WriteCase& wc);

/// Stratified stress themes (issue 14): a case's theme slot is its seed's low bits, and case
/// `index` of a campaign gets slot index % kThemeSlots, so each theme comes up once in every
/// kThemeSlots cases while a case stays a pure function of its seed (`--case-seed` replays it,
/// theme included). Each op's generator gives a slot its own meaning; slot 0 and the slots it
/// leaves unnamed draw the plain distribution:
///   write:  kThemeMinusOneInside: -1 slots scattered among the real tokens;
///           kThemeZeros: all-zero source rows (zero amax, all-zero blockscale groups);
///           kThemeLegacyWrap: slot_mode legacy_wrap with -1 slots (they wrap onto the last slot);
///           kThemeVectorTail: fp8 heads of 40 dims (a 16-byte vector store's 8-byte tail).
///   read:   kThemeTies: all-zero index-Q over rows of up to kTiesRowBlocks blocks cut at topk 16
///           (every block tied, ties wider than 16 straddling the cut); kThemeLongContext: a
///           request past 4096 tokens in 4-token blocks (over 1024 logical blocks: the top-k
///           kernels' long path) or, in half, 1-token blocks (over 4096, cut at topk
///           kTokenSelection: DeepSeek-V3.2's token-level top-2048); kThemeUnionNegInf:
///           index_group union over two index heads per KV head, and a -inf block planted.
///   dense:  kThemeFp8Identity (slot 1): an fp8 cache stored under dense_fp8_store identity.
///   every op: kThemeStrided (slot 5): the K/V caches as strided views (draw_kv_strides), and
///           the index-K cache of every mix with sparse layers (draw_index_strides; a write
///           case's mix of dense layers only gets a sparse last layer).
///   write:  kThemeHugeCache (slot 6): a huge cache (draw_huge_blocks), written near its end:
///           every block the step writes starts past byte 2^32 (the allocator near capacity).
///   read:   kThemeHugeCache (slot 6): K, V and index-K all past 2^32 bytes, every block a row
///           reads near their end.
/// An override of the dimension a theme sets wins over the theme.
inline constexpr std::uint64_t kThemeSlots = 8;
inline constexpr std::uint64_t kThemeMinusOneInside = 1, kThemeTies = 1, kThemeFp8Identity = 1;
inline constexpr std::uint64_t kThemeZeros = 2, kThemeLongContext = 2;
inline constexpr std::uint64_t kThemeLegacyWrap = 3, kThemeUnionNegInf = 3;
inline constexpr std::uint64_t kThemeVectorTail = 4;
inline constexpr std::uint64_t kThemeStrided = 5;
inline constexpr std::uint64_t kThemeHugeCache = 6;
/// The most layers a write case of the huge-cache theme has, unless --layers says otherwise (each
/// layer a device copy of several GB per writer: a resident campaign keeps that many per writer).
inline constexpr std::size_t kHugeCacheMostLayers = 2;
inline std::uint64_t theme_slot(std::uint64_t seed) { return seed % kThemeSlots; }
/// The most logical blocks a row of the read ties theme spans (its top-k cut at 16): ties wider
/// than a 16-wide top-k straddle the cut.
inline constexpr std::int64_t kTiesRowBlocks = 48;
/// DeepSeek-V3.2's selection width (index_topk 2048 tokens, 1-token blocks): the long theme's
/// topk over 1-token blocks, half its cases.
inline constexpr std::int64_t kTokenSelection = 2048;

/// A strided view of `config`'s K/V caches (SPEC 3) drawn from `seed`: each axis padded past the
/// extent of the axes inside it by 0-2 steps of 16 bytes (one axis, or the offset, surely), and an
/// offset of 0-3 steps into the buffer; the packed layouts keep K and V as the halves of a row. A
/// step of 16 bytes keeps every row as aligned as the dense layout has it.
spec::KvStrides draw_kv_strides(std::uint64_t seed, const spec::ModelConfig& config);
/// A strided view of `config`'s index-K cache (SPEC 3) drawn from `seed`: flat token rows and
/// blocks padded by 0-2 steps of 16 bytes (blockscale: blocks only), an offset of 0-2 steps, one of
/// them surely padded.
spec::IndexStrides draw_index_strides(std::uint64_t seed, const spec::ModelConfig& config);
/// The K/V and index-K views a case of `seed` uses: each override, else the strided theme's
/// (draw_kv_strides, and with sparse layers draw_index_strides, over the final geometry), else
/// dense. Every op's generator calls it last.
void choose_strides(std::uint64_t seed, const std::optional<spec::KvStrides>& kv_override,
                    const std::optional<spec::IndexStrides>& index_override,
                    spec::ModelConfig& config);

/// The seed of case `index` of a campaign started from `campaign_seed`: a hash of both, its theme
/// slot index % kThemeSlots.
std::uint64_t case_seed(std::uint64_t campaign_seed, std::uint64_t index);

}  // namespace kvo::oracle
