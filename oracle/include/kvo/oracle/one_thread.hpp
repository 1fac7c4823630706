#pragma once
/// \file one_thread.hpp
/// Host threads of their own that run the tasks posted to them. `OneThread`, one thread running
/// its tasks one after another in the order posted: what kvo_gpu keeps per host thread (a device
/// memory pool, a stream, a staging block) is then one for every task; the GPU tier's answerer is
/// called through one (reference_tier.cpp's OneThreadSubject), and a resident read case's tier
/// reads run on one beside the main thread's reads of the other copy (resident_reads.hpp).
/// `TaskThreads`, several threads taking the posted tasks in order, each the next when it is free:
/// a resident replay's sampled check of the tier runs on them, a layer a task.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvo::oracle {

class TaskThreads {
 public:
  /// `threads` >= 1 threads.
  explicit TaskThreads(std::size_t threads) {
    for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { serve(); });
  }
  /// Runs what is queued, then joins.
  ~TaskThreads() {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    ready_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  TaskThreads(const TaskThreads&) = delete;
  TaskThreads& operator=(const TaskThreads&) = delete;

  /// Queues `fn`; the future holds its result or what it threw.
  template <class Fn>
  std::future<std::invoke_result_t<Fn&>> post(Fn fn) {
    using Result = std::invoke_result_t<Fn&>;
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(fn));
    std::future<Result> done = task->get_future();
    {
      const std::lock_guard<std::mutex> lock(mu_);
      tasks_.emplace_back([task] { (*task)(); });
    }
    ready_.notify_one();
    return done;
  }

  /// `side` run on one of these threads while the caller runs `here`; side's result. Both have
  /// finished before this returns or throws (what `here` throws first, else what `side` threw), so
  /// `side` may use what the caller's frame holds.
  template <class Side, class Here>
  std::invoke_result_t<Side&> beside(Side side, Here&& here) {
    auto done = post(std::move(side));
    try {
      here();
    } catch (...) {
      done.wait();
      throw;
    }
    return done.get();
  }

 private:
  void serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ready_.wait(lock, [&] { return done_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool done_ = false;
  std::vector<std::thread> threads_;  ///< last: started once the rest exists
};

/// One thread: its tasks run one after another, in the order posted.
class OneThread : public TaskThreads {
 public:
  OneThread() : TaskThreads(1) {}
};

}  // namespace kvo::oracle
