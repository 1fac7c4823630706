// The rules of SPEC 5 shared by the reference and the float64 truth.
#include "kvo/reference/read_rules.hpp"

#include <algorithm>

namespace kvo::reference {

std::vector<QueryRow> query_rows(const spec::ReadBatch& b) {
  std::vector<QueryRow> rows;
  for (std::int64_t r = 0; r < b.num_requests(); ++r) {
    const std::int64_t start = b.query_start_loc[static_cast<std::size_t>(r)];
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] - start;
    for (std::int64_t j = 0; j < q_len; ++j) {
      rows.push_back({r, b.seq_lens[static_cast<std::size_t>(r)] - q_len + j});
    }
  }
  return rows;
}

std::int64_t max_valid_blocks(const std::vector<QueryRow>& rows, std::int64_t sparse_block) {
  std::int64_t out = 0;
  for (const QueryRow& row : rows) out = std::max(out, n_valid_blocks(row.position, sparse_block));
  return out;
}

}  // namespace kvo::reference
