#include "kvo/oracle/cpu_subjects.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "kvo/reference/layer_write.hpp"
#include "kvo/subjects/cpu_write.hpp"

namespace kvo::oracle {
namespace {

class NaiveSubject final : public Subject {
 public:
  NaiveSubject(ReadMutation m, std::string name, NaiveTopk topk = {})
      : m_(m), name_(std::move(name)), topk_(topk) {}
  std::string name() const override { return name_; }
  bool concurrent() const override { return true; }  // a pure CPU function
  bool implements(spec::Op op) const override {
    return op == spec::Op::kIndexer || (op == spec::Op::kAttention && !topk_.indexer_only);
  }
  spec::Ordering ordering() const override { return spec::Ordering::kForeign; }
  TopkForm topk_form() const override { return topk_.declared; }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    const std::vector<std::int32_t> rows = subjects::naive_indexer(
        c.config, c.indexer, c.batch, c.index_q, c.caches, m_,
        topk_.ranked_key_bits > 0 ? topk_.ranked_key_bits : topk_.declared.key_bits);
    const spec::TopkLayout written = topk_.written.value_or(topk_.declared.layout);
    if (written == spec::TopkLayout::kTokenMajor) return rows;
    // Rows [Tq, nkv, width] laid out as the subject writes them.
    const std::int64_t tq = c.batch.num_queries(), nkv = c.config.geometry.num_kv_heads,
                       width = spec::selection_width(c.indexer, nkv);
    std::vector<std::int32_t> out(rows.size());
    for (std::int64_t q = 0; q < tq; ++q)
      for (std::int64_t g = 0; g < nkv; ++g)
        for (std::int64_t k = 0; k < width; ++k)
          out[static_cast<std::size_t>(spec::topk_offset(written, q, g, k, tq, nkv, width))] =
              rows[static_cast<std::size_t>((q * nkv + g) * width + k)];
    return out;
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    return subjects::naive_attention(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale,
                                     c.v_scale, sel, m_);
  }

 private:
  ReadMutation m_;
  std::string name_;
  NaiveTopk topk_;
};

/// A flash-style attention under its declared profile (subjects::flash_attention).
class FlashSubject final : public Subject {
 public:
  FlashSubject(std::string name, spec::AttentionProfile profile, spec::AttentionBug bug)
      : name_(std::move(name)), profile_(profile), bug_(bug) {}
  std::string name() const override { return name_; }
  bool concurrent() const override { return true; }  // a pure CPU function
  bool implements(spec::Op op) const override { return op == spec::Op::kAttention; }
  spec::Ordering ordering() const override { return spec::Ordering::kForeign; }
  spec::AttentionProfile attention_profile() const override { return profile_; }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    return subjects::flash_attention(c.config, c.attention, c.batch, c.q, c.caches, c.k_scale,
                                     c.v_scale, sel, profile_, bug_);
  }

 private:
  std::string name_;
  spec::AttentionProfile profile_;
  spec::AttentionBug bug_;
};

class DenseSubject final : public Subject {
 public:
  DenseSubject(DenseMutation m, std::string name, subjects::DenseArithmetic arithmetic)
      : m_(m), name_(std::move(name)), arithmetic_(arithmetic) {}
  std::string name() const override { return name_; }
  bool concurrent() const override { return true; }  // a pure CPU function
  bool implements(spec::Op op) const override { return op == spec::Op::kDense; }
  spec::Ordering ordering() const override {
    return arithmetic_ == subjects::DenseArithmetic::kCanonical ? spec::Ordering::kCanonical
                                                                : spec::Ordering::kForeign;
  }
  spec::HostTensor dense_insert(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                spec::LayerCaches& caches) override {
    return subjects::dense_insert_fused(c, in, caches, m_, arithmetic_);
  }

 private:
  DenseMutation m_;
  std::string name_;
  subjects::DenseArithmetic arithmetic_;
};

/// The reference with one planted bug: the indexer's tie rule reversed (from the reference's own
/// scores) or the local block unforced; attention with sm_scale applied twice.
class CanonicalMutant final : public Subject {
 public:
  CanonicalMutant(ReadMutation m, std::string name) : m_(m), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  bool concurrent() const override { return true; }  // a pure CPU function
  bool implements(spec::Op op) const override {
    return op == spec::Op::kIndexer || op == spec::Op::kAttention;
  }

  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    reference::TopkSelection s =
        reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
    if (!m_.ties_to_higher_id && !m_.wide_ties_to_higher_id && m_.kept_at_most == 0) return s.ids;
    for (std::int64_t q = 0; q < s.num_queries; ++q) {
      for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
        const auto row = s.ids.begin() + (q * s.num_kv_heads + g) * s.topk;
        if (m_.ties_to_higher_id || (m_.wide_ties_to_higher_id && wide_tie(s, q, g, c))) {
          const std::vector<std::int32_t> reversed = reversed_ties(s, q, g, c);
          std::copy(reversed.begin(), reversed.end(), row);
        }
        if (m_.kept_at_most > 0 && m_.kept_at_most < s.topk)
          std::fill(row + m_.kept_at_most, row + s.topk, -1);
      }
    }
    return s.ids;
  }

  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    spec::AttentionParams p = c.attention;
    if (m_.scale_twice) {
      const float sm = reference::default_sm_scale(c.config.geometry.head_dim);
      p.sm_scale = sm * sm;
    }
    std::optional<reference::TopkSelection> trailing;
    if (m_.masked_entries_trailing && sel != nullptr) {
      // Each row's first n entries, n its ids >= 0: what a kernel that takes masked entries to
      // trail reads.
      trailing = *sel;
      for (std::size_t r = 0; r + static_cast<std::size_t>(sel->topk) <= sel->ids.size();
           r += static_cast<std::size_t>(sel->topk)) {
        const auto row = trailing->ids.begin() + static_cast<std::ptrdiff_t>(r);
        const auto n = std::count_if(row, row + sel->topk, [](std::int32_t id) { return id >= 0; });
        std::fill(row + n, row + sel->topk, -1);
      }
      sel = &*trailing;
    }
    return reference::attention(c.config, p, c.batch, c.q, c.caches, c.k_scale, c.v_scale, sel).out;
  }

 private:
  /// Whether row (q, g) of `s` has, in some lane, more than 16 blocks tied at its cut with some of
  /// them kept and some not.
  static bool wide_tie(const reference::TopkSelection& s, std::int64_t q, std::int64_t g,
                       const ReadCase& c) {
    const std::int64_t n_valid = s.n_valid[static_cast<std::size_t>(q)];
    const std::int64_t k_eff = std::min(c.indexer.topk, n_valid);
    if (k_eff == 0) return false;
    for (std::int64_t l = 0; l < s.lanes; ++l) {
      std::vector<float> v;
      for (std::int64_t j = 0; j < n_valid; ++j) v.push_back(s.score(q, g, j, l));
      std::vector<float> order = v;
      std::nth_element(order.begin(), order.begin() + (k_eff - 1), order.end(), std::greater<>());
      const float cut = order[static_cast<std::size_t>(k_eff - 1)];
      const auto above = std::count_if(v.begin(), v.end(), [&](float x) { return x > cut; });
      const auto tied = std::count(v.begin(), v.end(), cut);
      if (tied > 16 && tied > k_eff - above) return true;
    }
    return false;
  }

  /// Row (q, g) chosen by the reversed tie rule (equal scores won by the higher id): each lane's
  /// top-k, their union ascending (SPEC 5), then -1.
  static std::vector<std::int32_t> reversed_ties(const reference::TopkSelection& s, std::int64_t q,
                                                 std::int64_t g, const ReadCase& c) {
    std::set<std::int32_t> chosen;
    for (std::int64_t l = 0; l < s.lanes; ++l) {
      std::vector<float> scores;
      for (std::int64_t j = 0; j < s.n_valid[static_cast<std::size_t>(q)]; ++j)
        scores.push_back(s.score(q, g, j, l));
      for (std::int32_t id : subjects::select_topk(scores, c.indexer.topk, true, true)) {
        const bool dropped = id >= 0 && c.indexer.neg_inf == spec::IndexNegInf::kDrop &&
                             scores[static_cast<std::size_t>(id)] == -INFINITY;
        if (id >= 0 && !dropped) chosen.insert(id);
      }
    }
    std::vector<std::int32_t> row(chosen.begin(), chosen.end());
    row.resize(static_cast<std::size_t>(s.topk), -1);
    return row;
  }

  ReadMutation m_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Subject> make_cpu_naive_subject(ReadMutation mutation, std::string name) {
  return std::make_unique<NaiveSubject>(mutation, std::move(name));
}

std::unique_ptr<Subject> make_cpu_naive_indexer(std::string name, NaiveTopk topk) {
  return std::make_unique<NaiveSubject>(ReadMutation{}, std::move(name), topk);
}

std::unique_ptr<Subject> make_cpu_flash_subject(std::string name, spec::AttentionProfile profile,
                                                spec::AttentionBug bug) {
  return std::make_unique<FlashSubject>(std::move(name), profile, bug);
}

std::unique_ptr<Subject> make_canonical_mutant(ReadMutation mutation, std::string name) {
  return std::make_unique<CanonicalMutant>(mutation, std::move(name));
}

std::unique_ptr<Subject> make_cpu_dense_subject(DenseMutation mutation, std::string name,
                                                subjects::DenseArithmetic arithmetic) {
  return std::make_unique<DenseSubject>(mutation, std::move(name), arithmetic);
}

SubjectList make_cpu_subjects() {
  SubjectList out;
  out.push_back(make_function_subject("cpu-fused", subjects::write_layer_fused, true));
  out.push_back(make_function_subject(
      "cpu-unfused",
      [](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& caches) {
        subjects::write_layer_unfused(c, w, caches);
      },
      true));
  out.push_back(make_cpu_dense_subject());
  out.push_back(make_cpu_dense_subject({}, "cpu-dense-engine", subjects::DenseArithmetic::kEngine));
  out.push_back(make_cpu_naive_subject());
  for (const auto& [name, form] : kNaiveIndexerForms)
    out.push_back(make_cpu_naive_indexer(name, {form, std::nullopt, true}));
  out.push_back(make_cpu_flash_subject("cpu-flash-bf16", spec::AttentionProfile::kBf16P));
  out.push_back(make_cpu_flash_subject("cpu-flash-fp16", spec::AttentionProfile::kFp16P));
  return out;
}

}  // namespace kvo::oracle
