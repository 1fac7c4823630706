#include "kvo/oracle/reference_tier.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <optional>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/one_thread.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/reference/read_rules.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

/// A tier's answerer called on one thread of its own: workers prepare cases side by side, a GPU
/// subject is called one call at a time, and every call comes from the same host thread, so its
/// device memory pool and stream are one (kvo_gpu keeps one per host thread: sixteen workers
/// calling it would hold sixteen pools of device memory).
class OneThreadSubject final : public Subject {
 public:
  /// `busy_ns`: where the time spent answering adds up.
  OneThreadSubject(Subject& inner, std::atomic<std::int64_t>& busy_ns)
      : inner_(inner), busy_ns_(busy_ns) {}
  std::string name() const override { return inner_.name(); }
  std::string unavailable_reason() const override { return inner_.unavailable_reason(); }
  bool implements(spec::Op op) const override { return inner_.implements(op); }
  spec::Ordering ordering() const override { return inner_.ordering(); }
  /// Called on the caller's thread: a replay resident on the device calls it from its one thread.
  DeviceWriteFn device_write() const override { return inner_.device_write(); }
  bool device_concurrent() const override { return inner_.device_concurrent(); }
  DeviceIndexerFn device_indexer() const override { return inner_.device_indexer(); }
  DeviceAttentionFn device_attention() const override { return inner_.device_attention(); }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    call([&] { inner_.write_layer(config, write, caches); });
  }
  spec::HostTensor dense_insert(const spec::ModelConfig& config, const spec::DenseInsert& in,
                                spec::LayerCaches& caches) override {
    spec::HostTensor out;
    call([&] { out = inner_.dense_insert(config, in, caches); });
    return out;
  }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    std::vector<std::int32_t> ids;
    call([&] { ids = inner_.indexer(c); });
    return ids;
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    spec::HostTensor out;
    call([&] { out = inner_.attention(c, sel); });
    return out;
  }
  reference::TopkSelection indexer_selection(const ReadCase& c) override {
    reference::TopkSelection sel;
    call([&] { sel = inner_.indexer_selection(c); });
    return sel;
  }
  /// Runs `fn` on the subject's thread, not counted as answering, and waits for it.
  void run_on_thread(const std::function<void()>& fn) { thread_.post(fn).get(); }

 private:
  /// Runs `fn` on the subject's thread and waits for it; what it throws is rethrown here.
  void call(const std::function<void()>& fn) {
    // The time counted inside the task, before its caller is released (which may then destroy
    // the counter with the answerers).
    thread_
        .post([this, &fn] {
          struct Count {
            std::atomic<std::int64_t>& to;
            std::chrono::steady_clock::time_point from = std::chrono::steady_clock::now();
            ~Count() {
              to += std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - from)
                        .count();
            }
          } const count{busy_ns_};
          fn();
        })
        .get();
  }

  Subject& inner_;
  std::atomic<std::int64_t>& busy_ns_;
  OneThread thread_;  ///< last: joined before the rest goes
};

}  // namespace

ReferenceTier parse_tier(const std::string& name, bool gpu_answers) {
  if (name == "auto") return gpu_answers ? ReferenceTier::kGpu : ReferenceTier::kCpu;
  if (const std::optional<ReferenceTier> tier = spec::parse_enum<ReferenceTier>(name)) return *tier;
  throw spec::InvalidInput("tier", -1, name,
                           "expected " + spec::enum_choices<ReferenceTier>() + " or auto");
}

bool tier_sampled(std::int64_t index, std::int64_t first, std::int64_t every) {
  return index < first || (index - first) % every == 0;
}

void check_tier_sample(std::int64_t first, std::int64_t every) {
  if (every < 1) {
    throw spec::InvalidInput("tier_sample_every", -1, std::to_string(every), "must be >= 1");
  }
  if (first < 0) {
    throw spec::InvalidInput("tier_sample_first", -1, std::to_string(first), "must be >= 0");
  }
}

Subject* TierAnswerers::of(spec::Op op) const {
  const auto it = by_op.find(op);
  return it == by_op.end() ? nullptr : it->second;
}

void TierAnswerers::on_each_thread(const std::function<void()>& fn) const {
  // Every wrapper is a OneThreadSubject (gpu_tier_answerers makes them).
  for (const std::unique_ptr<Subject>& w : wrappers)
    static_cast<OneThreadSubject&>(*w).run_on_thread(fn);
}

TierAnswerers gpu_tier_answerers(SubjectList& subjects, const std::vector<spec::Op>& ops,
                                 const std::map<spec::Op, Subject*>& given,
                                 const std::vector<std::pair<const Subject*, spec::Op>>& judged) {
  TierAnswerers t;
  std::map<const Subject*, Subject*> wrapper_of;                // answering subject -> its wrapper
  std::map<std::string_view, const Subject*> answerer_of_kind;  // one answerer per case kind
  // Every answerer must run here: a tier that cannot is an error, never a silent fall back.
  for (const auto& [op, name] : kGpuTierAnswerers) {
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) continue;
    const auto it = given.find(op);
    Subject& answerer = it != given.end() ? *it->second : find_subject(subjects, std::string(name));
    if (!answerer.implements(op)) {
      throw spec::InvalidInput("tier", -1, answerer.name(),
                               "does not implement " + std::string(spec::name_of(op)));
    }
    const std::string_view kind = driver_of(op).case_kind();
    if (const auto [at, fresh] = answerer_of_kind.emplace(kind, &answerer);
        !fresh && at->second != &answerer) {
      throw spec::InvalidInput("tier", -1, answerer.name(),
                               "answers " + std::string(spec::name_of(op)) + " where " +
                                   at->second->name() + " answers another op of its " +
                                   std::string(kind) + " case: one answerer answers a case");
    }
    if (const std::string why = answerer.unavailable_reason(); !why.empty()) {
      throw spec::FailedToRun("the gpu tier cannot run here: its " +
                              std::string(spec::name_of(op)) + " answerer " + answerer.name() +
                              " is unavailable (" + why + "); --tier cpu runs the CPU reference");
    }
    Subject*& wrapper = wrapper_of[&answerer];
    if (wrapper == nullptr) {
      t.wrappers.push_back(std::make_unique<OneThreadSubject>(answerer, *t.busy_ns));
      wrapper = t.wrappers.back().get();
    }
    t.by_op[op] = wrapper;
    // Judged on any op of this case kind, the answerer would answer the case it is judged on.
    if (std::any_of(judged.begin(), judged.end(), [&](const auto& j) {
          return j.first == &answerer && driver_of(j.second).case_kind() == kind;
        }))
      t.self_judged.insert(op);
    t.names +=
        (t.names.empty() ? "" : ", ") + std::string(spec::name_of(op)) + ": " + answerer.name();
  }
  return t;
}

reference::TopkSelection selection_from_scores(const ReadCase& c, std::vector<std::int32_t> ids,
                                               const std::vector<float>& scores,
                                               std::int64_t max_n_valid) {
  const std::int64_t nkv = c.config.geometry.num_kv_heads;
  const std::vector<reference::QueryRow> rows = reference::query_rows(c.batch);
  reference::TopkSelection s;
  s.num_queries = static_cast<std::int64_t>(rows.size());
  s.num_kv_heads = nkv;
  s.topk = spec::selection_width(c.indexer, nkv);
  s.lanes = spec::selection_lanes(c.indexer, nkv);
  s.max_blocks = reference::max_valid_blocks(rows, c.indexer.sparse_block);
  s.ids = std::move(ids);
  s.scores.assign(static_cast<std::size_t>(s.num_queries * nkv * s.lanes * s.max_blocks),
                  -INFINITY);
  s.n_valid.assign(rows.size(), 0);
  const std::int64_t score_rows = nkv * s.lanes;
  if (scores.size() != static_cast<std::size_t>(s.num_queries * score_rows * max_n_valid)) {
    throw spec::InvalidInput("scores", -1, std::to_string(scores.size()),
                             "expected [" + std::to_string(s.num_queries) + ", " +
                                 std::to_string(score_rows) + ", " + std::to_string(max_n_valid) +
                                 "] floats");
  }
  for (std::int64_t q = 0; q < s.num_queries; ++q) {
    const reference::QueryRow& row = rows[static_cast<std::size_t>(q)];
    if (c.batch.seq_lens[static_cast<std::size_t>(row.request)] == 0) continue;  // padded row
    const std::int64_t n_valid = reference::n_valid_blocks(row.position, c.indexer.sparse_block);
    if (n_valid > max_n_valid) {
      throw spec::InvalidInput(
          "scores", q, std::to_string(max_n_valid),
          "narrower than the row's " + std::to_string(n_valid) + " valid blocks");
    }
    s.n_valid[static_cast<std::size_t>(q)] = n_valid;
    for (std::int64_t r = 0; r < score_rows; ++r)
      for (std::int64_t j = 0; j < n_valid; ++j)
        s.scores[reference::score_index(q, r, j, score_rows, s.max_blocks)] =
            scores[static_cast<std::size_t>((q * score_rows + r) * max_n_valid + j)];
  }
  return s;
}

}  // namespace kvo::oracle
