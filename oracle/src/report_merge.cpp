// Reading a campaign's JSON report back and merging the reports of a campaign's shards
// (report_files.hpp; `kvoracle report merge`).
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "kvo/oracle/report_files.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::oracle {
namespace {

using Json = nlohmann::json;

/// Rejects `source`'s key `key` (holding `value`) with `why`; an empty key names the file whole.
[[noreturn]] void reject(const std::string& source, const std::string& key,
                         const std::string& value, const std::string& why) {
  throw spec::InvalidInput(key.empty() ? source : source + ": " + key, -1, value, why);
}

/// Reads the keys of one JSON object of a report, naming `where` (e.g. "subjects[2]") in errors.
class Fields {
 public:
  Fields(const Json& object, std::string source, std::string where)
      : o_(object), source_(std::move(source)), where_(std::move(where)) {
    if (!o_.is_object()) reject(source_, where_, o_.dump().substr(0, 40), "not an object");
  }

  const Json& at(const char* key) const {
    const auto it = o_.find(key);
    if (it == o_.end()) reject(source_, path(key), "(absent)", "missing");
    return *it;
  }
  std::string text(const char* key) const {
    const Json& v = at(key);
    if (!v.is_string()) reject(source_, path(key), v.dump(), "expected a string");
    return v.get<std::string>();
  }
  /// An integer in [min, max].
  std::int64_t integer(const char* key, std::int64_t min,
                       std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    const Json& v = at(key);
    const bool integral = v.is_number_integer() &&
                          (!v.is_number_unsigned() ||
                           v.get<std::uint64_t>() <= static_cast<std::uint64_t>(
                                                         std::numeric_limits<std::int64_t>::max()));
    if (!integral) reject(source_, path(key), v.dump(), "expected an integer");
    const auto n = v.get<std::int64_t>();
    if (n < min || n > max) {
      reject(source_, path(key), std::to_string(n),
             "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
    }
    return n;
  }
  /// An integer in [min, max], or 0 where the key is absent (a field a later version added: a
  /// report written before it merges).
  std::int64_t integer_or_zero(const char* key, std::int64_t min,
                               std::int64_t max = std::numeric_limits<std::int64_t>::max()) const {
    return o_.contains(key) ? integer(key, min, max) : 0;
  }
  double number(const char* key) const {
    const Json& v = at(key);
    if (!v.is_number() || v.get<double>() < 0.0)
      reject(source_, path(key), v.dump(), "expected a number >= 0");
    return v.get<double>();
  }
  const Json& array(const char* key) const {
    const Json& v = at(key);
    if (!v.is_array()) reject(source_, path(key), v.dump().substr(0, 40), "expected an array");
    return v;
  }
  template <class E>
  E name(const char* key) const {
    const std::string n = text(key);
    const std::optional<E> e = spec::parse_enum<E>(n);
    if (!e) reject(source_, path(key), n, "unknown; known: " + spec::enum_choices<E>());
    return *e;
  }
  spec::Outcome outcome(const char* key) const {
    const std::string n = text(key);
    for (const auto& f : spec::kOutcomeFacts)
      if (f.name == n) return f.outcome;
    reject(source_, path(key), n, "unknown outcome");
  }
  std::string path(const char* key) const { return where_.empty() ? key : where_ + "." + key; }

 private:
  const Json& o_;
  std::string source_, where_;
};

/// The case index a failure report starts with ("case 17 seed ..."); none when it does not.
std::optional<std::int64_t> failure_case(const std::string& failure) {
  if (failure.rfind("case ", 0) != 0) return std::nullopt;
  char* end = nullptr;
  const long long n = std::strtoll(failure.c_str() + 5, &end, 10);
  if (end == failure.c_str() + 5 || n < 0) return std::nullopt;
  return n;
}

}  // namespace

CheckReport read_report_json(const std::string& text, const std::string& source) {
  Json doc;
  try {
    doc = Json::parse(text);
  } catch (const Json::exception& e) {
    reject(source, "", "(its text)", std::string("not JSON: ") + e.what());
  }
  const Fields top(doc, source, "");
  CheckReport r;
  try {
    r.seed = parse_u64(top.text("seed"), "seed");
  } catch (const spec::InvalidInput&) {
    reject(source, "seed", top.text("seed"), "expected a 64-bit seed, decimal or 0x-hex");
  }
  r.total_shards = top.integer("total_shards", 1);
  r.shard_index = top.integer("shard_index", 0, r.total_shards - 1);
  r.cases_run = top.integer("cases_run", 0);
  r.seconds = top.number("seconds");
  r.bytes_compared = top.integer("cache_bytes_compared", 0);
  const spec::Outcome result = top.outcome("result");
  const Fields tier(top.at("reference"), source, "reference");
  r.tier = tier.name<ReferenceTier>("tier");
  r.tier_answerers = tier.text("answerers");
  r.tier_cases = tier.integer("tier_cases", 0);
  r.cpu_cases = tier.integer("cpu_cases", 0);
  r.tier_checks = tier.integer("tier_checks", 0);
  r.resident_cases = tier.integer_or_zero("resident_cases", 0, r.tier_cases);
  r.resident_checks = tier.integer_or_zero("resident_checks", 0);
  r.tier_disagreement = tier.text("disagreement");
  // A disagreement stopped the campaign on a case it did not record.
  if (r.tier_cases + r.cpu_cases != r.cases_run + (r.tier_disagreement.empty() ? 0 : 1)) {
    reject(source, tier.path("tier_cases"), std::to_string(r.tier_cases),
           "with cpu_cases " + std::to_string(r.cpu_cases) + " not the cases run (" +
               std::to_string(r.cases_run) + ")" +
               (r.tier_disagreement.empty() ? "" : " and the one the tier disagreed on"));
  }
  if (!r.tier_disagreement.empty()) r.worst = spec::Outcome::kFailedToRun;
  const Json& subjects = top.array("subjects");
  for (std::size_t i = 0; i < subjects.size(); ++i) {
    const Fields f(subjects[i], source, "subjects[" + std::to_string(i) + "]");
    SubjectSummary s;
    s.name = f.text("name");
    s.op = f.name<spec::Op>("op");
    s.skipped = f.text("skipped");
    s.cases = f.integer("cases", 0);
    std::int64_t sum = 0;
    for (const auto& o : spec::kOutcomeFacts) {
      const std::string key = outcome_count_key(o.outcome);
      sum += s.counts[static_cast<int>(o.outcome)] = f.integer(key.c_str(), 0, s.cases);
      if (s.counts[static_cast<int>(o.outcome)] > 0) r.worst = spec::worst(r.worst, o.outcome);
    }
    if (sum != s.cases) {
      reject(source, f.path("cases"), std::to_string(s.cases),
             "the outcome counts add up to " + std::to_string(sum));
    }
    s.first_failure = f.text("first_failure");
    const Json& more = f.array("more_failures");
    for (std::size_t k = 0; k < more.size(); ++k) {
      if (!more[k].is_string()) {
        reject(source, f.path("more_failures") + "[" + std::to_string(k) + "]", more[k].dump(),
               "expected a string");
      }
      s.more_failures.push_back(more[k].get<std::string>());
    }
    // Reports written before failure classes were counted have none.
    if (subjects[i].contains("failure_classes")) {
      const Json& classes = f.array("failure_classes");
      for (std::size_t k = 0; k < classes.size(); ++k) {
        const Fields c(classes[k], source,
                       f.path("failure_classes") + "[" + std::to_string(k) + "]");
        s.add_failure_class(c.text("class"), c.integer("first_case", -1),
                            parse_u64(c.text("first_seed"), "first_seed"),
                            c.integer("cases", 1, s.cases));
      }
    }
    // Reports written before blind spots were counted have none.
    if (subjects[i].contains("blind_spots")) {
      const Json& spots = f.at("blind_spots");
      const Fields counts(spots, source, f.path("blind_spots"));
      for (const auto& item : spots.items())
        s.blind_spots[item.key()] = counts.integer(item.key().c_str(), 1, s.cases);
    }
    r.subjects.push_back(std::move(s));
  }
  if (result != r.worst) {
    reject(source, "result", std::string(spec::name_of(result)),
           "the subjects' counts say " + std::string(spec::name_of(r.worst)));
  }
  const Json& coverage = top.array("coverage");
  for (std::size_t i = 0; i < coverage.size(); ++i) {
    const Fields f(coverage[i], source, "coverage[" + std::to_string(i) + "]");
    CoverageRow c;
    c.op = f.name<spec::Op>("op");
    c.condition = f.text("condition");
    c.means = f.text("means");
    c.cases = f.integer("cases", 0);
    c.reached = f.integer("reached", 0, c.cases);
    c.first_case = f.integer("first_case", -1);
    if ((c.first_case < 0) != (c.reached == 0)) {
      reject(source, f.path("first_case"), std::to_string(c.first_case),
             "-1 exactly when no case reached the condition (reached = " +
                 std::to_string(c.reached) + ")");
    }
    r.coverage.push_back(std::move(c));
  }
  return r;
}

CheckReport merge_reports(const std::vector<CheckReport>& shards,
                          const std::vector<std::string>& sources) {
  if (shards.empty() || shards.size() != sources.size())
    throw spec::InvalidInput("reports", -1, std::to_string(shards.size()), "need one or more");
  const CheckReport& first = shards.front();
  CheckReport m;
  m.seed = first.seed;
  m.tier = first.tier;
  m.tier_answerers = first.tier_answerers;
  m.subjects = first.subjects;
  m.coverage = first.coverage;
  for (SubjectSummary& s : m.subjects) {
    s.cases = 0;
    std::fill(std::begin(s.counts), std::end(s.counts), 0);
    s.first_failure.clear();
    s.more_failures.clear();
    s.failure_classes.clear();
    s.blind_spots.clear();
  }
  for (CoverageRow& c : m.coverage) c.cases = c.reached = 0, c.first_case = -1;
  // Each subject's failures with the case they start at, in shard order; sorted below.
  std::vector<std::vector<std::pair<std::int64_t, std::string>>> failures(m.subjects.size());
  std::set<std::int64_t> seen;
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const CheckReport& r = shards[k];
    const std::string& src = sources[k];
    if (r.seed != first.seed) {
      reject(src, "seed", std::to_string(r.seed),
             sources[0] + " has seed " + std::to_string(first.seed) + ": not one campaign");
    }
    if (r.total_shards != first.total_shards) {
      reject(src, "total_shards", std::to_string(r.total_shards),
             sources[0] + " has " + std::to_string(first.total_shards));
    }
    if (r.tier != first.tier || r.tier_answerers != first.tier_answerers) {
      reject(src, "reference.tier",
             std::string(spec::name_of(r.tier)) + " (" + r.tier_answerers + ")",
             sources[0] + " ran the " + std::string(spec::name_of(first.tier)) + " tier (" +
                 first.tier_answerers + "): not one campaign");
    }
    if (!seen.insert(r.shard_index).second)
      reject(src, "shard_index", std::to_string(r.shard_index), "that shard is given twice");
    if (r.subjects.size() != m.subjects.size())
      reject(src, "subjects", std::to_string(r.subjects.size()), "rows differ from " + sources[0]);
    for (std::size_t i = 0; i < r.subjects.size(); ++i) {
      const SubjectSummary& s = r.subjects[i];
      SubjectSummary& t = m.subjects[i];
      const std::string key = "subjects[" + std::to_string(i) + "]";
      if (s.name != t.name || s.op != t.op)
        reject(src, key, s.name, "differs from " + sources[0] + "'s " + t.name);
      // A subject run on some shards and skipped on others was judged on part of the cases only.
      if (s.skipped != t.skipped) {
        reject(src, key + ".skipped", s.skipped.empty() ? "(ran)" : s.skipped,
               sources[0] + (t.skipped.empty() ? " ran it" : " skipped it: " + t.skipped) +
                   "; every shard must judge the same subjects");
      }
      t.cases += s.cases;
      for (int o = 0; o < 5; ++o) t.counts[o] += s.counts[o];
      for (const FailureClassCount& c : s.failure_classes)
        t.add_failure_class(c.name, c.first_case, c.first_seed, c.cases);
      for (const auto& [bug, cases] : s.blind_spots) t.blind_spots[bug] += cases;
      std::vector<std::string> all{s.first_failure};
      all.insert(all.end(), s.more_failures.begin(), s.more_failures.end());
      for (std::string& f : all) {
        if (f.empty()) continue;
        failures[i].emplace_back(failure_case(f).value_or(std::numeric_limits<std::int64_t>::max()),
                                 std::move(f));
      }
    }
    if (r.coverage.size() != m.coverage.size())
      reject(src, "coverage", std::to_string(r.coverage.size()), "rows differ from " + sources[0]);
    for (std::size_t i = 0; i < r.coverage.size(); ++i) {
      const CoverageRow& c = r.coverage[i];
      CoverageRow& t = m.coverage[i];
      if (c.op != t.op || c.condition != t.condition) {
        reject(src, "coverage[" + std::to_string(i) + "]", c.condition,
               "differs from " + sources[0] + "'s " + t.condition);
      }
      t.cases += c.cases;
      t.reached += c.reached;
      if (c.first_case >= 0 && (t.first_case < 0 || c.first_case < t.first_case))
        t.first_case = c.first_case;
    }
    m.tier_cases += r.tier_cases;
    m.cpu_cases += r.cpu_cases;
    m.tier_checks += r.tier_checks;
    m.resident_cases += r.resident_cases;
    m.resident_checks += r.resident_checks;
    if (m.tier_disagreement.empty()) m.tier_disagreement = r.tier_disagreement;
    m.cases_run += r.cases_run;
    m.bytes_compared += r.bytes_compared;
    m.seconds = std::max(m.seconds, r.seconds);
    m.worst = spec::worst(m.worst, r.worst);
  }
  for (std::int64_t i = 0; i < first.total_shards; ++i) {
    if (!seen.contains(i)) {
      reject(
          "reports", "shard_index", std::to_string(i),
          "no report of shard " + std::to_string(i) + " of " + std::to_string(first.total_shards));
    }
  }
  for (std::size_t i = 0; i < m.subjects.size(); ++i) {
    auto& f = failures[i];
    std::stable_sort(f.begin(), f.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t k = 0; k < f.size(); ++k) {
      if (k == 0) {
        m.subjects[i].first_failure = f[k].second;
      } else {
        m.subjects[i].more_failures.push_back(f[k].second);
      }
    }
  }
  return m;
}

}  // namespace kvo::oracle
