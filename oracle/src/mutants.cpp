#include "kvo/oracle/mutants.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <future>

#include "kvo/oracle/cpu_subjects.hpp"
#include "kvo/reference/layer_write.hpp"
#include "kvo/subjects/cpu_write.hpp"
#ifdef KVO_HAVE_CUDA
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/oracle/cuda_subjects.hpp"
#endif

namespace kvo::oracle {

namespace {

using spec::KvLayout;
/// A catalogued mutant whose subject `make(name)` builds.
Mutant mutant(std::string name, spec::Op op, std::string models, Overrides o,
              std::function<std::unique_ptr<Subject>(const std::string&)> make) {
  const std::string n = name;
  return {std::move(name), op, std::move(models), std::move(o), [n, make] { return make(n); }};
}

Overrides write_part(CaseOverrides w) {
  Overrides o;
  o.write = std::move(w);
  return o;
}
Overrides read_part(ReadOverrides r) {
  Overrides o;
  o.read = std::move(r);
  return o;
}

/// `w` with its tokens in reverse order: the mapping(s) and the first T rows of every source.
spec::LayerWrite reversed_tokens(const spec::LayerWrite& w) {
  spec::LayerWrite r = w;
  const auto tokens = static_cast<std::ptrdiff_t>(w.slots.slots.size());
  std::reverse(r.slots.slots.begin(), r.slots.slots.end());
  std::reverse(r.index_slots.slots.begin(), r.index_slots.slots.end());
  for (spec::HostTensor* t : {&r.k, &r.v, &r.index_k}) {
    if (t->shape.empty() || t->shape[0] == 0) continue;
    const auto row =
        static_cast<std::ptrdiff_t>(t->bytes.size() / static_cast<std::size_t>(t->shape[0]));
    const spec::HostTensor& src = t == &r.k ? w.k : t == &r.v ? w.v : w.index_k;
    for (std::ptrdiff_t i = 0; i < tokens; ++i) {
      std::copy_n(src.bytes.begin() + (tokens - 1 - i) * row, row, t->bytes.begin() + i * row);
    }
  }
  return r;
}

Mutant write_mutant(std::string name, std::string models, CaseOverrides o, WriteFunction fn) {
  return mutant(std::move(name), spec::Op::kWrite, std::move(models), write_part(std::move(o)),
                [fn](const std::string& n) { return make_function_subject(n, fn, true); });
}

Mutant read_mutant(std::string name, std::string models, spec::Op op, ReadOverrides o,
                   ReadMutation mutation, bool canonical) {
  return mutant(std::move(name), op, std::move(models), read_part(std::move(o)),
                [mutation, canonical](const std::string& n) {
                  return canonical ? make_canonical_mutant(mutation, n)
                                   : make_cpu_naive_subject(mutation, n);
                });
}

Mutant dense_mutant(std::string name, std::string models, CaseOverrides o, DenseMutation mutation) {
  return mutant(std::move(name), spec::Op::kDense, std::move(models), write_part(std::move(o)),
                [mutation](const std::string& n) { return make_cpu_dense_subject(mutation, n); });
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
  // The real kernels' findings (peer_findings.md), planted in the fused CPU model.
  const auto fused_mutant = [](std::string name, std::string models, CaseOverrides o,
                               subjects::WriteMutation mutation) {
    return write_mutant(std::move(name), std::move(models), std::move(o),
                        [mutation](const auto& cfg, const auto& w, auto& out) {
                          subjects::write_layer_fused_mutated(cfg, w, out, mutation);
                        });
  };
  c.push_back(fused_mutant("hnd-nhd-stride-swap",
                           "flashinfer PR #527, LMCache#4463: head and token strides exchanged", {},
                           subjects::WriteMutation::kSwapTokenHeadStrides));
  CaseOverrides exact_division;
  exact_division.scale_mode = spec::ScaleMode::kDivide;
  c.push_back(fused_mutant("approx-division-where-exact",
                           "Triton's `/` (div.full.f32, 2 ulp) in a kernel that promises exact "
                           "division (vLLM's Triton vs CUDA KV write)",
                           exact_division, subjects::WriteMutation::kApproxDivision));
  CaseOverrides e5m2;
  e5m2.kv_dtype = spec::DType::kFp8E5M2;
  c.push_back(fused_mutant("e4m3-into-e5m2",
                           "vLLM's Triton KV write: every fp8 cache dtype mapped to e4m3, so e4m3 "
                           "codes land in an fp8_e5m2 cache",
                           e5m2, subjects::WriteMutation::kE4m3IntoE5m2));
  CaseOverrides strict_slots;
  strict_slots.slot_mode = spec::SlotMode::kStrict;
  c.push_back(fused_mutant("truncating-minus-one",
                           "TRT-LLM fused_write_layer_caches without the slot < 0 check, SGLang's "
                           "Triton fp8 write: -1 // bs = 0, -1 % bs = -1 write before page 0",
                           strict_slots, subjects::WriteMutation::kTruncatingMinusOne));
  CaseOverrides blockscale_nan;
  blockscale_nan.index_layout = spec::IndexLayout::kBlockScale;
  blockscale_nan.edge_values = true;
  blockscale_nan.layers = "S";
  c.push_back(fused_mutant("blockscale-nan-to-min",
                           "SGLang's DeepSeek index-K quantizer: a NaN element clamped to -448 "
                           "instead of the NaN code 0x7F",
                           blockscale_nan, subjects::WriteMutation::kBlockscaleNanToMin));
  // The reach classes (issue 14): each bug's condition comes up under the default distribution.
  c.push_back(fused_mutant("minus-one-stops-write",
                           "a token loop that exits at the first padding slot: the real tokens "
                           "after a -1 (a -1 anywhere in the mapping) are never written",
                           {}, subjects::WriteMutation::kMinusOneStopsWrite));
  c.push_back(fused_mutant("per-head-scale-as-head-0",
                           "a scalar-scale kernel handed per-head K/V scales: every head divided "
                           "by head 0's",
                           {}, subjects::WriteMutation::kPerHeadScaleAsHead0));
  c.push_back(fused_mutant("fp8-flush-to-zero",
                           "an fp8 cast compiled with flush-to-zero: subnormal codes become +-0",
                           {}, subjects::WriteMutation::kFp8FlushToZero));
  c.push_back(fused_mutant("fp8-round-half-away",
                           "an fp8 cast rounding ties away from zero where SPEC 2 rounds to even",
                           {}, subjects::WriteMutation::kRoundHalfAway));
  c.push_back(fused_mutant("zero-group-scale",
                           "vllm#53339's class: a blockscale quantizer without the amax floor, so "
                           "an all-zero group gets scale 0 and NaN codes",
                           {}, subjects::WriteMutation::kZeroGroupScale));
  c.push_back(fused_mutant("strided-assumed-dense",
                           "flashinfer#527 / TensorRT-LLM#17285 class: a padded or pooled cache "
                           "view (K/V or index-K) addressed as the layout's dense tensor",
                           {}, subjects::WriteMutation::kStridedAssumedDense));
  c.push_back(fused_mutant("vector-tail-overrun",
                           "a 16-byte vector store with no tail case: a head row whose bytes are "
                           "not a multiple of 16 zeroes the bytes past its end",
                           {}, subjects::WriteMutation::kVectorTailOverrun));
  c.push_back(fused_mutant("int32-offset",
                           "vllm#50427, tokenspeed#501, ROCm/aiter#5765: `slot * stride` in int32, "
                           "so a store past element 2^31 of a huge cache wraps before it",
                           {}, subjects::WriteMutation::kInt32Offset));
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
  // A legacy-wrap race resolved byte by byte. First-writer-wins is no bug: SPEC 3 admits any one
  // racing writer per element. An element holding bytes of two writers is one.
  c.push_back(write_mutant(
      "legacy-wrap-torn-element",
      "a wrapped-slot race (vllm#43810's index_put_) settled per byte, not per element: an "
      "element with bytes of two writers",
      {}, [](const auto& cfg, const auto& w, auto& out) {
        // The reference's pick (the last writer) into `out`; with the tokens reversed, the first
        // writer's into `first`. The two differ only on slots that several tokens wrap onto.
        spec::LayerCaches first = out;
        reference::write_layer(cfg, w, out);
        reference::write_layer(cfg, reversed_tokens(w), first);
        for (spec::CacheBuffer& b : out.buffers) {
          const spec::ByteStorage& f = first.find(b.kind)->storage;
          for (const auto& [from, to] : b.storage.compare_ranges(f)) {
            for (std::int64_t i = from; i < to; i += 2) {  // even bytes: the first writer's
              if (b.storage.byte(i) != f.byte(i))
                b.storage[static_cast<std::size_t>(i)] = f.byte(i);
            }
          }
        }
      }));

  ReadOverrides prefill;  // causal masking shows on rows with later tokens of the same request
  c.push_back(read_mutant("missing-causal-mask",
                          "attention: a query sees the later tokens of its block",
                          spec::Op::kAttention, prefill, {.no_causal_mask = true}, false));
  c.push_back(read_mutant("n-valid-off-by-one", "indexer: (p + sb) // sb computed as p // sb + 2",
                          spec::Op::kIndexer, {}, {.n_valid_offset = 1}, false));
  c.push_back(read_mutant("local-block-ignored", "indexer: the local (current) block is not forced",
                          spec::Op::kIndexer, {}, {.ignore_local = true}, false));
  ReadOverrides nan_rows;  // NaN token scores occur; index_nan is drawn (skip, first, lowest)
  nan_rows.nan_index_k = true;
  c.push_back(read_mutant("nan-block-ranked-first",
                          "indexer: a block with a NaN token score ranks first (torch amax + topk) "
                          "where index_nan skip or lowest is declared",
                          spec::Op::kIndexer, nan_rows, {.nan_first = true}, false));
  c.push_back(read_mutant("union-where-max",
                          "indexer: each index head's top-k and their union (TensorRT-LLM's "
                          "triton backend) where index_group max is declared",
                          spec::Op::kIndexer, {}, {.union_where_max = true}, false));
  c.push_back(read_mutant("neg-inf-dropped",
                          "indexer: a chosen -inf block dropped to -1 (TensorRT-LLM's selector) "
                          "where index_neg_inf keep is declared",
                          spec::Op::kIndexer, {}, {.drop_neg_inf_always = true}, false));
  c.push_back(read_mutant("ids-wrap-at-1024",
                          "top-k: block ids kept in 10 bits, a short path (<= 1024 blocks) "
                          "applied to a longer row",
                          spec::Op::kIndexer, {}, {.id_bits = 10}, false));
  c.push_back(read_mutant("ids-wrap-at-4096",
                          "top-k: block ids kept in 12 bits, a path sized for 4096 blocks applied "
                          "to a longer row",
                          spec::Op::kIndexer, {}, {.id_bits = 12}, false));
  // Offsets in 32 bits (the huge-cache theme reaches past 2^32 bytes of every read buffer).
  c.push_back(read_mutant("indexer-uint32-offset",
                          "indexer: index-K byte offsets in uint32 (vllm#50427's class): a read "
                          "past byte 2^32 of a huge cache lands 4 GiB early",
                          spec::Op::kIndexer, {}, {.offset_bits = 32}, false));
  c.push_back(read_mutant("attention-uint32-offset",
                          "attention: K/V byte offsets in uint32 (vllm#50427's class): a read past "
                          "byte 2^32 of a huge cache lands 4 GiB early",
                          spec::Op::kAttention, {}, {.offset_bits = 32}, false));
  c.push_back(
      mutant("head-major-as-token-major", spec::Op::kIndexer,
             "vllm#48604: an indexer's head-major [H, T, K] ids read as token-major "
             "[T, H, K]",
             {}, [](const std::string& n) {
               return make_cpu_naive_indexer(
                   n, {{spec::TopkOrder::kDescendingScore}, spec::TopkLayout::kHeadMajor, true});
             }));
  c.push_back(mutant("keys-coarser-than-declared", spec::Op::kIndexer,
                     "top-k ranked by 12-bit score keys where 16-bit keys (msa_v1) are declared",
                     {}, [](const std::string& n) {
                       return make_cpu_naive_indexer(n, {{spec::TopkOrder::kDescendingScore,
                                                          spec::TopkLayout::kTokenMajor, 16},
                                                         std::nullopt,
                                                         true,
                                                         12});
                     }));
  ReadOverrides ties;
  ties.tied_scores = true;
  c.push_back(read_mutant("reversed-tie-order", "top-k: equal scores won by the higher block id",
                          spec::Op::kIndexer, ties, {.ties_to_higher_id = true}, true));
  // Production widths (issue 54): 16-wide rows, their leading masked entries, wide ties.
  c.push_back(read_mutant("topk-capped-at-8",
                          "top-k: an 8-wide output buffer under a 16-wide selection (the row's "
                          "later ids lost)",
                          spec::Op::kIndexer, {}, {.kept_at_most = 8}, true));
  c.push_back(read_mutant("topk-capped-at-1024",
                          "top-k: a selection buffer of 1024 entries under DeepSeek-V3.2's "
                          "top-2048 token selection (the row's later half lost)",
                          spec::Op::kIndexer, {}, {.kept_at_most = 1024}, true));
  c.push_back(read_mutant("wide-ties-to-higher-id",
                          "top-k: a tie of more than 16 blocks at the cut won by the higher ids (a "
                          "16-lane tie-breaking network), narrower ties by the rule",
                          spec::Op::kIndexer, {}, {.wide_ties_to_higher_id = true}, true));
  c.push_back(read_mutant("masked-entries-trailing",
                          "attention: a selection row's first n entries read, n its selected ids, "
                          "as if masked -1 entries trailed (vllm#48364: leading masked entries)",
                          spec::Op::kAttention, {}, {.masked_entries_trailing = true}, true));
  c.push_back(read_mutant("softmax-scale-twice",
                          "attention: sm_scale applied to q and again to the scores",
                          spec::Op::kAttention, {}, {.scale_twice = true}, true));
  c.push_back(
      dense_mutant("dense-gptj-rope",
                   "dense insert: GPT-J (interleaved) RoPE where NeoX (half split) is declared", {},
                   {.gptj_rope = true}));
  c.push_back(
      dense_mutant("dense-norm-without-one",
                   "dense insert: Llama RMSNorm x*r*w where Gemma's x*r*(1 + w) is declared", {},
                   {.norm_without_one = true}));
  c.push_back(dense_mutant("dense-eps-outside-sqrt",
                           "dense insert: r = 1 / (sqrt(ms) + eps) instead of 1 / sqrt(ms + eps)",
                           {}, {.eps_outside_sqrt = true}));
  c.push_back(dense_mutant("dense-rope-over-tail-dims",
                           "dense insert: RoPE over the last rotary_dim dims (a rope-last layout, "
                           "as DeepSeek MLA's k_pe) where SPEC 4 rotates the first",
                           {}, {.rope_over_tail_dims = true}));
  // The same bugs in vLLM's arithmetic (rsqrtf, another reduction order), judged as a foreign
  // dense insert by admissible sets around the float64 truth (SPEC 4), default cases only.
  const auto engine_dense = [&](const char* name, const char* models, DenseMutation mutation) {
    c.push_back(mutant(name, spec::Op::kDense, models, {}, [mutation](const std::string& n) {
      return make_cpu_dense_subject(mutation, n, subjects::DenseArithmetic::kEngine);
    }));
  };
  engine_dense("engine-dense-gptj-rope",
               "foreign dense insert: GPT-J RoPE where NeoX is declared (vLLM's arithmetic)",
               {.gptj_rope = true});
  engine_dense("engine-dense-norm-without-one",
               "foreign dense insert: x*r*w where Gemma's x*r*(1 + w) is declared",
               {.norm_without_one = true});
  engine_dense("engine-dense-eps-off",
               "foreign dense insert: eps 1e-5 where 1e-6 is declared (seen on tiny heads)",
               {.eps_factor = 10.0f});
  engine_dense("engine-dense-rope-over-tail-dims",
               "foreign dense insert: RoPE over the last rotary_dim dims (a rope-last layout) "
               "where SPEC 4 rotates the first",
               {.rope_over_tail_dims = true});
  engine_dense("engine-dense-fp8-store-unscaled",
               "foreign dense insert: fp8 stored with scale 1 where the scales divide",
               {.fp8_store_unscaled = true});
  CaseOverrides fp8_scaled;
  fp8_scaled.kv_dtype = spec::DType::kFp8E4M3;
  fp8_scaled.scale_mode = spec::ScaleMode::kDivide;
  c.push_back(dense_mutant(
      "dense-fp8-store-unscaled",
      "vLLM's fused M3 insert stores fp8 with scale 1 where its unfused path divides by k_scale",
      fp8_scaled, {.fp8_store_unscaled = true}));
  // Bugs near the bound of a flash-style attention (FlashAttention arithmetic: P rounded to bf16,
  // ex2.approx), judged under its bf16_p profile, the loosest: every profile must still see them.
  const auto flash_mutant = [&](const char* name, const char* models, spec::AttentionBug bug) {
    c.push_back(mutant(name, spec::Op::kAttention, models, {}, [bug](const std::string& n) {
      return make_cpu_flash_subject(n, spec::AttentionProfile::kBf16P, bug);
    }));
  };
  flash_mutant("flash-drop-chunk-last", "flash attention: the last token of a chunk dropped",
               spec::AttentionBug::kDropChunkLast);
  flash_mutant("flash-scale-off", "flash attention: softmax scale off by a factor of 1 + 2^-7",
               spec::AttentionBug::kScaleOff);
  flash_mutant("flash-neighbour-v", "flash attention: V read from the neighbouring KV head",
               spec::AttentionBug::kNeighbourV);
  flash_mutant("flash-stop-at-minus-one",
               "flash attention: the selection read up to its first -1 (SPEC 6 allows -1 "
               "anywhere; a -1-first row loses its blocks)",
               spec::AttentionBug::kStopAtMinusOne);
  flash_mutant("flash-masked-chunk-nan",
               "flash attention: an id past n_valid kept as an all-masked block, first in its row "
               "with no Check_inf: exp2(-inf - -inf) = NaN",
               spec::AttentionBug::kMaskedChunkNan);
#ifdef KVO_HAVE_CUDA
  // The same bugs planted in the CUDA kernels (kvo_gpu_testing); run where a GPU answers.
  using gpu::testing::ReadFault;
  using gpu::testing::WriteFault;
  const auto cuda_write = [&](const char* name, const char* models, WriteFault fault) {
    c.push_back(mutant(name, spec::Op::kWrite, models, {}, [fault](const std::string& n) {
      return make_cuda_fault_subject(n, fault);
    }));
  };
  cuda_write("cuda-minus-one-wraps", "vllm#43810 in the fused kernel",
             WriteFault::kWrapNegativeSlots);
  cuda_write("cuda-off-by-one-offset", "a slot decoded one position late, in the fused kernel",
             WriteFault::kOffsetPlusOne);
  cuda_write("cuda-hnd-nhd-stride-swap", "head and token strides exchanged, in the fused kernel",
             WriteFault::kSwapHndNhd);
  cuda_write("cuda-strided-assumed-dense",
             "a strided cache view (K/V or index-K) addressed as the dense tensor, in the fused "
             "kernel",
             WriteFault::kStridedAssumedDense);
  cuda_write("cuda-per-head-scale-as-head-0",
             "per-head K/V scales read as head 0's, in the fused kernel",
             WriteFault::kPerHeadScaleAsHead0);
  cuda_write("cuda-int32-offset",
             "K/V element offsets in int32 (vllm#50427 class), in the fused kernel: a store past "
             "element 2^31 of a huge cache is lost",
             WriteFault::kInt32Offset);
  cuda_write("cuda-zero-group-scale",
             "vllm#53339's class in the fused kernel: the blockscale quantizer without the amax "
             "floor, an all-zero group's codes NaN",
             WriteFault::kZeroGroupScale);
  cuda_write("cuda-minus-one-stops-write",
             "a token loop that exits at the first padding slot, ahead of the fused kernel: the "
             "real tokens after a -1 are never written",
             WriteFault::kMinusOneStopsWrite);
  cuda_write("cuda-fp8-flush-to-zero",
             "an fp8 cast compiled with flush-to-zero, in the fused kernel: subnormal K/V codes "
             "become +-0",
             WriteFault::kFp8FlushToZero);
  cuda_write("cuda-fp8-round-half-away",
             "an fp8 cast rounding ties away from zero where SPEC 2 rounds to even, in the fused "
             "kernel",
             WriteFault::kRoundHalfAway);
  cuda_write("cuda-vector-tail-overrun",
             "16-byte vector stores with no tail case, in the fused kernel: a head row of 8 (mod "
             "16) bytes zeroes the 8 bytes past its end",
             WriteFault::kVectorTailOverrun);
  cuda_write("cuda-legacy-wrap-torn-element",
             "a wrapped-slot race settled per byte, in the fused kernel: a K/V element with the "
             "first writer's even bytes and the last writer's odd ones",
             WriteFault::kTornWrapRace);
  // The real kernels' findings, planted in the CUDA write kernels (peer_findings.md).
  const auto cuda_finding = [&](const char* name, const char* models, CaseOverrides o,
                                std::unique_ptr<Subject> (*make)(const std::string&)) {
    c.push_back(mutant(name, spec::Op::kWrite, models, write_part(std::move(o)), make));
  };
  CaseOverrides div_approx;
  div_approx.scale_mode = spec::ScaleMode::kDivApprox;
  cuda_finding("cuda-div-approx-one-code-beyond",
               "div.full.f32 result moved one code past the 2-ulp window: the admissible sets "
               "must not be one code too wide",
               div_approx, make_cuda_div_approx_beyond_subject);
  cuda_finding("cuda-e4m3-into-e5m2", "vLLM's Triton wrapper: e4m3 codes in an fp8_e5m2 cache",
               e5m2, make_cuda_e4m3_into_e5m2_subject);
  cuda_finding("cuda-truncating-minus-one",
               "TRT-LLM fused_write_layer_caches without the slot < 0 check: -1 writes at page 0, "
               "offset -1",
               strict_slots, make_cuda_trunc_div_negative_slot_subject);
  // Bugs planted in the fast (foreign-order) read kernels: the foreign mode must reject them.
  const auto cuda_read = [&](const char* name, spec::Op op, const char* models, ReadFault fault) {
    c.push_back(mutant(name, op, models, {}, [fault](const std::string& n) {
      return make_cuda_read_fault_subject(n, fault);
    }));
  };
  c.push_back(mutant("cuda-head-major-as-token-major", spec::Op::kIndexer,
                     "vllm#48604: the fast indexer's head-major ids declared token-major", {},
                     make_cuda_head_major_as_token_major_subject));
  cuda_read("cuda-fast-local-block-ignored", spec::Op::kIndexer,
            "the fast indexer leaves the local block unforced", ReadFault::kIgnoreLocal);
  cuda_read("cuda-fast-ids-wrap-at-1024", spec::Op::kIndexer,
            "the fast top-k stores block ids in 10 bits (a short path applied past 1024 blocks)",
            ReadFault::kIdsWrapAt1024);
  // The tie rule in the canonical selection: the fast family's foreign judge admits any order of
  // tied blocks (SPEC 7), the canonical one is judged bit for bit.
  c.push_back(mutant("cuda-ties-to-higher-id", spec::Op::kIndexer,
                     "top-k: an exact tie won by the higher block id, in the canonical selection",
                     {}, [](const std::string& n) {
                       return make_cuda_read_fault_subject(n, ReadFault::kTiesToHigherId, true);
                     }));
  const auto cuda_flash = [&](const char* name, const char* models, ReadFault fault) {
    c.push_back(mutant(name, spec::Op::kAttention, models, {}, [fault](const std::string& n) {
      return make_cuda_flash_fault_subject(n, fault);
    }));
  };
  cuda_flash("cuda-flash-drop-chunk-last", "the last token of a chunk dropped, in the flash kernel",
             ReadFault::kFlashDropChunkLast);
  cuda_flash("cuda-flash-scale-off", "softmax scale off by 1 + 2^-7, in the flash kernel",
             ReadFault::kFlashScaleOff);
  cuda_flash("cuda-flash-neighbour-v", "V from the neighbouring KV head, in the flash kernel",
             ReadFault::kFlashNeighbourV);
  cuda_flash("cuda-flash-stop-at-minus-one",
             "the selection read up to its first -1, in the flash kernel",
             ReadFault::kFlashStopAtMinusOne);
  cuda_flash("cuda-flash-masked-chunk-nan",
             "a leading id past n_valid as an all-masked block without Check_inf (NaN), in the "
             "flash kernel",
             ReadFault::kFlashMaskedChunkNan);
  cuda_read("cuda-fast-exp-without-log2e", spec::Op::kAttention,
            "the fast softmax computes exp2(s) without folding log2(e) into the scale",
            ReadFault::kExpNoLog2e);
  // The dense insert's bugs in the CUDA kernels: vLLM's arithmetic (foreign, admissible sets) and
  // the canonical kernel, default cases only.
  using gpu::testing::DenseFault;
  const auto cuda_dense = [&](const char* name, const char* models, DenseFault fault, bool engine) {
    c.push_back(mutant(name, spec::Op::kDense, models, {}, [fault, engine](const std::string& n) {
      return make_cuda_dense_fault_subject(n, fault, engine);
    }));
  };
  cuda_dense("cuda-engine-dense-gptj-rope",
             "GPT-J RoPE where NeoX is declared, in the engine kernel", DenseFault::kGptjRope,
             true);
  cuda_dense("cuda-engine-dense-norm-without-one",
             "x*r*w where Gemma's x*r*(1 + w) is declared, in the engine kernel",
             DenseFault::kNormWithoutOne, true);
  cuda_dense("cuda-engine-dense-eps-off", "eps 1e-5 where 1e-6 is declared, in the engine kernel",
             DenseFault::kEpsOff, true);
  cuda_dense("cuda-engine-dense-fp8-store-unscaled",
             "fp8 stored with scale 1 where the scales divide, in the engine kernel",
             DenseFault::kFp8StoreUnscaled, true);
  cuda_dense("cuda-engine-dense-rope-over-tail-dims",
             "RoPE over the last rotary_dim dims, in the engine kernel",
             DenseFault::kRopeOverTailDims, true);
  cuda_dense("cuda-dense-rope-over-tail-dims",
             "RoPE over the last rotary_dim dims, in the canonical kernel",
             DenseFault::kRopeOverTailDims, false);
#endif
  return c;
}

}  // namespace

const std::vector<Mutant>& mutant_catalogue() {
  static const std::vector<Mutant> catalogue = build_catalogue();
  return catalogue;
}

void add_named_mutants(const std::vector<std::string>& names, SubjectList& subjects) {
  for (const Mutant& m : mutant_catalogue()) {
    if (std::find(names.begin(), names.end(), m.name) != names.end()) subjects.push_back(m.make());
  }
}

std::vector<MutantResult> run_mutants(const MutantRun& run) {
  const auto& cat = mutant_catalogue();
  const std::vector<std::string>& names = run.names;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (std::none_of(cat.begin(), cat.end(), [&](const Mutant& m) { return m.name == names[i]; })) {
      std::string known;
      for (const Mutant& m : cat) known += (known.empty() ? "" : "|") + m.name;
      throw spec::InvalidInput("mutant", static_cast<std::int64_t>(i), names[i],
                               "unknown mutant; known: " + known);
    }
  }
  if (run.seeds < 1)
    throw spec::InvalidInput("seeds", -1, std::to_string(run.seeds), "must be >= 1");
  // One mutant's campaigns, from each seed, with `jobs` campaign jobs.
  const auto run_one = [&run](const Mutant& m, std::unique_ptr<Subject> subject,
                              std::int64_t jobs) {
    SubjectList subjects;
    subjects.push_back(std::move(subject));
    MutantResult res;
    res.name = m.name;
    res.op = m.op;
    res.models = m.models;
    res.skipped = subjects.front()->unavailable_reason();
    if (!res.skipped.empty()) return res;
    std::vector<std::int64_t> to_kill;
    for (std::int64_t i = 0; i < run.seeds; ++i) {
      CheckOptions o;
      o.seed = i == 0 ? run.seed : case_seed(run.seed, 1000 + static_cast<std::uint64_t>(i));
      o.cases = run.max_cases;
      if (run.targeted) o.overrides = m.overrides;
      o.ops = {m.op};
      o.fail_fast = true;
      o.jobs = jobs;
      const CheckReport r = run_check(o, subjects);
      const bool killed = r.worst != spec::Outcome::kPass;
      to_kill.push_back(killed ? r.cases_run : run.max_cases + 1);
      res.seeds_killed += killed;
      if (i > 0) continue;
      res.killed = killed;
      res.cases = r.cases_run;
      for (const auto& s : r.subjects) {
        if (!s.first_failure.empty()) res.first_failure = s.first_failure;
      }
    }
    res.seeds = run.seeds;
    std::sort(to_kill.begin(), to_kill.end());
    const std::size_t n = to_kill.size();
    res.median_cases = n % 2 == 1 ? static_cast<double>(to_kill[n / 2])
                                  : 0.5 * static_cast<double>(to_kill[n / 2 - 1] + to_kill[n / 2]);
    res.worst_cases = to_kill.back();
    return res;
  };
  // Concurrent mutants on up to `jobs` worker threads (a campaign each, stopping at its first
  // kill, so one job apiece wastes nothing); the rest here, with the campaign's own jobs. Results
  // in catalogue order.
  const std::int64_t jobs = campaign_jobs(run.jobs);
  std::vector<std::future<MutantResult>> results_ahead;
  std::deque<std::future<MutantResult>*> running;
  std::vector<const Mutant*> chosen;
  for (const Mutant& m : cat) {
    if (names.empty() || std::find(names.begin(), names.end(), m.name) != names.end())
      chosen.push_back(&m);
  }
  results_ahead.reserve(chosen.size());
  for (const Mutant* m : chosen) {
    std::unique_ptr<Subject> subject = m->make();
    if (subject->concurrent()) {
      while (static_cast<std::int64_t>(running.size()) >= jobs) {
        running.front()->wait();
        running.pop_front();
      }
      results_ahead.push_back(
          std::async(std::launch::async, [&run_one, m, s = std::move(subject)]() mutable {
            return run_one(*m, std::move(s), 1);
          }));
      running.push_back(&results_ahead.back());
    } else {
      std::promise<MutantResult> here;
      here.set_value(run_one(*m, std::move(subject), run.jobs));
      results_ahead.push_back(here.get_future());
    }
  }
  std::vector<MutantResult> results;
  for (auto& f : results_ahead) results.push_back(f.get());
  return results;
}

}  // namespace kvo::oracle
