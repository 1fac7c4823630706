#include "kvo/oracle/shrink.hpp"

#include <functional>

#include "kvo/reference/generator.hpp"

namespace kvo::oracle {
namespace {

/// Seeds tried under a candidate reduction: the failing one, then a few derived from it.
constexpr int kSeedsPerCandidate = 12;

struct Candidate {
  std::function<bool(const CaseOverrides&, const ReadOverrides&)> applies;
  std::function<void(CaseOverrides&, ReadOverrides&)> apply;
};

template <class T>
Candidate set_write(std::optional<T> CaseOverrides::*field, T value) {
  return {[field, value](const CaseOverrides& o, const ReadOverrides&) {
            return !(o.*field) || *(o.*field) != value;
          },
          [field, value](CaseOverrides& o, ReadOverrides&) { o.*field = value; }};
}
template <class T>
Candidate set_read(std::optional<T> ReadOverrides::*field, T value) {
  return {[field, value](const CaseOverrides&, const ReadOverrides& r) {
            return !(r.*field) || *(r.*field) != value;
          },
          [field, value](CaseOverrides&, ReadOverrides& r) { r.*field = value; }};
}

std::vector<Candidate> candidates(const std::string& op) {
  std::vector<Candidate> c;
  if (op == "write") {
    for (const char* mix : {"S", "D"})
      c.push_back(set_write(&CaseOverrides::layers, std::string(mix)));
    for (std::int64_t t : {1, 2, 4, 8}) c.push_back(set_write(&CaseOverrides::tokens, t));
    c.push_back(set_write(&CaseOverrides::requests, std::int64_t{1}));
    c.push_back(set_write(&CaseOverrides::num_kv_heads, std::int64_t{1}));
    c.push_back(set_write(&CaseOverrides::head_dim, std::int64_t{8}));
    for (std::int64_t b : {1, 2, 4, 8, 16}) c.push_back(set_write(&CaseOverrides::block_size, b));
    c.push_back(set_write(&CaseOverrides::edge_values, false));
    c.push_back(set_write(&CaseOverrides::per_head_scale, false));
    c.push_back(set_write(&CaseOverrides::separate_index_slots, false));
    c.push_back(set_write(&CaseOverrides::scale_mode, spec::ScaleMode::kNone));
    c.push_back(set_write(&CaseOverrides::via_model_dtype, false));
    c.push_back(set_write(&CaseOverrides::index_layout, spec::IndexLayout::kFlat));
    c.push_back(set_write(&CaseOverrides::index_dim, std::int64_t{8}));
  } else {
    c.push_back(set_read(&ReadOverrides::requests, std::int64_t{1}));
    for (std::int64_t s : {2, 8, 32}) c.push_back(set_read(&ReadOverrides::max_seq_len, s));
    c.push_back(set_write(&CaseOverrides::num_kv_heads, std::int64_t{1}));
    c.push_back(set_read(&ReadOverrides::group_size, std::int64_t{1}));
    c.push_back(set_read(&ReadOverrides::index_heads_per_kv, std::int64_t{1}));
    c.push_back(set_write(&CaseOverrides::head_dim, std::int64_t{8}));
    for (std::int64_t k : {1, 2}) c.push_back(set_read(&ReadOverrides::topk, k));
    for (std::int64_t sb : {1, 2, 4}) c.push_back(set_read(&ReadOverrides::sparse_block, sb));
    c.push_back(set_write(&CaseOverrides::block_size, std::int64_t{1}));
    c.push_back(set_read(&ReadOverrides::adversarial, false));
  }
  return c;
}

}  // namespace

std::optional<ShrunkCase> shrink_failure(const CheckOptions& base, std::uint64_t seed,
                                         const std::string& subject, const std::string& op,
                                         std::vector<std::unique_ptr<WriteSubject>>& writes,
                                         std::vector<std::unique_ptr<ReadSubject>>& reads) {
  ShrunkCase cur;
  cur.seed = seed;
  cur.overrides = base.overrides;
  cur.read_overrides = base.read_overrides;
  // Runs one case; the first failure text when it does not pass. Overrides that make a case
  // impossible (e.g. more tokens than a fixed cache holds) count as "does not fail".
  auto fails = [&](std::uint64_t s, const CaseOverrides& o, const ReadOverrides& r,
                   std::string* failure) {
    CheckOptions one;
    one.case_seed = s;
    one.overrides = o;
    one.read_overrides = r;
    one.subjects = {subject};
    one.ops = {op};
    ++cur.attempts;
    try {
      const CheckReport rep = run_check(one, writes, reads);
      if (rep.worst == spec::Outcome::kPass || rep.worst == spec::Outcome::kUnsupported)
        return false;
      for (const auto& sub : rep.subjects) {
        if (!sub.first_failure.empty() && failure != nullptr) *failure = sub.first_failure;
      }
      return true;
    } catch (const spec::InvalidInput&) {
      return false;
    }
  };
  if (!fails(seed, cur.overrides, cur.read_overrides, &cur.first_failure)) return std::nullopt;
  for (const Candidate& c : candidates(op)) {
    if (!c.applies(cur.overrides, cur.read_overrides)) continue;
    CaseOverrides o = cur.overrides;
    ReadOverrides r = cur.read_overrides;
    c.apply(o, r);
    for (int k = 0; k < kSeedsPerCandidate; ++k) {
      const std::uint64_t s =
          k == 0 ? cur.seed : reference::mix64(cur.seed + static_cast<std::uint64_t>(k));
      std::string failure;
      if (fails(s, o, r, &failure)) {
        cur.seed = s;
        cur.overrides = o;
        cur.read_overrides = r;
        cur.first_failure = failure;
        ++cur.steps;
        break;
      }
    }
  }
  CheckOptions shown;
  shown.overrides = cur.overrides;
  shown.read_overrides = cur.read_overrides;
  cur.command = repro_command(shown, cur.seed, subject, op);
  return cur;
}

}  // namespace kvo::oracle
