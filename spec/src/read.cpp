#include "kvo/spec/read.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvo/spec/outcome.hpp"

namespace kvo::spec {

void validate_batch(const ModelConfig& c, const ReadBatch& b) {
  validate(c);
  const std::int64_t nreq = b.num_requests();
  if (nreq < 1)
    throw InvalidInput("seq_lens", -1, "0 requests", "a batch needs at least one request");
  if (b.max_blocks < 1) {
    throw InvalidInput("block_table", -1, std::to_string(b.max_blocks) + " columns",
                       "needs at least one column");
  }
  if (static_cast<std::int64_t>(b.block_table.size()) != nreq * b.max_blocks) {
    throw InvalidInput(
        "block_table", -1, std::to_string(b.block_table.size()) + " entries",
        "expected [" + std::to_string(nreq) + ", " + std::to_string(b.max_blocks) + "]");
  }
  if (static_cast<std::int64_t>(b.query_start_loc.size()) != nreq + 1 ||
      b.query_start_loc[0] != 0) {
    throw InvalidInput("query_start_loc", -1, std::to_string(b.query_start_loc.size()) + " entries",
                       "expected " + std::to_string(nreq + 1) + " entries starting at 0");
  }
  const std::int64_t bs = c.geometry.block_size;
  for (std::int64_t r = 0; r < nreq; ++r) {
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                               b.query_start_loc[static_cast<std::size_t>(r)];
    const std::int64_t seq = b.seq_lens[static_cast<std::size_t>(r)];
    if (q_len < 0) {
      throw InvalidInput(
          "query_start_loc", r + 1,
          std::to_string(b.query_start_loc[static_cast<std::size_t>(r + 1)]),
          "decreases: request " + std::to_string(r) + " would have a negative query length");
    }
    if (seq < 0 || (seq > 0 && seq < q_len)) {  // seq_len 0 is a padded row, whatever its queries
      throw InvalidInput("seq_lens", r, std::to_string(seq),
                         "shorter than the request's " + std::to_string(q_len) + " query tokens");
    }
    if (seq > b.max_blocks * bs) {
      throw InvalidInput("seq_lens", r, std::to_string(seq),
                         "beyond the block table: " + std::to_string(b.max_blocks) + " blocks of " +
                             std::to_string(bs));
    }
    for (std::int64_t j = 0; j < (seq + bs - 1) / bs; ++j) {
      const std::int64_t i = r * b.max_blocks + j;
      const std::int32_t blk = b.block_table[static_cast<std::size_t>(i)];
      if (blk < 0 || blk >= c.geometry.num_blocks) {
        throw InvalidInput("block_table", i, std::to_string(blk),
                           "request " + std::to_string(r) + " block " + std::to_string(j) +
                               " points past the cache of " +
                               std::to_string(c.geometry.num_blocks) + " blocks");
      }
    }
  }
}

float index_score_factor(IndexScoreScale scale, std::int64_t index_dim) {
  if (scale == IndexScoreScale::kOne) return 1.0f;
  // As the engines compute it: index_dim ** -0.5 in double (Python), handed to an fp32 kernel.
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(index_dim)));
}

void validate_indexer(const ModelConfig& c, const IndexerParams& p) {
  auto require = [](bool ok, const char* field, std::int64_t v, const char* why) {
    if (!ok) throw InvalidInput(field, -1, std::to_string(v), why);
  };
  require(p.topk >= 1, "topk", p.topk, "must be >= 1");
  require(p.sparse_block >= 1, "sparse_block", p.sparse_block, "must be >= 1");
  require(p.init_blocks >= 0, "init_blocks", p.init_blocks, "must be >= 0");
  require(p.local_blocks >= 0, "local_blocks", p.local_blocks, "must be >= 0");
  require(p.num_index_heads >= 1 && p.num_index_heads % c.geometry.num_kv_heads == 0,
          "num_index_heads", p.num_index_heads, "must be a positive multiple of num_kv_heads");
  const bool e4m3_index_k =
      c.index.layout == IndexLayout::kBlockScale || c.index.flat_dtype == DType::kFp8E4M3;
  if (p.index_q_type == IndexQType::kFp8E4m3 && !e4m3_index_k) {
    throw InvalidInput("index_q", -1, "e4m3",
                       "fp8 index-Q needs an e4m3 index-K cache (blockscale, or flat fp8_e4m3); "
                       "this one is flat " +
                           std::string(name_of(c.index.flat_dtype)));
  }
}

std::int64_t selection_lanes(const IndexerParams& p, std::int64_t num_kv_heads) {
  return p.index_group == IndexGroup::kUnion ? p.num_index_heads / num_kv_heads : 1;
}

std::int64_t selection_width(const IndexerParams& p, std::int64_t num_kv_heads) {
  return p.topk * selection_lanes(p, num_kv_heads);
}

std::string topk_form_text(const TopkForm& f) {
  std::string s(name_of(f.order));
  if (f.layout != TopkLayout::kTokenMajor) s += "," + std::string(name_of(f.layout));
  if (f.key_bits != 32) s += ",keys" + std::to_string(f.key_bits);
  return s;
}

TopkForm parse_topk_form(std::string_view text, const std::string& field) {
  auto bad = [&](const std::string& why) {
    return InvalidInput(field, -1, std::string(text),
                        why + " (expected <order>[,<layout>][,keys<N>]: order " +
                            enum_choices<TopkOrder>() + ", layout " + enum_choices<TopkLayout>() +
                            ", N " + std::to_string(TopkForm::kMinKeyBits) + "..32)");
  };
  TopkForm f;
  std::size_t at = 0;
  for (int part = 0; at <= text.size(); ++part) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view word = text.substr(at, comma - at);
    at = comma + 1;
    if (part == 0) {
      const auto order = parse_enum<TopkOrder>(word);
      if (!order) throw bad("no order '" + std::string(word) + "'");
      f.order = *order;
    } else if (const auto layout = parse_enum<TopkLayout>(word)) {
      f.layout = *layout;
    } else if (word.starts_with("keys")) {
      const std::string digits(word.substr(4));
      const bool numeric = !digits.empty() && digits.size() <= 2 &&
                           digits.find_first_not_of("0123456789") == std::string::npos;
      f.key_bits = numeric ? std::stoi(digits) : -1;
      if (f.key_bits < TopkForm::kMinKeyBits || f.key_bits > 32)
        throw bad("key precision '" + std::string(word) + "' out of range");
    } else {
      throw bad("unknown part '" + std::string(word) + "'");
    }
  }
  return f;
}

std::int64_t topk_offset(TopkLayout layout, std::int64_t q, std::int64_t g, std::int64_t k,
                         std::int64_t num_queries, std::int64_t num_kv_heads, std::int64_t width) {
  return (layout == TopkLayout::kHeadMajor ? g * num_queries + q : q * num_kv_heads + g) * width +
         k;
}

float topk_score_key(float score, int key_bits) {
  if (key_bits >= 32 || std::isnan(score) || score == -INFINITY) return score;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &score, 4);
  std::uint32_t image = (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
  image &= ~0u << (32 - key_bits);
  bits = (image & 0x80000000u) ? image & 0x7FFFFFFFu : ~image;
  float key = 0.0f;
  std::memcpy(&key, &bits, 4);
  return std::isnan(key) ? -INFINITY : key;
}

double topk_key_step(double x, int key_bits) {
  if (key_bits >= 32) return 0.0;
  // Infinities are keys of their own; past the largest binade the step stays that binade's.
  const int binade = x == 0.0 ? -126 : std::isinf(x) ? 127 : std::clamp(std::ilogb(x), -126, 127);
  return std::ldexp(1.0, binade - (key_bits - TopkForm::kMinKeyBits));
}

DType index_q_dtype(const ModelConfig& c, const IndexerParams& p) {
  return p.index_q_type == IndexQType::kFp8E4m3 ? DType::kFp8E4M3 : c.act_dtype;
}

void validate_attention(const ModelConfig& c, const AttentionParams& p) {
  if (p.num_q_heads < 1 || p.num_q_heads % c.geometry.num_kv_heads != 0) {
    throw InvalidInput("num_q_heads", -1, std::to_string(p.num_q_heads),
                       "must be a positive multiple of num_kv_heads");
  }
  if (p.sparse_block < 1)
    throw InvalidInput("sparse_block", -1, std::to_string(p.sparse_block), "must be >= 1");
  if (!std::isfinite(p.sm_scale) || p.sm_scale < 0.0f) {
    throw InvalidInput("sm_scale", -1, std::to_string(p.sm_scale),
                       "must be finite and >= 0 (0: default)");
  }
  if (!format_of(p.out_dtype).is_activation) {
    throw InvalidInput("out_dtype", -1, std::string(name_of(p.out_dtype)),
                       "attention outputs f32, bf16 or fp16");
  }
}

}  // namespace kvo::spec
