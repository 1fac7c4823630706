#include "kvo/oracle/check.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "kvo/oracle/cache_diff.hpp"
#include "kvo/oracle/read_diff.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/reference/dense_insert.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/reference/paged_cache.hpp"

namespace kvo::oracle {
namespace {

using spec::Outcome;

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// Runs one write subject over every layer of a case; fills the diff or the error.
Outcome run_write(WriteSubject& subject, const WriteCase& wc,
                  const reference::PagedCacheLayout& layout,
                  const std::vector<spec::LayerCaches>& poisoned,
                  const std::vector<spec::LayerCaches>& expected, CacheDiff& diff,
                  std::string& error) {
  std::vector<spec::LayerCaches> actual = poisoned;  // poisoned once per case, copied per subject
  const Outcome ran = run_guarded(
      [&] {
        for (std::size_t l = 0; l < wc.writes.size(); ++l)
          subject.write_layer(wc.config, wc.writes[l], actual[l]);
        return Outcome::kPass;
      },
      error);
  if (ran != Outcome::kPass) return ran;
  for (std::size_t l = 0; l < wc.writes.size(); ++l) {
    diff.merge(diff_layer_caches(layout, static_cast<std::int64_t>(l), expected[l], actual[l],
                                 &wc.writes[l]));
  }
  if (!diff.equal()) error = diff.report();
  return diff.equal() ? Outcome::kPass : Outcome::kMismatch;
}

}  // namespace

void apply_shard_environment(CheckOptions& o) {
  const char* total = std::getenv("GTEST_TOTAL_SHARDS");
  const char* index = std::getenv("GTEST_SHARD_INDEX");
  if (total == nullptr || index == nullptr) return;
  auto parse = [](const char* text, const char* field) {
    char* end = nullptr;
    const long long v = std::strtoll(text, &end, 10);
    if (*text == '\0' || end == nullptr || *end != '\0') {
      throw spec::InvalidInput(field, -1, std::string("\"") + text + "\"", "expected an integer");
    }
    return static_cast<std::int64_t>(v);
  };
  o.total_shards = parse(total, "GTEST_TOTAL_SHARDS");
  o.shard_index = parse(index, "GTEST_SHARD_INDEX");
  if (o.total_shards < 1 || o.shard_index < 0 || o.shard_index >= o.total_shards) {
    throw spec::InvalidInput(
        "GTEST_SHARD_INDEX", -1, std::to_string(o.shard_index),
        "must be in [0, GTEST_TOTAL_SHARDS = " + std::to_string(o.total_shards) + ")");
  }
}

ReadOverrides effective_read_overrides(const CheckOptions& o) {
  ReadOverrides r = o.read_overrides;
  const CaseOverrides& w = o.overrides;
  if (!r.block_size) r.block_size = w.block_size;
  if (!r.num_kv_heads) r.num_kv_heads = w.num_kv_heads;
  if (!r.head_dim) r.head_dim = w.head_dim;
  if (!r.index_dim) r.index_dim = w.index_dim;
  if (!r.kv_dtype) r.kv_dtype = w.kv_dtype;
  if (!r.layout) r.layout = w.layout;
  if (!r.index_layout) r.index_layout = w.index_layout;
  return r;
}

std::string repro_command(const CheckOptions& o, std::uint64_t seed, const std::string& subject,
                          const std::string& op) {
  return "kvoracle check --case-seed " + hex64(seed) + " --subject " + subject + " --ops " + op +
         o.overrides.to_flags();
}

std::string CheckReport::summary() const {
  std::ostringstream s;
  char line[256];
  std::snprintf(line, sizeof line,
                "kvoracle check: seed %s, %lld cases in %.2f s, %lld cache bytes compared\n",
                hex64(seed).c_str(), static_cast<long long>(cases_run), seconds,
                static_cast<long long>(bytes_compared));
  s << line;
  std::snprintf(line, sizeof line, "%-24s %-10s %7s %7s %9s %8s %7s %12s\n", "subject", "op",
                "cases", "pass", "mismatch", "invalid", "failed", "unsupported");
  s << line;
  for (const auto& sub : subjects) {
    if (!sub.skipped.empty()) {
      std::snprintf(line, sizeof line, "%-24s %-10s skipped: %s\n", sub.name.c_str(),
                    sub.op.c_str(), sub.skipped.c_str());
    } else {
      std::snprintf(line, sizeof line, "%-24s %-10s %7lld %7lld %9lld %8lld %7lld %12lld\n",
                    sub.name.c_str(), sub.op.c_str(), static_cast<long long>(sub.cases),
                    static_cast<long long>(sub.count(Outcome::kPass)),
                    static_cast<long long>(sub.count(Outcome::kMismatch)),
                    static_cast<long long>(sub.count(Outcome::kInvalidInput)),
                    static_cast<long long>(sub.count(Outcome::kFailedToRun)),
                    static_cast<long long>(sub.count(Outcome::kUnsupported)));
    }
    s << line;
  }
  for (const auto& sub : subjects) {
    if (!sub.first_failure.empty())
      s << "\nfirst failure of " << sub.name << " (" << sub.op << "):\n"
        << sub.first_failure << "\n";
  }
  s << "result: " << spec::name_of(worst);
  return s.str();
}

void require_known(const char* field, const char* what, const std::vector<std::string>& given,
                   const std::vector<std::string>& known) {
  for (std::size_t i = 0; i < given.size(); ++i) {
    if (std::find(known.begin(), known.end(), given[i]) != known.end()) continue;
    std::string names;
    for (const auto& n : known) names += (names.empty() ? "" : "|") + n;
    throw spec::InvalidInput(field, static_cast<std::int64_t>(i), given[i],
                             std::string("unknown ") + what + "; known: " + names);
  }
}

CheckReport run_check(const CheckOptions& o, std::vector<std::unique_ptr<WriteSubject>>& writes,
                      const Progress& progress) {
  std::vector<std::unique_ptr<ReadSubject>> none;
  return run_check(o, writes, none, progress);
}

CheckReport run_check(const CheckOptions& o, std::vector<std::unique_ptr<WriteSubject>>& writes,
                      std::vector<std::unique_ptr<ReadSubject>>& reads, const Progress& progress) {
  std::vector<std::unique_ptr<DenseSubject>> none;
  return run_check(o, writes, reads, none, progress);
}

CheckReport run_check(const CheckOptions& o, std::vector<std::unique_ptr<WriteSubject>>& writes,
                      std::vector<std::unique_ptr<ReadSubject>>& reads,
                      std::vector<std::unique_ptr<DenseSubject>>& denses,
                      const Progress& progress) {
  std::vector<std::string> known;
  for (const auto& s : writes) known.push_back(s->name());
  for (const auto& s : reads) known.push_back(s->name());
  for (const auto& s : denses) known.push_back(s->name());
  require_known("subject", "subject", o.subjects, known);
  require_known("ops", "op", o.ops, kCheckOps);
  if (o.cases < 1 && !o.case_seed) {
    throw spec::InvalidInput("cases", -1, std::to_string(o.cases), "must be >= 1");
  }
  if (o.total_shards < 1) {
    throw spec::InvalidInput("total_shards", -1, std::to_string(o.total_shards), "must be >= 1");
  }
  if (o.shard_index < 0 || o.shard_index >= o.total_shards) {
    throw spec::InvalidInput(
        "shard_index", -1, std::to_string(o.shard_index),
        "must be in [0, total_shards = " + std::to_string(o.total_shards) + ")");
  }
  auto selected = [&](const std::string& name) {
    return o.subjects.empty() ||
           std::find(o.subjects.begin(), o.subjects.end(), name) != o.subjects.end();
  };
  auto op_on = [&](const std::string& op) {
    return std::find(o.ops.begin(), o.ops.end(), op) != o.ops.end();
  };

  CheckReport report;
  report.seed = o.seed;
  // One summary row per (subject, op); the row index of each runnable pair.
  std::vector<std::pair<WriteSubject*, std::size_t>> write_rows;
  std::vector<std::tuple<ReadSubject*, std::string, std::size_t>> read_rows;
  auto add_row = [&](const std::string& name, const std::string& op, const std::string& skipped) {
    SubjectSummary sum;
    sum.name = name;
    sum.op = op;
    sum.skipped = skipped;
    report.subjects.push_back(sum);
    return report.subjects.size() - 1;
  };
  if (op_on("write")) {
    for (const auto& s : writes) {
      if (!selected(s->name())) continue;
      const std::size_t row = add_row(s->name(), "write", s->unavailable_reason());
      if (report.subjects[row].skipped.empty()) write_rows.emplace_back(s.get(), row);
    }
  }
  for (const std::string op : {"indexer", "attention"}) {
    if (!op_on(op)) continue;
    for (const auto& s : reads) {
      if (!selected(s->name())) continue;
      const std::size_t row = add_row(s->name(), op, s->unavailable_reason());
      if (report.subjects[row].skipped.empty()) read_rows.emplace_back(s.get(), op, row);
    }
  }
  std::vector<std::pair<DenseSubject*, std::size_t>> dense_rows;
  if (op_on("dense")) {
    for (const auto& s : denses) {
      if (!selected(s->name())) continue;
      const std::size_t row = add_row(s->name(), "dense", s->unavailable_reason());
      if (report.subjects[row].skipped.empty()) dense_rows.emplace_back(s.get(), row);
    }
  }
  const ReadOverrides read_o = effective_read_overrides(o);

  auto record = [&](std::size_t row, Outcome outcome, std::int64_t index, std::uint64_t seed,
                    const std::string& what, const std::string& detail) {
    SubjectSummary& sum = report.subjects[row];
    ++sum.cases;
    ++sum.counts[static_cast<int>(outcome)];
    report.worst = spec::worst(report.worst, outcome);
    if (outcome != Outcome::kPass && outcome != Outcome::kUnsupported &&
        sum.first_failure.empty()) {
      std::ostringstream f;
      f << "case " << index << " seed " << hex64(seed) << ": " << what << "\n"
        << detail << "\nreproduce: " << repro_command(o, seed, sum.name, sum.op);
      sum.first_failure = f.str();
      sum.failing_seed = seed;
    }
  };

  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::int64_t total = o.case_seed ? 1 : o.cases;
  for (std::int64_t i = 0; i < total; ++i) {
    if (o.time_budget_s > 0.0 && report.cases_run > 0 && elapsed() > o.time_budget_s) break;
    if (o.fail_fast && report.worst != Outcome::kPass && report.worst != Outcome::kUnsupported)
      break;
    if (!o.case_seed && i % o.total_shards != o.shard_index) continue;
    const std::uint64_t seed =
        o.case_seed ? *o.case_seed : case_seed(o.seed, static_cast<std::uint64_t>(i));
    if (!write_rows.empty()) {
      const WriteCase wc = make_write_case(seed, o.overrides);
      const reference::PagedCacheLayout layout(wc.config);
      const std::vector<spec::LayerCaches> poisoned = reference::make_model_caches(layout);
      std::vector<spec::LayerCaches> expected = poisoned;
      for (std::size_t l = 0; l < wc.writes.size(); ++l)
        reference::write_layer(wc.config, wc.writes[l], expected[l]);
      for (auto& [subject, row] : write_rows) {
        CacheDiff diff;
        std::string detail;
        const Outcome outcome = run_write(*subject, wc, layout, poisoned, expected, diff, detail);
        report.bytes_compared += diff.compared_bytes;
        record(row, outcome, i, seed, wc.describe(), detail);
      }
    }
    if (!read_rows.empty()) {
      const ReadCase rc = make_read_case(seed, read_o);
      ReadExpectation expectation(rc);
      for (auto& [subject, op, row] : read_rows) {
        const ReadVerdict v = judge_read(
            *subject, op == "indexer" ? ReadOp::kIndexer : ReadOp::kAttention, expectation);
        record(row, v.outcome, i, seed, rc.describe(), v.report);
      }
    }
    if (!dense_rows.empty()) {
      const DenseCase dc = make_dense_case(seed);
      const reference::PagedCacheLayout layout(dc.config);
      const spec::LayerCaches poisoned =
          reference::make_layer_caches(layout, 0, spec::LayerKind::kDense);
      spec::LayerCaches expected = poisoned;
      const spec::HostTensor q_expected = reference::dense_insert(dc.config, dc.in, expected);
      for (const auto& entry : dense_rows) {
        DenseSubject* subject = entry.first;  // named: lambdas cannot capture bindings (clang 15)
        const std::size_t row = entry.second;
        std::string detail;
        const Outcome outcome = run_guarded(
            [&] {
              spec::LayerCaches actual = poisoned;
              const spec::HostTensor q = subject->insert(dc.config, dc.in, actual);
              const CacheDiff cd = diff_layer_caches(layout, 0, expected, actual, &dc.in.kv);
              const AttentionDiff qd = diff_attention_exact(q_expected, q);
              report.bytes_compared += cd.compared_bytes;
              if (!cd.equal()) detail += cd.report() + "\n";
              if (!qd.pass()) detail += "q_out: " + qd.report();
              return cd.equal() && qd.pass() ? Outcome::kPass : Outcome::kMismatch;
            },
            detail);
        record(row, outcome, i, seed, dc.describe(), detail);
      }
    }
    ++report.cases_run;
    if (progress) progress(report.cases_run, total);
  }
  report.seconds = elapsed();
  return report;
}

}  // namespace kvo::oracle
