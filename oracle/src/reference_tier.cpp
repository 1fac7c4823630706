#include "kvo/oracle/reference_tier.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "kvo/oracle/campaign.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

/// A tier's answerer called on one thread of its own: workers prepare cases side by side, a GPU
/// subject is called one call at a time, and every call comes from the same host thread, so its
/// device memory pool and stream are one (kvo_gpu keeps one per host thread: sixteen workers
/// calling it would hold sixteen pools of device memory).
class OneThreadSubject final : public Subject {
 public:
  explicit OneThreadSubject(Subject& inner) : inner_(inner), thread_([this] { serve(); }) {}
  ~OneThreadSubject() override {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    ready_.notify_all();
    thread_.join();
  }
  std::string name() const override { return inner_.name(); }
  std::string unavailable_reason() const override { return inner_.unavailable_reason(); }
  bool implements(spec::Op op) const override { return inner_.implements(op); }
  spec::Ordering ordering() const override { return inner_.ordering(); }
  /// Called on the caller's thread: a replay resident on the device calls it from its one thread.
  DeviceWriteFn device_write() const override { return inner_.device_write(); }
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

 private:
  /// Runs `fn` on the subject's thread and waits for it; what it throws is rethrown here.
  void call(const std::function<void()>& fn) {
    std::packaged_task<void()> task(fn);
    std::future<void> done = task.get_future();
    {
      const std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    ready_.notify_all();
    done.get();
  }
  void serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ready_.wait(lock, [&] { return done_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      std::packaged_task<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  Subject& inner_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> tasks_;
  bool done_ = false;
  std::thread thread_;  ///< last: started once the rest exists
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
  return it == by_op.end() ? nullptr : it->second.get();
}

TierAnswerers gpu_tier_answerers(SubjectList& subjects, const std::vector<spec::Op>& ops,
                                 const std::map<spec::Op, Subject*>& given,
                                 const std::vector<std::pair<const Subject*, spec::Op>>& judged) {
  TierAnswerers t;
  // Every answerer must run here: a tier that cannot is an error, never a silent fall back.
  for (const auto& [op, name] : kGpuTierAnswerers) {
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) continue;
    const auto it = given.find(op);
    Subject& answerer = it != given.end() ? *it->second : find_subject(subjects, std::string(name));
    if (!answerer.implements(op)) {
      throw spec::InvalidInput("tier", -1, answerer.name(),
                               "does not implement " + std::string(spec::name_of(op)));
    }
    if (const std::string why = answerer.unavailable_reason(); !why.empty()) {
      throw spec::FailedToRun("the gpu tier cannot run here: its " +
                              std::string(spec::name_of(op)) + " answerer " + answerer.name() +
                              " is unavailable (" + why + "); --tier cpu runs the CPU reference");
    }
    t.by_op[op] = std::make_unique<OneThreadSubject>(answerer);
    if (std::find(judged.begin(), judged.end(),
                  std::pair<const Subject*, spec::Op>{&answerer, op}) != judged.end())
      t.self_judged.insert(op);
    t.names +=
        (t.names.empty() ? "" : ", ") + std::string(spec::name_of(op)) + ": " + answerer.name();
  }
  return t;
}

}  // namespace kvo::oracle
