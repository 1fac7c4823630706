#pragma once
/// \file cpu_subjects.hpp
/// The CPU subjects, which CPU-only CI diffs against the reference: the emulations of subjects/
/// (cpu-fused, cpu-unfused, cpu-dense, cpu-naive-f32, cpu-flash-bf16, cpu-flash-fp16) as Subjects,
/// with their planted bugs (modelled on real ones, anchors_kvcache.md 6), and canonical read
/// mutants built on the reference.

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kvo/oracle/subject.hpp"
#include "kvo/subjects/cpu_dense.hpp"
#include "kvo/subjects/cpu_read.hpp"

namespace kvo::oracle {

using subjects::DenseMutation;
using subjects::ReadMutation;

/// "cpu-naive-f32": float32 in the order a torch user writes it (sequential sums, std::exp, one
/// softmax over all tokens, top-k by descending score with ties to the higher id): a foreign
/// subject of the indexer and attention.
std::unique_ptr<Subject> make_cpu_naive_subject(ReadMutation mutation = {},
                                                std::string name = "cpu-naive-f32");

/// How a cpu-naive indexer declares and writes its output.
struct NaiveTopk {
  TopkForm declared{spec::TopkOrder::kDescendingScore};  ///< key precision: what it selects on
  /// The layout it writes, when not the declared one: a bug
  std::optional<spec::TopkLayout> written;
  bool indexer_only = false;
  int ranked_key_bits = 0;  ///< the key precision it selects on, when not the declared one: a bug
};

/// The naive indexer in the engines' declared forms (SPEC 5), indexer only: "cpu-naive-head-major"
/// (vLLM's Triton M3 indexer: descending score, head-major [H, T, K]) and "cpu-naive-keys16"
/// (ranked by 16-bit score keys, as MSA's msa_v1 top-k).
inline const std::array<std::pair<const char*, TopkForm>, 2> kNaiveIndexerForms{{
    {"cpu-naive-head-major", {spec::TopkOrder::kDescendingScore, spec::TopkLayout::kHeadMajor}},
    {"cpu-naive-keys16", {spec::TopkOrder::kDescendingScore, spec::TopkLayout::kTokenMajor, 16}},
}};

/// A cpu-naive indexer (attention too unless topk.indexer_only) with the given form.
std::unique_ptr<Subject> make_cpu_naive_indexer(std::string name, NaiveTopk topk);

/// A flash-style attention (subjects::flash_attention) under `profile`, foreign, attention only,
/// with `bug` planted: "cpu-flash-bf16" (kBf16P) and "cpu-flash-fp16" (kFp16P) without one; the
/// mutants of spec::AttentionBug with one.
std::unique_ptr<Subject> make_cpu_flash_subject(std::string name, spec::AttentionProfile profile,
                                                spec::AttentionBug bug = spec::AttentionBug::kNone);

/// A canonical read subject built from the reference with a planted bug (for exact-mode tests).
std::unique_ptr<Subject> make_canonical_mutant(ReadMutation mutation, std::string name);

/// "cpu-dense": the dense insert (SPEC 4) in the structure of a fused kernel, canonical; with
/// DenseArithmetic::kEngine ("cpu-dense-engine") in vLLM's arithmetic, a foreign subject.
std::unique_ptr<Subject> make_cpu_dense_subject(
    DenseMutation mutation = {}, std::string name = "cpu-dense",
    subjects::DenseArithmetic arithmetic = subjects::DenseArithmetic::kCanonical);

/// Every CPU subject, in a fixed order: cpu-fused, cpu-unfused, cpu-dense, cpu-dense-engine,
/// cpu-naive-f32, cpu-naive-head-major, cpu-naive-keys16, cpu-flash-bf16, cpu-flash-fp16.
SubjectList make_cpu_subjects();

}  // namespace kvo::oracle
