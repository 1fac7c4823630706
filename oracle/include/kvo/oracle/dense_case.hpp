#pragma once
/// \file dense_case.hpp
/// The dense-layer fused insert (vLLM MiniMax-M3 qknorm + rope + insert, SPEC 4): random cases
/// (head dims 32..256, GQA ratios, every layout, cache dtype, saturation and scale mode, -1
/// padding) and the subjects that implement it. Finite inputs only: a NaN in a head makes the whole
/// row NaN, and the NaN bits of fp32 arithmetic are not specified by SPEC 4.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvo/spec/dense_insert.hpp"

namespace kvo::oracle {

struct DenseCase {
  std::uint64_t seed = 0;
  spec::ModelConfig config;
  spec::DenseInsert in;

  std::string describe() const;
};

DenseCase make_dense_case(std::uint64_t seed);

/// A named implementation of the dense insert: writes K and V into `caches` and returns q_out
/// [T, nq, hd]. Throws like a WriteSubject.
class DenseSubject {
 public:
  virtual ~DenseSubject() = default;
  virtual std::string name() const = 0;
  virtual std::string unavailable_reason() const { return {}; }
  virtual spec::HostTensor insert(const spec::ModelConfig& config, const spec::DenseInsert& in,
                                  spec::LayerCaches& caches) = 0;
};

/// Every dense-insert subject this build knows (cuda-dense-qknorm-rope with CUDA).
std::vector<std::unique_ptr<DenseSubject>> make_dense_subjects();

}  // namespace kvo::oracle
