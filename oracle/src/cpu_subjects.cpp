#include "kvo/oracle/cpu_subjects.hpp"

#include <cmath>
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
    const reference::TopkSelection s =
        reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches);
    if (!m_.ties_to_higher_id) return s.ids;
    std::vector<std::int32_t> ids;
    for (std::int64_t q = 0; q < s.num_queries; ++q) {
      for (std::int64_t g = 0; g < s.num_kv_heads; ++g) {
        // Each lane's top-k by the reversed tie rule; their union ascending (SPEC 5).
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
        ids.insert(ids.end(), row.begin(), row.end());
      }
    }
    return ids;
  }

  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    spec::AttentionParams p = c.attention;
    if (m_.scale_twice) {
      const float sm = reference::default_sm_scale(c.config.geometry.head_dim);
      p.sm_scale = sm * sm;
    }
    return reference::attention(c.config, p, c.batch, c.q, c.caches, c.k_scale, c.v_scale, sel).out;
  }

 private:
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
