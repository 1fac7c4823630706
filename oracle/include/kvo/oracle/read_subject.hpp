#pragma once
/// \file read_subject.hpp
/// Read-side subjects: named implementations of the indexer with top-k and of attention. A subject
/// declares its ordering: canonical ones are diffed bit for bit, foreign ones against the float64
/// truth with the derived bound and with the tie-aware top-k rules (SPEC principle 4).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/reference/truth.hpp"

namespace kvo::oracle {

class ReadSubject {
 public:
  virtual ~ReadSubject() = default;
  virtual std::string name() const = 0;
  virtual std::string unavailable_reason() const { return {}; }
  virtual reference::Ordering ordering() const = 0;
  virtual TopkOrder topk_order() const { return TopkOrder::kAscendingIds; }
  /// Top-k ids [Tq, nkv, topk] of the case.
  virtual std::vector<std::int32_t> indexer(const ReadCase& c) = 0;
  /// Attention [Tq, nq, hd] in c.attention.out_dtype over `selection` (null: dense).
  virtual spec::HostTensor attention(const ReadCase& c,
                                     const reference::TopkSelection* selection) = 0;
};

/// Bugs that can be planted in the CPU subjects, modelled on real ones (anchors_kvcache.md 6).
struct ReadMutation {
  bool no_causal_mask = false;      ///< attention reads the whole selected block, future tokens too
  std::int64_t n_valid_offset = 0;  ///< the indexer's n_valid off by this much
  bool ignore_local = false;        ///< local blocks not forced
  bool ties_to_higher_id = false;   ///< canonical scores, but equal scores won by the higher id
  bool scale_twice = false;         ///< sm_scale applied twice
};

/// "cpu-naive-f32": float32 in the order a torch user writes it (sequential sums, std::exp, one
/// softmax over all tokens, top-k by descending score with ties to the higher id): a foreign
/// subject.
std::unique_ptr<ReadSubject> make_cpu_naive_subject(ReadMutation mutation = {},
                                                    std::string name = "cpu-naive-f32");

/// A canonical subject built from the reference with a planted bug (for exact-mode tests).
std::unique_ptr<ReadSubject> make_canonical_mutant(ReadMutation mutation, std::string name);

/// Every read subject this build knows, in a fixed order.
std::vector<std::unique_ptr<ReadSubject>> make_read_subjects();

}  // namespace kvo::oracle
