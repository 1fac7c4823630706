// The resident read path's two threads (issue 15 item 4): the tier's reads of one copy on a thread
// of their own (OneThread) while the subjects' reads of the other are asked ahead (ReadsAhead) and
// judged after, against an expectation built in two steps. Each piece on the host: OneThread runs
// in order on one other thread and hands back results and exceptions; ReadsAhead answers a call
// once, only the call it was asked for, and rethrows what the subject threw; the two-step
// expectation is the one-step expectation; and judge_read over answers asked ahead gives the
// verdicts (a pass, a planted bug's mismatch, a throw's failure) it gives over the subject itself.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kvo/oracle/one_thread.hpp"
#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/reference/read_path.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

TEST(OneThread, RunsTasksInOrderOnOneOtherThreadAndHandsBackResultsAndExceptions) {
  OneThread t;
  std::vector<int> order;
  std::vector<std::future<std::thread::id>> ids;
  for (int i = 0; i < 50; ++i) {
    ids.push_back(t.post([&order, i] {
      order.push_back(i);
      return std::this_thread::get_id();
    }));
  }
  const std::thread::id first = ids.front().get();
  EXPECT_NE(first, std::this_thread::get_id());
  for (std::size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(ids[i].get(), first) << "task " << i;
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<std::size_t>(i)], i);
  auto thrown = t.post([]() -> int { throw spec::FailedToRun("side failed"); });
  EXPECT_THROW(thrown.get(), spec::FailedToRun);
  EXPECT_EQ(t.post([] { return 7; }).get(), 7);  // still serving after a throw
}

TEST(OneThread, BesideReturnsTheSidesResultAndWaitsForItWhenTheCallerThrows) {
  OneThread t;
  std::atomic<bool> side_done{false};
  int here = 0;
  EXPECT_EQ(t.beside([] { return 41 + 1; }, [&] { here = 1; }), 42);
  EXPECT_EQ(here, 1);
  // The caller's part throws first: the side's part (which uses the caller's frame) has finished
  // before the exception leaves beside.
  try {
    t.beside(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          side_done = true;
          return 0;
        },
        [] { throw std::runtime_error("here failed"); });
    ADD_FAILURE() << "beside did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "here failed");
    EXPECT_TRUE(side_done);
  }
  EXPECT_THROW(t.beside([]() -> int { throw spec::Unsupported("side"); }, [] {}),
               spec::Unsupported);
}

/// Several threads take the tasks as they come free: tasks run at once (each waits until four are
/// running: on fewer threads this would never finish), every task runs once, results and
/// exceptions come back through the futures, and the destructor runs what is still queued.
TEST(TaskThreads, RunTasksAtOnceOnSeveralThreadsAndDrainTheQueueBeforeJoining) {
  std::atomic<int> running{0}, ran{0};
  {
    TaskThreads t(4);
    std::vector<std::future<int>> results;
    for (int i = 0; i < 4; ++i) {
      results.push_back(t.post([&running, i] {
        ++running;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (running.load() < 4 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        return running.load() >= 4 ? i : -1;
      }));
    }
    for (int i = 0; i < 4; ++i) EXPECT_EQ(results[static_cast<std::size_t>(i)].get(), i);
    auto thrown = t.post([]() -> int { throw spec::FailedToRun("a check failed"); });
    EXPECT_THROW(thrown.get(), spec::FailedToRun);
    for (int i = 0; i < 200; ++i) {
      (void)t.post([&ran] {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++ran;
      });
    }
  }  // the futures dropped: the queue still runs before the threads join
  EXPECT_EQ(ran.load(), 200);
}

ReadCase small_case(std::uint64_t seed) {
  ReadOverrides o;
  o.max_seq_len = 300;
  return make_read_case(seed, o);
}

/// A canonical read subject (the CPU reference) counting its calls; `bug`: its attention's first
/// output byte flipped; `throws`: its indexer throws.
struct CountingReads {
  int indexer_calls = 0, attention_calls = 0;
  bool bug = false, throws = false;
  std::unique_ptr<Subject> subject() {
    SubjectFunctions f;
    f.indexer = [this](const ReadCase& c) {
      ++indexer_calls;
      if (throws) throw spec::FailedToRun("indexer launch failed");
      return reference::indexer_topk(c.config, c.indexer, c.batch, c.index_q, c.caches).ids;
    };
    f.attention = [this](const ReadCase& c, const reference::TopkSelection* sel) {
      ++attention_calls;
      spec::HostTensor out = reference::attention(c.config, c.attention, c.batch, c.q, c.caches,
                                                  c.k_scale, c.v_scale, sel)
                                 .out;
      if (bug && !out.bytes.empty()) out.bytes[0] ^= 0x40;
      return out;
    };
    return make_function_subject("counting-reads", f);
  }
};

TEST(ReadsAhead, AnswersTheCallItWasAskedOnceAndSendsEveryOtherCallToTheSubject) {
  const ReadCase c = small_case(0x5eed01), other = small_case(0x5eed02);
  std::printf("cases: seeds 0x5eed01, 0x5eed02\n");
  CountingReads counts;
  const std::unique_ptr<Subject> inner = counts.subject();
  ReadsAhead ahead(*inner);
  ahead.indexer_ahead(c);
  EXPECT_EQ(counts.indexer_calls, 1);
  const std::vector<std::int32_t> want = inner->indexer(c);  // the subject's own answer
  EXPECT_EQ(ahead.indexer(c), want);
  EXPECT_EQ(counts.indexer_calls, 2) << "the answer kept ahead was not the one returned";
  EXPECT_EQ(ahead.indexer(c), want);  // once: the next call is the subject's
  EXPECT_EQ(counts.indexer_calls, 3);
  ahead.indexer_ahead(c);
  (void)ahead.indexer(other);  // another case: the subject answers it
  EXPECT_EQ(counts.indexer_calls, 5);

  ReadExpectation e(c);
  reference::TopkSelection shifted = *e.attended();
  shifted.ids.back() = shifted.ids.back() == 0 ? 1 : 0;
  ahead.attention_ahead(c, e.attended());
  EXPECT_EQ(counts.attention_calls, 1);
  (void)ahead.attention(c, &shifted);  // other ids: not the answer asked ahead
  EXPECT_EQ(counts.attention_calls, 2);
  (void)ahead.attention(c, nullptr);  // no selection: not the answer asked ahead
  EXPECT_EQ(counts.attention_calls, 3);
  const reference::TopkSelection copy = *e.attended();  // the same ids in another object
  EXPECT_EQ(ahead.attention(c, &copy).bytes, inner->attention(c, e.attended()).bytes);
  EXPECT_EQ(counts.attention_calls, 4);

  counts.throws = true;
  ahead.indexer_ahead(c);  // kept, not thrown here
  EXPECT_EQ(counts.indexer_calls, 6);
  EXPECT_THROW((void)ahead.indexer(c), spec::FailedToRun);
  EXPECT_EQ(counts.indexer_calls, 6);
}

TEST(ReadsAhead, TheTwoStepExpectationIsTheOneStepOnesAndJudgesAlike) {
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed) +
                 " (ctest -R test_reads_ahead --output-on-failure)");
    const ReadCase c = small_case(seed);
    CountingReads tier_counts;
    const std::unique_ptr<Subject> tier = tier_counts.subject();
    SubjectFunctions sf;
    sf.indexer_selection = [](const ReadCase& rc) {
      return reference::indexer_topk(rc.config, rc.indexer, rc.batch, rc.index_q, rc.caches);
    };
    sf.attention = [&](const ReadCase& rc, const reference::TopkSelection* sel) {
      return tier->attention(rc, sel);
    };
    const std::unique_ptr<Subject> answerer = make_function_subject("tier", sf);
    ReadExpectation one(c, false, answerer.get());

    CountingReads good_counts, bad_counts, throw_counts;
    bad_counts.bug = true;
    throw_counts.throws = true;
    const std::unique_ptr<Subject> good = good_counts.subject(), bad = bad_counts.subject(),
                                   thrower = throw_counts.subject();
    ReadsAhead good_ahead(*good), bad_ahead(*bad), throw_ahead(*thrower);
    good_ahead.indexer_ahead(c);
    throw_ahead.indexer_ahead(c);
    ReadExpectation two(c, answerer->indexer_selection(c),
                        [&](const reference::TopkSelection& attended) {
                          good_ahead.attention_ahead(c, &attended);
                          bad_ahead.attention_ahead(c, &attended);
                          return answerer->attention(c, &attended);
                        });
    EXPECT_EQ(two.selection().ids, one.selection().ids);
    EXPECT_EQ(two.selection().scores, one.selection().scores);
    EXPECT_EQ(two.attended()->ids, one.attended()->ids);
    EXPECT_EQ(two.attended()->topk, one.attended()->topk);
    EXPECT_EQ(two.exact().bytes, one.exact().bytes);

    const ReadVerdict ids = judge_read(good_ahead, spec::Op::kIndexer, two);
    const ReadVerdict out = judge_read(good_ahead, spec::Op::kAttention, two);
    EXPECT_EQ(ids.outcome, spec::Outcome::kPass) << ids.report;
    EXPECT_EQ(out.outcome, spec::Outcome::kPass) << out.report;
    EXPECT_EQ(good_counts.indexer_calls, 1);  // both judged from the answers asked ahead
    EXPECT_EQ(good_counts.attention_calls, 1);
    const ReadVerdict planted = judge_read(bad_ahead, spec::Op::kAttention, two);
    EXPECT_EQ(planted.outcome, judge_read(*bad, spec::Op::kAttention, one).outcome);
    if (!c.batch.seq_lens.empty() && !two.exact().bytes.empty()) {
      EXPECT_EQ(planted.outcome, spec::Outcome::kMismatch) << planted.report;
    }
    const ReadVerdict failed = judge_read(throw_ahead, spec::Op::kIndexer, two);
    EXPECT_EQ(failed.outcome, spec::Outcome::kFailedToRun) << failed.report;
    EXPECT_NE(failed.report.find("indexer launch failed"), std::string::npos) << failed.report;
    EXPECT_EQ(throw_counts.indexer_calls, 1);
  }
}

}  // namespace
}  // namespace kvo::oracle
