#include "kvo/oracle/mutants.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "kvo/reference/layer_write.hpp"

namespace kvo::oracle {

#ifdef KVO_HAVE_CUDA
std::unique_ptr<WriteSubject> make_cuda_fault_subject(const std::string& name, int fault);
std::unique_ptr<ReadSubject> make_cuda_read_fault_subject(const std::string& name, int fault);
#endif

namespace {

using spec::KvLayout;
using WriteFn =
    std::function<void(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&)>;

Mutant write_mutant(std::string name, std::string models, CaseOverrides o, WriteFn fn) {
  Mutant m;
  m.name = name;
  m.op = "write";
  m.models = std::move(models);
  m.overrides = std::move(o);
  m.make_write = [name, fn] { return make_function_subject(name, fn); };
  return m;
}

Mutant read_mutant(std::string name, std::string models, std::string op, ReadOverrides o,
                   ReadMutation mutation, bool canonical) {
  Mutant m;
  m.name = name;
  m.op = std::move(op);
  m.models = std::move(models);
  m.read_overrides = std::move(o);
  m.make_read = [name, mutation, canonical] {
    return canonical ? make_canonical_mutant(mutation, name)
                     : make_cpu_naive_subject(mutation, name);
  };
  return m;
}

std::vector<Mutant> build_catalogue() {
  std::vector<Mutant> c;
  c.push_back(write_mutant("minus-one-wraps",
                           "vllm#43810 / TRT-LLM write_kv_slots: padding -1 indexes from the end",
                           {}, [](const auto& cfg, const auto& w, auto& out) {
                             spec::ModelConfig m = cfg;
                             m.slot_mode = spec::SlotMode::kLegacyWrap;
                             reference::write_layer(m, w, out);
                           }));
  c.push_back(write_mutant(
      "block-size-mismatch",
      "vllm PR #47056: block size taken from the packed storage view, not the mapping's", {},
      [](const auto& cfg, const auto& w, auto& out) {
        // The kernel sees pages of another size over the same bytes (same capacity).
        spec::ModelConfig m = cfg;
        if (m.geometry.num_blocks % 2 == 0) {
          m.geometry.num_blocks /= 2;
          m.geometry.block_size *= 2;
        } else if (m.geometry.block_size % 2 == 0) {
          m.geometry.num_blocks *= 2;
          m.geometry.block_size /= 2;
        }
        reference::write_layer(m, w, out);
      }));
  c.push_back(write_mutant("hnd-nhd-stride-swap",
                           "flashinfer PR #527, LMCache#4463: head and token strides exchanged", {},
                           [](const auto& cfg, const auto& w, auto& out) {
                             spec::ModelConfig m = cfg;
                             m.layout = spec::stride_swapped(m.layout);
                             reference::write_layer(m, w, out);
                           }));
  c.push_back(write_mutant("off-by-one-offset", "a slot decoded one position late", {},
                           [](const auto& cfg, const auto& w, auto& out) {
                             spec::LayerWrite m = w;
                             const std::int64_t cap = cfg.geometry.capacity();
                             for (auto* map : {&m.slots, &m.index_slots}) {
                               for (auto& s : map->slots) s = s < 0 ? s : (s + 1) % cap;
                             }
                             reference::write_layer(cfg, m, out);
                           }));
  CaseOverrides fp8_16bit_act;
  fp8_16bit_act.kv_dtype = spec::DType::kFp8E4M3;
  fp8_16bit_act.act_dtype = spec::DType::kBF16;
  fp8_16bit_act.scale_mode = spec::ScaleMode::kDivide;
  c.push_back(write_mutant("double-rounding",
                           "M3 unfused path: fp32 -> model dtype -> fp8 instead of one rounding",
                           fp8_16bit_act, [](const auto& cfg, const auto& w, auto& out) {
                             spec::ModelConfig m = cfg;
                             m.kv.via_model_dtype = !m.kv.via_model_dtype;
                             reference::write_layer(m, w, out);
                           }));
  CaseOverrides nan_values;
  nan_values.kv_dtype = spec::DType::kFp8E4M3;
  nan_values.saturation = spec::Saturation::kSatFinite;
  nan_values.edge_values = true;
  c.push_back(write_mutant("nan-sign-kept",
                           "torch <= 2.11 / ml_dtypes: -NaN encodes as 0xFF where CUDA gives 0x7F",
                           nan_values, [](const auto& cfg, const auto& w, auto& out) {
                             spec::ModelConfig m = cfg;
                             if (m.kv.saturation == spec::Saturation::kSatFinite)
                               m.kv.saturation = spec::Saturation::kTorch;
                             reference::write_layer(m, w, out);
                           }));
  CaseOverrides divide = fp8_16bit_act;
  c.push_back(write_mutant("multiply-not-divide",
                           "FlashInfer's convention in a vLLM-convention kernel: x * s, not x / s",
                           divide, [](const auto& cfg, const auto& w, auto& out) {
                             spec::LayerWrite m = w;
                             for (float& s : m.k_scale) s = 1.0f / s;
                             for (float& s : m.v_scale) s = 1.0f / s;
                             reference::write_layer(cfg, m, out);
                           }));
  CaseOverrides separate;
  separate.separate_index_slots = true;
  separate.layers = "DS";
  c.push_back(write_mutant("index-k-main-mapping",
                           "vLLM M3 kernel: index-K written through the main slot mapping",
                           separate, [](const auto& cfg, const auto& w, auto& out) {
                             spec::LayerWrite m = w;
                             m.index_slots = m.slots;
                             reference::write_layer(cfg, m, out);
                           }));
  c.push_back(write_mutant(
      "tokens-from-padded-source",
      "indexer_k_quant_and_cache: num_tokens = k.size(0), not the mapping's length", {},
      [](const auto& cfg, const auto& w, auto& out) {
        reference::write_layer(cfg, w, out);
        // The source rows past the mapping are written too, reading the mapping from its start.
        const auto tokens = static_cast<std::int64_t>(w.slots.slots.size());
        const std::int64_t extra = w.k.shape[0] - tokens;
        if (extra <= 0) return;
        spec::LayerWrite tail = w;
        tail.slots.slots.assign(w.slots.slots.begin(),
                                w.slots.slots.begin() + std::min(extra, tokens));
        tail.index_slots.slots.assign(
            w.index_slots.slots.begin(),
            w.index_slots.slots.begin() +
                std::min<std::int64_t>(extra,
                                       static_cast<std::int64_t>(w.index_slots.slots.size())));
        // Rows tokens.. of the source play the role of rows 0.. of the extra call.
        const auto shift = [tokens](spec::HostTensor& t) {
          const std::size_t row_bytes = t.bytes.size() / static_cast<std::size_t>(t.shape[0]);
          t.bytes.erase(t.bytes.begin(),
                        t.bytes.begin() + static_cast<std::ptrdiff_t>(
                                              row_bytes * static_cast<std::size_t>(tokens)));
          t.shape[0] -= tokens;
        };
        shift(tail.k);
        shift(tail.v);
        if (!tail.index_k.bytes.empty()) shift(tail.index_k);
        reference::write_layer(cfg, tail, out);
      }));

  ReadOverrides prefill;  // causal masking shows on rows with later tokens of the same request
  c.push_back(read_mutant("missing-causal-mask",
                          "attention: a query sees the later tokens of its block", "attention",
                          prefill, {.no_causal_mask = true}, false));
  c.push_back(read_mutant("n-valid-off-by-one", "indexer: (p + sb) // sb computed as p // sb + 2",
                          "indexer", {}, {.n_valid_offset = 1}, false));
  c.push_back(read_mutant("local-block-ignored", "indexer: the local (current) block is not forced",
                          "indexer", {}, {.ignore_local = true}, false));
  ReadOverrides ties;
  ties.tied_scores = true;
  c.push_back(read_mutant("reversed-tie-order", "top-k: equal scores won by the higher block id",
                          "indexer", ties, {.ties_to_higher_id = true}, true));
  c.push_back(read_mutant("softmax-scale-twice",
                          "attention: sm_scale applied to q and again to the scores", "attention",
                          {}, {.scale_twice = true}, true));
#ifdef KVO_HAVE_CUDA
  // The same bugs planted in the CUDA fused kernel (gpu::FaultInjection); run where a GPU answers.
  const std::pair<const char*, const char*> gpu_faults[] = {
      {"cuda-minus-one-wraps", "vllm#43810 in the fused kernel"},
      {"cuda-off-by-one-offset", "a slot decoded one position late, in the fused kernel"},
      {"cuda-hnd-nhd-stride-swap", "head and token strides exchanged, in the fused kernel"}};
  for (int f = 1; f <= 3; ++f) {
    Mutant m;
    m.name = gpu_faults[f - 1].first;
    m.op = "write";
    m.models = gpu_faults[f - 1].second;
    m.make_write = [name = m.name, f] { return make_cuda_fault_subject(name, f); };
    c.push_back(std::move(m));
  }
  // Bugs planted in the fast (foreign-order) read kernels: the foreign mode must reject them.
  const std::array<std::array<const char*, 3>, 2> read_faults = {{
      {"cuda-fast-local-block-ignored", "indexer",
       "the fast indexer leaves the local block unforced"},
      {"cuda-fast-exp-without-log2e", "attention",
       "the fast softmax computes exp2(s) without folding log2(e) into the scale"},
  }};
  for (int f = 1; f <= 2; ++f) {
    Mutant m;
    m.name = read_faults[f - 1][0];
    m.op = read_faults[f - 1][1];
    m.models = read_faults[f - 1][2];
    m.make_read = [name = m.name, f] { return make_cuda_read_fault_subject(name, f); };
    c.push_back(std::move(m));
  }
#endif
  return c;
}

}  // namespace

const std::vector<Mutant>& mutant_catalogue() {
  static const std::vector<Mutant> catalogue = build_catalogue();
  return catalogue;
}

void add_named_mutants(const std::vector<std::string>& names,
                       std::vector<std::unique_ptr<WriteSubject>>& writes,
                       std::vector<std::unique_ptr<ReadSubject>>& reads) {
  for (const Mutant& m : mutant_catalogue()) {
    if (std::find(names.begin(), names.end(), m.name) == names.end()) continue;
    if (m.make_write) writes.push_back(m.make_write());
    if (m.make_read) reads.push_back(m.make_read());
  }
}

std::vector<MutantResult> run_mutants(std::uint64_t seed, std::int64_t max_cases,
                                      const std::vector<std::string>& names) {
  const auto& cat = mutant_catalogue();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (std::none_of(cat.begin(), cat.end(), [&](const Mutant& m) { return m.name == names[i]; })) {
      std::string known;
      for (const Mutant& m : cat) known += (known.empty() ? "" : "|") + m.name;
      throw spec::InvalidInput("mutant", static_cast<std::int64_t>(i), names[i],
                               "unknown mutant; known: " + known);
    }
  }
  std::vector<MutantResult> results;
  for (const Mutant& m : cat) {
    if (!names.empty() && std::find(names.begin(), names.end(), m.name) == names.end()) continue;
    CheckOptions o;
    o.seed = seed;
    o.cases = max_cases;
    o.overrides = m.overrides;
    o.read_overrides = m.read_overrides;
    o.ops = {m.op};
    o.fail_fast = true;
    std::vector<std::unique_ptr<WriteSubject>> writes;
    std::vector<std::unique_ptr<ReadSubject>> reads;
    if (m.make_write) writes.push_back(m.make_write());
    if (m.make_read) reads.push_back(m.make_read());
    const std::string unavailable =
        m.make_write ? writes.front()->unavailable_reason() : reads.front()->unavailable_reason();
    if (!unavailable.empty()) {
      MutantResult skipped{m.name, m.op, m.models, false, 0, "", ""};
      skipped.skipped = unavailable;
      results.push_back(std::move(skipped));
      continue;
    }
    const CheckReport r = run_check(o, writes, reads);
    MutantResult res{m.name, m.op, m.models, r.worst != spec::Outcome::kPass, r.cases_run, "", ""};
    for (const auto& s : r.subjects) {
      if (!s.first_failure.empty()) res.first_failure = s.first_failure;
    }
    results.push_back(std::move(res));
  }
  return results;
}

}  // namespace kvo::oracle
