#pragma once
/// \file read_case.hpp
/// Random read cases (SPEC 5-6): one sparse layer whose caches hold every request's tokens, written
/// through the reference write path from SPEC 8 values; a batch of decode (q_len 1), MTP (q_len >
/// 1) and prefill-chunk requests, padded rows included; index-Q and Q. A pure function of the seed.

#include <cstdint>
#include <optional>

#include "kvo/oracle/write_case.hpp"
#include "kvo/reference/generator.hpp"
#include "kvo/spec/read.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

struct ReadOverrides {
  std::optional<std::int64_t> block_size, sparse_block, num_kv_heads, group_size,
      index_heads_per_kv;
  std::optional<std::int64_t> head_dim, index_dim, topk, max_seq_len, requests;
  std::optional<spec::DType> kv_dtype;
  std::optional<spec::KvStrides> kv_strides;        ///< SPEC 3 strided K/V views
  std::optional<spec::IndexStrides> index_strides;  ///< SPEC 3 strided index-K view
  std::optional<spec::DType> index_dtype;           ///< flat index-K cache dtype
  std::optional<spec::KvLayout> layout;
  std::optional<spec::IndexLayout> index_layout;
  std::optional<bool> adversarial;      ///< large score spreads, near-ties and cancellation
  std::optional<bool> tied_scores;      ///< zero index-Q: every unforced block scores 0 (all ties)
  std::optional<std::int64_t> seq_len;  ///< every request (but padded rows) exactly this long
  /// Judge foreign attention under this arithmetic profile instead of the subject's declared one
  /// (SPEC principle 4); no effect on the case drawn. A canonical subject has no profile.
  std::optional<spec::AttentionProfile> profile;
  std::optional<spec::IndexNan> index_nan;                 ///< SPEC 5 index_nan
  std::optional<spec::IndexScoreScale> index_score_scale;  ///< SPEC 5 index_score_scale
  /// Some index-K rows hold a NaN (stored in the cache as NaN), so token scores are NaN and the
  /// index_nan rule decides; drawn in one case of four.
  std::optional<bool> nan_index_k;
  std::optional<spec::IndexGroup> index_group;     ///< SPEC 5 index_group
  std::optional<spec::IndexNegInf> index_neg_inf;  ///< SPEC 5 drop_neg_inf
  /// SPEC 5 index-Q type; e4m3 is drawn only over an e4m3 index-K cache.
  std::optional<spec::IndexQType> index_q;
  /// One logical block of one request scores -inf in every index head (its index-K rows
  /// [2^127, 0, ...] against index-Q rows whose dim 0 is -4: the dot overflows), where
  /// drop_neg_inf and keep differ; drawn in one case of four. Not reachable over a flat e4m3
  /// index-K cache (2^127 saturates to 448).
  std::optional<bool> neg_inf_block;
  /// SPEC 6: the order of the selection handed to attention (drawn per case otherwise).
  std::optional<spec::SelectionOrder> selection_order;

  /// Command-line flags of the read-only fields (--sparse-block, --topk, --group-size,
  /// --max-seq-len, --profile, --index-nan, ...); the fields shared with the write side come from
  /// CaseOverrides::to_flags.
  std::string to_flags() const;
};

/// How the selection handed to attention is drawn from the reference's (SPEC 6: the selection is
/// an input in its own right): its order, `extra` columns past the indexer's width, and what fills
/// each row past its chosen ids: -1, and with `past_n_valid` first ids that select nothing (one
/// just past n_valid, one past 1024 blocks, INT32_MAX), each once.
struct AttendedForm {
  spec::SelectionOrder order = spec::SelectionOrder::kAscendingIds;
  std::int64_t extra = 0;
  bool past_n_valid = false;
};

/// What a read case's sparse layer holds before it is written (SPEC 8): every token's rows
/// generated from `gen` under its key (K and index-K + 0, V + v_bias: reference::generated_rows'
/// bias), then `patches` stored over them in order (the planted NaN index-K values and -inf
/// blocks), then written through `slots`. make_read_case writes them through the reference write;
/// the GPU tier's resident path generates and writes the same bytes on the device.
struct ReadCaseValues {
  /// One element of a generated row overwritten: tensor field (reference::GenTensor: K 0, V 1,
  /// index-K 2), the token's row, the element within the row, its activation code.
  struct Patch {
    std::int32_t tensor = 2;
    std::int64_t row = 0, element = 0;
    std::uint32_t code = 0;
  };
  reference::ValueGenerator gen;
  std::vector<reference::RowKey> keys;  ///< [T] each token's (request, position)
  spec::SlotMapping slots;              ///< [T] where each is written
  float v_bias = 0.0f;
  std::vector<Patch> patches;
  /// The patches with every element named once (the last one naming it wins), in order.
  std::vector<Patch> distinct_patches() const;
};

struct ReadCase {
  std::uint64_t seed = 0;
  spec::ModelConfig config;
  spec::IndexerParams indexer;
  spec::AttentionParams attention;
  spec::ReadBatch batch;
  /// The sparse layer's buffers, written from `values` (make_read_case(..., kDeferred): not
  /// written; lazy storage holding nothing, not even the guard bands: the device poisons them).
  spec::LayerCaches caches;
  ReadCaseValues values;
  spec::HostTensor index_q;  ///< [Tq, num_index_heads, index_dim]
  spec::HostTensor q;        ///< [Tq, num_q_heads, head_dim]
  std::vector<float> k_scale, v_scale;
  AttendedForm attended;  ///< drawn per case; the reference's own rows by default (replay)
  /// The selection attention reads as a case file gives it, [Tq, nkv, attention_width]; empty:
  /// drawn from the reference's by `attended`.
  std::vector<std::int32_t> attention_ids;
  std::int64_t attention_width = 0;

  std::string describe() const;
};

/// `values`: kDeferred leaves the caches unwritten (the GPU tier writes them on the device from
/// ReadCase::values); index-Q and Q are generated either way.
ReadCase make_read_case(std::uint64_t seed, const ReadOverrides& overrides,
                        CaseValues values = CaseValues::kGenerated);

}  // namespace kvo::oracle
