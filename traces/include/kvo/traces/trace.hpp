#pragma once
/// \file trace.hpp
/// A serving trace: the model configuration and, per engine step, the slot mapping and the batch
/// metadata an attention backend sees (block table, sequence lengths, query start locations).
/// Stored as a safetensors file (docs/trace-format.md gives the format); read strictly: a file that
/// parses is structurally sound (every per-token quantity can be computed without a bounds check),
/// and everything else is spec::InvalidInput naming the tensor or byte offset. Whether its slots
/// are *legal* for the cache is trace validate's job (analysis.hpp), so that a broken engine
/// capture can still be loaded and explained.

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/dense_insert.hpp"
#include "kvo/spec/metadata.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/types.hpp"

namespace kvo::traces {

/// An integer tensor; values are held as int64 whatever the storage type. The storage type is the
/// contract's integer type spec::SlotType (I32 or I64 in the file), for every tensor of a trace,
/// not only the slot mappings.
struct IntTensor {
  spec::SlotType type = spec::SlotType::kI32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> values;  ///< row-major, prod(shape) values

  std::int64_t dim(std::size_t i) const { return shape.at(i); }
  bool operator==(const IntTensor&) const = default;
};

/// One engine step. B requests in the batch, T slot-mapping entries (T >= the step's real tokens;
/// the tail past query_start_loc[B] is CUDA-graph padding).
struct TraceStep {
  IntTensor slot_mapping;                       ///< [T], the model's slot type
  std::optional<IntTensor> index_slot_mapping;  ///< [T], iff config.separate_index_slots
  IntTensor block_table;                        ///< [B, max_blocks]
  IntTensor seq_lens;                           ///< [B], tokens of each request after the step
  std::optional<IntTensor> query_start_loc;     ///< [B+1]; exactly one of this and query_lens
  std::optional<IntTensor> query_lens;          ///< [B]
  std::optional<IntTensor> request_ids;         ///< [B]; absent: the batch index is the id
  std::optional<IntTensor> topk_ids;            ///< [T, k], the engine's own top-k (not replayed)

  std::int64_t batch() const { return seq_lens.values.empty() ? 0 : seq_lens.dim(0); }
  std::int64_t tokens() const { return slot_mapping.dim(0); }
  /// Start of request b's tokens in the slot mapping ([B+1], from either form).
  std::vector<std::int64_t> starts() const;
  /// The id the value generator keys request b's tokens with.
  std::int64_t request_id(std::int64_t b) const {
    return request_ids ? request_ids->values[static_cast<std::size_t>(b)] : b;
  }
  bool operator==(const TraceStep&) const = default;
};

/// The read side of the traced model (SPEC 5-6), which read replay runs with. Optional metadata
/// keys: a trace without them gets these defaults. Head counts of 0 mean the smallest multiple of
/// num_kv_heads that is at least the SPEC default (4 index heads, 16 query heads), so a default
/// always fits the geometry.
struct TraceReadParams {
  std::int64_t num_index_heads = 0;
  std::int64_t num_q_heads = 0;
  std::int64_t sparse_block = 128;
  std::int64_t topk = 16;
  std::int64_t init_blocks = 0;
  std::int64_t local_blocks = 1;
  float sm_scale = 0.0f;  ///< 0: the default fl(1 / fl(sqrt(head_dim)))
  spec::DType out_dtype = spec::DType::kBF16;
  /// 0: dense layers are plain writes (SPEC 4). Even, in [2, head_dim]: dense layers are written by
  /// the fused qknorm + rope + insert (SPEC 4, vLLM MiniMax-M3) rotating this many dims, and replay
  /// judges them through the dense op.
  std::int64_t dense_rotary_dim = 0;
  /// The indexer's modes (SPEC 5); metadata keys index_nan, index_score_scale, index_group,
  /// index_neg_inf and index_q, written only when not the default.
  spec::IndexNan index_nan = spec::IndexNan::kSkip;
  spec::IndexScoreScale index_score_scale = spec::IndexScoreScale::kOne;
  spec::IndexGroup index_group = spec::IndexGroup::kMax;
  spec::IndexNegInf index_neg_inf = spec::IndexNegInf::kKeep;
  spec::IndexQType index_q = spec::IndexQType::kActivation;
  /// The fused dense insert's fp8 store (SPEC 4): metadata key dense_fp8_store, written only when
  /// not the default.
  spec::DenseFp8Store dense_fp8_store = spec::DenseFp8Store::kScaled;
  bool operator==(const TraceReadParams&) const = default;
};

/// `f(key, member)` for each mode of TraceReadParams (the indexer's, then the dense insert's): the
/// one table the metadata codec reads and writes.
template <class F>
void for_each_read_mode(F&& f) {
  f("index_nan", &TraceReadParams::index_nan);
  f("index_score_scale", &TraceReadParams::index_score_scale);
  f("index_group", &TraceReadParams::index_group);
  f("index_neg_inf", &TraceReadParams::index_neg_inf);
  f("index_q", &TraceReadParams::index_q);
  f("dense_fp8_store", &TraceReadParams::dense_fp8_store);
}

struct Trace {
  spec::ModelConfig config;
  TraceReadParams read;
  std::string engine = "kvoracle-sim";
  std::string engine_version = "0";
  std::vector<float> k_scale{1.0f};  ///< [1] or [nkv]
  std::vector<float> v_scale{1.0f};
  /// Metadata keys the format does not define (capture notes, simulator knobs); kept verbatim.
  std::map<std::string, std::string> extra;
  std::vector<TraceStep> steps;

  bool operator==(const Trace& o) const;
};

/// The optional __metadata__ keys of TraceReadParams (every other configuration key is required).
inline const std::vector<std::string> kReadParamKeys{
    "num_index_heads",  "num_q_heads",  "sparse_block",      "topk",
    "init_blocks",      "local_blocks", "sm_scale",          "out_dtype",
    "dense_rotary_dim", "index_nan",    "index_score_scale", "index_group",
    "index_neg_inf",    "index_q",      "dense_fp8_store"};

/// The optional __metadata__ keys of the write modes added after format 1 was fixed (SPEC 2):
/// written only when not the default, so older traces keep their bytes; absent means the default.
/// The configuration codec's list (spec/metadata.hpp).
inline const std::vector<std::string> kOptionalModeKeys{spec::kOptionalConfigKeys.begin(),
                                                        spec::kOptionalConfigKeys.end()};

/// The indexer and attention parameters of a trace, head counts resolved against its geometry.
spec::IndexerParams indexer_params(const Trace& trace);
spec::AttentionParams attention_params(const Trace& trace);

/// Format identifier in __metadata__["format"].
inline constexpr std::string_view kTraceFormat = "kvoracle-trace/1";

/// Parses a trace file held in memory. Throws spec::InvalidInput (see file comment).
Trace parse_trace(std::span<const std::uint8_t> bytes);
/// Serialises a trace. Throws spec::InvalidInput when the trace would not parse back (so a
/// program can never write a file its own reader rejects).
std::vector<std::uint8_t> serialize_trace(const Trace& trace);

/// Reads and parses a file; a missing or unreadable file is InvalidInput naming the path.
Trace load_trace(const std::filesystem::path& path);
/// Writes to a temporary file next to `path` and renames it over `path`: a failure never leaves a
/// partial trace behind.
void save_trace(const Trace& trace, const std::filesystem::path& path);

/// The metadata map of a trace's configuration (what serialize_trace writes to __metadata__).
std::map<std::string, std::string> trace_metadata(const Trace& trace);

}  // namespace kvo::traces
