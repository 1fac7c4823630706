// The read ops (SPEC 5-6): the indexer with block top-k, and sparse attention over the reference's
// selection (so an indexer bug does not mask an attention one). Both draw the same read case from
// a seed, so the campaign prepares it once for both; judge_read applies the subject's ordering
// (and, for foreign attention, its arithmetic profile or --profile). Attention's mode for mode
// detection (SPEC 7) is that profile: one answer judged exactly and under every profile's bound.
#include <algorithm>
#include <array>
#include <sstream>

#include "kvo/oracle/read_judge.hpp"
#include "op_drivers.hpp"

namespace kvo::oracle {
namespace {

struct ReadPrepared final : PreparedCase {
  ReadPrepared(ReadCase c, std::optional<spec::AttentionProfile> p)
      : rc(std::move(c)), expectation(rc), profile(p) {}
  std::uint64_t seed() const override { return rc.seed; }
  std::string describe() const override { return rc.describe(); }

  ReadCase rc;
  ReadExpectation expectation;                    ///< refers to rc: never moved after construction
  std::optional<spec::AttentionProfile> profile;  ///< --profile: foreign attention judged under it
};

/// The values of attention's mode axis "profile", tightest first: bit for bit, then the profiles
/// by increasing bound (tests/oracle/test_attention_modes.cpp checks the bounds are nested in this
/// order on random cases: fp16's P and operand roundings are finer than bf16's).
inline constexpr std::array<spec::AttentionProfile, 3> kProfilesByLooseness{
    spec::AttentionProfile::kFp32, spec::AttentionProfile::kFp16P, spec::AttentionProfile::kBf16P};
constexpr std::string_view kExact = "exact";

/// A foreign or canonical subject's attention output on one case, judged under any value of the
/// profile axis: 0 exact (bit for bit), i >= 1 the bound of kProfilesByLooseness[i - 1].
class AttentionAnswer final : public CapturedAnswer {
 public:
  explicit AttentionAnswer(ReadPrepared& c) : c_(c) {}
  Verdict judge_under(const ModeChoice& choice) override {
    const std::size_t value = choice.at(0);
    const AttentionDiff d = diff_attention_output(
        c_.expectation, out,
        value == 0 ? std::nullopt
                   : std::optional<spec::AttentionProfile>(kProfilesByLooseness.at(value - 1)));
    return {d.pass() ? spec::Outcome::kPass : spec::Outcome::kMismatch, d.report(), 0};
  }

  spec::HostTensor out;  ///< [Tq, nq, hd] in the case's output dtype

 private:
  ReadPrepared& c_;
};

/// The read overrides, with the dimensions shared with the write side (--block-size, --head-dim,
/// --num-kv-heads, --index-dim, --kv-dtype, --layout, --index-layout) taken from the write
/// overrides where the read ones leave them open.
ReadOverrides effective_read(const Overrides& o) {
  ReadOverrides r = o.read;
  const CaseOverrides& w = o.write;
  if (!r.block_size) r.block_size = w.block_size;
  if (!r.num_kv_heads) r.num_kv_heads = w.num_kv_heads;
  if (!r.head_dim) r.head_dim = w.head_dim;
  if (!r.index_dim) r.index_dim = w.index_dim;
  if (!r.kv_dtype) r.kv_dtype = w.kv_dtype;
  if (!r.layout) r.layout = w.layout;
  if (!r.index_layout) r.index_layout = w.index_layout;
  return r;
}

class ReadDriver final : public OpDriver {
 public:
  explicit ReadDriver(spec::Op op) : op_(op) {}
  spec::Op op() const override { return op_; }
  std::string_view case_kind() const override { return "read"; }

  std::unique_ptr<PreparedCase> prepare(std::uint64_t seed, const Overrides& o) const override {
    const ReadOverrides r = effective_read(o);
    return std::make_unique<ReadPrepared>(make_read_case(seed, r), r.profile);
  }

  Verdict judge(Subject& subject, PreparedCase& pc) const override {
    auto& rp = static_cast<ReadPrepared&>(pc);
    const ReadVerdict r = judge_read(subject, op_, rp.expectation, rp.profile);
    return {r.outcome, r.report, 0};
  }

  Verdict explain(Subject& subject, PreparedCase& pc) const override {
    const ReadCase& rc = static_cast<ReadPrepared&>(pc).rc;
    std::ostringstream s;
    explain_header(s, pc, subject, op_);
    for (std::int64_t q = 0, rq = 0; rq < rc.batch.num_requests(); ++rq) {
      const auto at = static_cast<std::size_t>(rq);
      s << "  request " << rq << ": seq_len " << rc.batch.seq_lens[at] << ", queries "
        << rc.batch.query_start_loc[at + 1] - rc.batch.query_start_loc[at] << " (rows from " << q
        << ")\n";
      q = rc.batch.query_start_loc[at + 1];
    }
    Verdict v = judge(subject, pc);
    explain_verdict(s, v);
    v.report = s.str();
    return v;
  }

  std::vector<Reduction> reductions() const override {
    using W = CaseOverrides;
    using R = ReadOverrides;
    std::vector<Reduction> r;
    r.push_back(set_override("one request", &Overrides::read, &R::requests, std::int64_t{1}));
    for (std::int64_t s : {2, 8, 32})
      r.push_back(set_override("shorter sequences", &Overrides::read, &R::max_seq_len, s));
    r.push_back(set_override("one KV head", &Overrides::write, &W::num_kv_heads, std::int64_t{1}));
    r.push_back(set_override("one query head per KV head", &Overrides::read, &R::group_size,
                             std::int64_t{1}));
    r.push_back(set_override("one index head per KV head", &Overrides::read, &R::index_heads_per_kv,
                             std::int64_t{1}));
    r.push_back(set_override("head_dim 8", &Overrides::write, &W::head_dim, std::int64_t{8}));
    for (std::int64_t k : {1, 2})
      r.push_back(set_override("smaller k", &Overrides::read, &R::topk, k));
    for (std::int64_t sb : {1, 2, 4})
      r.push_back(set_override("smaller blocks", &Overrides::read, &R::sparse_block, sb));
    r.push_back(set_override("pages of 1", &Overrides::write, &W::block_size, std::int64_t{1}));
    r.push_back(set_override("no adversarial values", &Overrides::read, &R::adversarial, false));
    return r;
  }

  std::string flags(const Overrides& o) const override {
    return o.write.to_flags() + o.read.to_flags();
  }

  // Mode detection: attention has one axis, the arithmetic profile (exact first); the indexer's
  // modes are not detected here.
  std::vector<ModeAxis> mode_axes() const override {
    if (op_ != spec::Op::kAttention) return {};
    ModeAxis axis{"profile", {std::string(kExact)}};
    for (spec::AttentionProfile p : kProfilesByLooseness)
      axis.values.emplace_back(spec::name_of(p));
    return {axis};
  }

  /// The overrides as given; the profile pinned to --profile, else the subject-independent default
  /// fp32 (the profile changes how an answer is judged, never what a subject is asked).
  Overrides pin_modes(const Overrides& o, ModeChoice& pinned) const override {
    pinned.clear();
    if (op_ != spec::Op::kAttention) return o;
    const spec::AttentionProfile p = o.read.profile.value_or(spec::AttentionProfile::kFp32);
    const auto at = std::find(kProfilesByLooseness.begin(), kProfilesByLooseness.end(), p);
    pinned.push_back(1 + static_cast<std::size_t>(at - kProfilesByLooseness.begin()));
    return o;
  }

  std::unique_ptr<CapturedAnswer> capture(Subject& subject, PreparedCase& pc) const override {
    if (op_ != spec::Op::kAttention) return OpDriver::capture(subject, pc);
    auto& rp = static_cast<ReadPrepared&>(pc);
    auto answer = std::make_unique<AttentionAnswer>(rp);
    answer->run_outcome = run_guarded(
        [&] {
          answer->out = subject.attention(rp.rc, rp.expectation.attended());
          return spec::Outcome::kPass;
        },
        answer->run_error);
    return answer;
  }

 private:
  spec::Op op_;
};

}  // namespace

const OpDriver& indexer_driver() {
  static const ReadDriver driver(spec::Op::kIndexer);
  return driver;
}

const OpDriver& attention_driver() {
  static const ReadDriver driver(spec::Op::kAttention);
  return driver;
}

}  // namespace kvo::oracle
