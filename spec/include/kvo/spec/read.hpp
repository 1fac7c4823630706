#pragma once
/// \file read.hpp
/// Plain data of the read side (SPEC 5-6): a batch of requests reading their paged caches through a
/// block table, the indexer's and attention's parameters and inputs, and their validators. Bad
/// input (block tables past the cache, sequence lengths beyond the table, topk 0, head counts that
/// do not divide) is rejected before anything runs.

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::spec {

/// How a float32 read-side computation is ordered (SPEC 1, principle 4), which decides how it is
/// judged: bit for bit against the reference, or against the float64 truth within a derived bound.
enum class Ordering : std::uint8_t {
  kCanonical,  ///< SPEC 6.1-6.3 exactly (8-wide fma groups, trees, polynomial exp)
  kForeign,    ///< any summation order, hardware exp2 (relative error <= 2^-22), any chunking
};

template <>
struct EnumInfo<Ordering> {
  static constexpr std::string_view kNoun = "ordering";
  static constexpr std::array<EnumName<Ordering>, 2> kNames{
      {{Ordering::kCanonical, "canonical"}, {Ordering::kForeign, "foreign"}}};
};

/// Requests of one step as the read side sees them. Query row i (of Tq) belongs to request r with
/// query_start_loc[r] <= i < query_start_loc[r + 1]; its position is p = seq_lens[r] - q_len_r + j
/// (j its index within the request). A request with seq_len 0 is a padded row: it selects nothing.
struct ReadBatch {
  std::int64_t max_blocks = 0;
  std::vector<std::int32_t> block_table;      ///< [B, max_blocks] physical blocks; -1 unused
  std::vector<std::int64_t> seq_lens;         ///< [B] tokens in the cache, the step's included
  std::vector<std::int64_t> query_start_loc;  ///< [B + 1], query_start_loc[0] = 0

  std::int64_t num_requests() const { return static_cast<std::int64_t>(seq_lens.size()); }
  std::int64_t num_queries() const { return query_start_loc.empty() ? 0 : query_start_loc.back(); }
};

/// Block top-k selection parameters (SPEC 5; MiniMax-M3 defaults).
struct IndexerParams {
  std::int64_t num_index_heads = 4;  ///< a multiple of num_kv_heads
  std::int64_t sparse_block = 128;   ///< selection granularity, independent of the page size
  std::int64_t topk = 16;
  std::int64_t init_blocks = 0;
  std::int64_t local_blocks = 1;
};

/// Attention parameters (SPEC 6).
struct AttentionParams {
  std::int64_t num_q_heads = 16;  ///< a multiple of num_kv_heads (GQA)
  std::int64_t sparse_block = 128;
  float sm_scale = 0.0f;  ///< 0: the default fl(1 / fl(sqrt(hd)))
  DType out_dtype = DType::kBF16;
};

/// Throws InvalidInput unless the batch is consistent with the cache: B >= 1 rows of max_blocks
/// entries; query_start_loc non-decreasing from 0; q_len_r <= seq_lens[r] unless seq_lens[r] is 0
/// (a padded row); seq_lens[r] <= max_blocks * block_size; every block-table
/// entry a request reads (the first ceil(seq_len / block_size)) in [0, num_blocks).
void validate_batch(const ModelConfig& config, const ReadBatch& batch);

/// Throws InvalidInput on topk < 1, sparse_block < 1, negative init/local blocks, or index heads
/// not a positive multiple of the KV heads.
void validate_indexer(const ModelConfig& config, const IndexerParams& params);

/// Throws InvalidInput on query heads not a positive multiple of the KV heads, sparse_block < 1, a
/// non-finite or negative sm_scale, or an output dtype that is not f32, bf16 or fp16.
void validate_attention(const ModelConfig& config, const AttentionParams& params);

}  // namespace kvo::spec
