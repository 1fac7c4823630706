#include "kvo/traces/case_file.hpp"

#include <algorithm>
#include <array>
#include <cstdio>

#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/case_tensors.hpp"
#include "kvo/oracle/mutants.hpp"
#include "kvo/oracle/read_judge.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/spec/metadata.hpp"
#include "kvo/traces/safetensors.hpp"

namespace kvo::traces {
namespace {

using oracle::NamedTensor;
using oracle::TensorDType;
using oracle::TensorSet;

std::string hex64(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llX", static_cast<unsigned long long>(v));
  return buf;
}

/// The container's dtype of a case tensor: the one spelled the same.
StDType st_dtype(TensorDType t) {
  if (const std::optional<StDType> st = st_dtype_named(spec::name_of(t))) return *st;
  throw std::logic_error("no safetensors dtype for a case tensor dtype");
}

std::vector<std::uint8_t> to_safetensors(const TensorSet& set) {
  std::vector<StTensorOut> out;
  for (const NamedTensor& t : set.tensors)
    out.push_back({t.name, st_dtype(t.dtype), t.shape, t.bytes});
  return build_safetensors(set.metadata, out);
}

TensorSet from_safetensors(std::span<const std::uint8_t> bytes) {
  const StFile file = parse_safetensors(bytes);
  TensorSet set;
  set.metadata = file.metadata;
  for (const StTensor& t : file.tensors) {
    const auto dtype = spec::parse_enum<TensorDType>(st_dtype_name(t.dtype));
    if (!dtype) {
      throw spec::InvalidInput("tensor '" + t.name + "' dtype", -1,
                               std::string(st_dtype_name(t.dtype)),
                               "expected one of " + spec::enum_choices<TensorDType>());
    }
    set.tensors.push_back({t.name, *dtype, t.shape, {t.bytes.begin(), t.bytes.end()}});
  }
  return set;
}

/// The format, op and case seed every case and result file starts with.
struct FileHead {
  spec::Op op = spec::Op::kWrite;
  std::uint64_t seed = 0;
};

void write_head(spec::Metadata& m, std::string_view format, spec::Op op, std::uint64_t seed) {
  m["format"] = std::string(format);
  m["op"] = spec::name_of(op);
  m["case_seed"] = hex64(seed);
}

FileHead read_head(spec::MetadataReader& m, std::string_view format) {
  const std::string& f = m.text("format");
  if (f != format) {
    throw spec::InvalidInput("__metadata__ 'format'", -1, "\"" + f + "\"",
                             "expected \"" + std::string(format) + "\"");
  }
  FileHead head;
  head.op = m.choice<spec::Op>("op");
  head.seed = oracle::parse_u64(m.text("case_seed"), "__metadata__ 'case_seed'");
  return head;
}

/// A result file's head: the case's, who produced it and how it is judged.
void write_result_head(spec::Metadata& m, const CaseFile& c, const std::string& subject,
                       const Declared& declared) {
  write_head(m, kResultFormat, c.op, c.seed);
  m["subject"] = subject;
  m["ordering"] = spec::name_of(declared.ordering.value_or(spec::Ordering::kCanonical));
  m["topk_order"] = spec::topk_form_text(declared.topk_form.value_or(spec::TopkForm{}));
  m["attention_profile"] = spec::name_of(declared.profile.value_or(spec::AttentionProfile::kFp32));
}

/// A subject whose every op fails as a result file says its producer did.
class FailedProducer final : public oracle::Subject {
 public:
  FailedProducer(std::string name, spec::Op op, const oracle::SubjectFunctions& declared,
                 spec::Outcome outcome, std::string error)
      : name_(std::move(name)),
        op_(op),
        declared_(declared),
        outcome_(outcome),
        error_(std::move(error)) {}
  std::string name() const override { return name_; }
  spec::Ordering ordering() const override { return declared_.ordering; }
  spec::TopkForm topk_form() const override { return declared_.topk_form; }
  spec::AttentionProfile attention_profile() const override { return declared_.attention_profile; }
  bool implements(spec::Op op) const override { return op == op_; }
  void write_layer(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) override {
    fail();
  }
  spec::HostTensor dense_insert(const spec::ModelConfig&, const spec::DenseInsert&,
                                spec::LayerCaches&) override {
    fail();
  }
  std::vector<std::int32_t> indexer(const oracle::ReadCase&) override { fail(); }
  spec::HostTensor attention(const oracle::ReadCase&, const reference::TopkSelection*) override {
    fail();
  }

 private:
  [[noreturn]] void fail() const {
    const std::string what = "the result file says: " + error_;
    if (outcome_ == spec::Outcome::kInvalidInput) throw spec::InvalidInput("input", -1, "", what);
    if (outcome_ == spec::Outcome::kUnsupported) throw spec::Unsupported(what);
    throw spec::FailedToRun(what);
  }
  std::string name_;
  spec::Op op_;
  oracle::SubjectFunctions declared_;  ///< the declaration only: no function is set
  spec::Outcome outcome_;
  std::string error_;
};

/// The outcomes a result may declare instead of an answer.
constexpr std::array<spec::Outcome, 3> kRunOutcomes{
    spec::Outcome::kFailedToRun, spec::Outcome::kUnsupported, spec::Outcome::kInvalidInput};

spec::Outcome parse_run_outcome(const std::string& text) {
  for (spec::Outcome o : kRunOutcomes) {
    if (spec::name_of(o) == text) return o;
  }
  throw spec::InvalidInput("__metadata__ 'run_outcome'", -1, "\"" + text + "\"",
                           "expected failed-to-run, unsupported or invalid-input");
}

}  // namespace

std::vector<std::uint8_t> serialize_case(spec::Op op, oracle::PreparedCase& c,
                                         const std::string& flags) {
  TensorSet set;
  oracle::TensorWriter out(set);
  oracle::driver_of(op).encode_case(c, out);
  write_head(set.metadata, kCaseFormat, op, c.seed());
  set.metadata["flags"] = flags;
  return to_safetensors(set);
}

CaseFile parse_case(std::span<const std::uint8_t> bytes) {
  const TensorSet set = from_safetensors(bytes);
  oracle::TensorReader in(set);
  const FileHead head = read_head(in.metadata(), kCaseFormat);
  CaseFile c;
  c.op = head.op;
  c.seed = head.seed;
  c.flags = in.metadata().text("flags");
  c.prepared = oracle::driver_of(c.op).decode_case(in, c.seed);
  in.require_all_read();
  return c;
}

CaseFile load_case(const std::filesystem::path& path) {
  return parse_case(read_file_bytes(path, "case file"));
}

void emit_case(spec::Op op, std::uint64_t seed, const oracle::Overrides& overrides,
               const std::filesystem::path& path) {
  const oracle::OpDriver& driver = oracle::driver_of(op);
  const std::unique_ptr<oracle::PreparedCase> c = driver.prepare(seed, overrides);
  const std::vector<std::uint8_t> bytes = serialize_case(op, *c, driver.flags(overrides));
  (void)parse_case(bytes);  // what this program writes, its strict reader reads back
  write_file_atomically(bytes, path);
}

std::vector<std::filesystem::path> emit_campaign(const std::vector<spec::Op>& ops,
                                                 std::uint64_t campaign_seed, std::int64_t cases,
                                                 const oracle::Overrides& overrides,
                                                 const std::filesystem::path& dir,
                                                 std::vector<std::string>* skipped) {
  if (cases < 1 || cases > 10000) {
    throw spec::InvalidInput("cases", -1, std::to_string(cases), "must be in [1, 10000]");
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw spec::InvalidInput("output", -1, dir.string(), "cannot create the directory");
  std::vector<std::filesystem::path> written;
  for (std::int64_t i = 0; i < cases; ++i) {
    const std::uint64_t seed = oracle::case_seed(campaign_seed, static_cast<std::uint64_t>(i));
    for (spec::Op op : ops) {
      char name[64];
      std::snprintf(name, sizeof name, "%s-%04lld.st", std::string(spec::name_of(op)).c_str(),
                    static_cast<long long>(i));
      try {
        emit_case(op, seed, overrides, dir / name);
      } catch (const spec::Unsupported& e) {
        char hex[32];
        std::snprintf(hex, sizeof hex, "0x%016llX", static_cast<unsigned long long>(seed));
        if (skipped != nullptr)
          skipped->push_back(std::string(name) + " (seed " + hex + "): " + e.what());
        continue;
      }
      written.push_back(dir / name);
    }
  }
  return written;
}

std::vector<std::uint8_t> serialize_result(const CaseFile& c,
                                           std::vector<oracle::NamedTensor> tensors,
                                           const std::string& subject, const Declared& declared) {
  TensorSet set;
  set.tensors = std::move(tensors);
  write_result_head(set.metadata, c, subject, declared);
  return to_safetensors(set);
}

std::vector<std::uint8_t> run_case(CaseFile& c, oracle::Subject& subject) {
  TensorSet set;
  oracle::TensorWriter out(set);
  std::string error = subject.unavailable_reason();
  spec::Outcome outcome = spec::Outcome::kFailedToRun;
  if (error.empty()) {
    outcome = oracle::run_guarded(
        [&] {
          oracle::driver_of(c.op).encode_answer(subject, *c.prepared, out);
          return spec::Outcome::kPass;
        },
        error);
  }
  spec::Metadata& m = set.metadata;
  write_result_head(m, c, subject.name(),
                    {subject.ordering(), subject.attention_profile(), subject.topk_form()});
  if (outcome != spec::Outcome::kPass) {
    set.tensors.clear();
    m["run_outcome"] = spec::name_of(outcome);
    m["run_error"] = error;
  }
  return to_safetensors(set);
}

Judgement judge_result(CaseFile& c, std::span<const std::uint8_t> result, const Declared& declared,
                       const std::string& judge_command) {
  const TensorSet set = from_safetensors(result);
  oracle::TensorReader in(set);
  spec::MetadataReader& m = in.metadata();
  const FileHead head = read_head(m, kResultFormat);
  if (head.op != c.op || head.seed != c.seed) {
    throw spec::InvalidInput("__metadata__ 'case_seed'", -1,
                             std::string(spec::name_of(head.op)) + " " + hex64(head.seed),
                             "the result of another case: expected op " +
                                 std::string(spec::name_of(c.op)) + ", case_seed " + hex64(c.seed));
  }
  oracle::SubjectFunctions functions;
  const std::string name = m.text("subject");
  functions.ordering = declared.ordering.value_or(m.choice<spec::Ordering>("ordering"));
  functions.topk_form = declared.topk_form.value_or(
      spec::parse_topk_form(m.text("topk_order"), "__metadata__ 'topk_order'"));
  functions.attention_profile =
      declared.profile.value_or(m.choice<spec::AttentionProfile>("attention_profile"));
  const oracle::OpDriver& driver = oracle::driver_of(c.op);
  std::unique_ptr<oracle::Subject> subject;
  if (m.has("run_outcome")) {
    const spec::Outcome outcome = parse_run_outcome(m.text("run_outcome"));
    subject = std::make_unique<FailedProducer>(
        name, c.op, functions, outcome,
        m.optional("run_error", std::string(), &spec::MetadataReader::text));
  } else {
    // Exactly the case's expected tensors, by name, dtype and shape.
    TensorSet expected;
    oracle::TensorWriter writer(expected);
    driver.encode_case(*c.prepared, writer);
    const std::string prefix = "expected.";
    for (const NamedTensor& t : expected.tensors) {
      if (t.name.rfind(prefix, 0) == 0)
        (void)in.take(t.name.substr(prefix.size()), t.dtype, t.shape);
    }
    driver.answer_from(set, *c.prepared, functions);
    subject = oracle::make_function_subject(name, functions);
  }
  in.require_all_read();
  const std::string problem = oracle::profile_override_problem(*subject, declared.profile);
  if (!problem.empty()) {
    throw spec::InvalidInput("profile", -1, std::string(spec::name_of(*declared.profile)), problem);
  }
  const oracle::Verdict v = driver.judge(*subject, *c.prepared);
  // How it is judged: its ordering, and an indexer's declared top-k form.
  const std::string how =
      std::string(spec::name_of(subject->ordering())) +
      (c.op == spec::Op::kIndexer ? ", top-k " + spec::topk_form_text(subject->topk_form()) : "");
  std::string report = "case seed " + hex64(c.seed) + ": " + c.prepared->describe() + "\nsubject " +
                       name + " (" + how + "), op " + std::string(spec::name_of(c.op)) + "\n" +
                       v.report;
  if (v.outcome != spec::Outcome::kPass) {
    // The command line replays a case only for its own subjects (built in, or a planted mutant);
    // a result made elsewhere is replayed by judging its file again.
    oracle::SubjectList own = oracle::make_subjects();
    oracle::add_named_mutants({name}, own);
    const bool replayable =
        std::any_of(own.begin(), own.end(), [&](const auto& s) { return s->name() == name; });
    std::string line = replayable
                           ? "kvoracle check --case-seed " + hex64(c.seed) + " --subject " + name +
                                 " --ops " + std::string(spec::name_of(c.op)) + c.flags
                           : std::string();
    if (!judge_command.empty()) line += (line.empty() ? "" : "\n       or: ") + judge_command;
    if (!line.empty()) report += "\nreproduce: " + line;
  }
  report += "\nresult: " + std::string(spec::name_of(v.outcome));
  return {v.outcome, report};
}

}  // namespace kvo::traces
