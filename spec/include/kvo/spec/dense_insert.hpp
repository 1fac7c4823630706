#pragma once
/// \file dense_insert.hpp
/// Plain data of the dense-layer fused insert (SPEC 4, the vLLM MiniMax-M3 qknorm + rope + insert):
/// per token and head, Gemma RMSNorm of q and k, partial NeoX RoPE from a given cos/sin table, q
/// written out, k and v inserted into the layer's caches as a SPEC 4 write. Shared by the reference
/// and the GPU kernel; nothing here computes.

#include <cstdint>
#include <string>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::spec {

struct DenseInsert {
  HostTensor q;                      ///< [T_src, nq, hd] act dtype
  LayerWrite kv;                     ///< dense write: k, v [T_src, nkv, hd], slots [T], scales
  std::vector<float> q_norm_weight;  ///< [hd]: y = x * r * (1 + w)
  std::vector<float> k_norm_weight;  ///< [hd]
  float eps = 1e-6f;                 ///< RMSNorm epsilon
  std::int64_t rotary_dim = 64;      ///< even, <= hd: dims [0, rotary_dim) are rotated
  std::vector<float> cos_sin;  ///< [max_pos, rotary_dim]: cos of the rotary_dim/2 pairs, then sin
  std::vector<std::int64_t> positions;  ///< [T] in [0, max_pos)
};

/// Throws InvalidInput on the first inconsistency (beyond validate_write of the K/V part).
inline void validate_dense_insert(const ModelConfig& c, const DenseInsert& d) {
  validate_write(c, d.kv);
  const CacheGeometry& g = c.geometry;
  const auto tokens = static_cast<std::int64_t>(d.kv.slots.slots.size());
  if (d.kv.kind != LayerKind::kDense) {
    throw InvalidInput("kv.kind", -1, std::string(name_of(d.kv.kind)),
                       "the fused insert is for dense layers");
  }
  if (d.q.dtype != c.act_dtype || d.q.shape.size() != 3 || d.q.shape[0] < tokens ||
      d.q.shape[2] != g.head_dim || d.q.shape[1] < 1 ||
      static_cast<std::int64_t>(d.q.bytes.size()) !=
          d.q.numel() * static_cast<std::int64_t>(dtype_bytes(c.act_dtype))) {
    throw InvalidInput("q", -1, "tensor", "expected [>= T, nq, head_dim] of the activation dtype");
  }
  if (static_cast<std::int64_t>(d.q_norm_weight.size()) != g.head_dim ||
      static_cast<std::int64_t>(d.k_norm_weight.size()) != g.head_dim) {
    throw InvalidInput("norm_weight", -1, "size", "expected head_dim weights for q and for k");
  }
  if (d.rotary_dim < 2 || d.rotary_dim % 2 != 0 || d.rotary_dim > g.head_dim) {
    throw InvalidInput("rotary_dim", -1, std::to_string(d.rotary_dim),
                       "must be even, in [2, head_dim]");
  }
  if (d.cos_sin.empty() || d.cos_sin.size() % static_cast<std::size_t>(d.rotary_dim) != 0) {
    throw InvalidInput("cos_sin", -1, std::to_string(d.cos_sin.size()),
                       "expected [max_pos, rotary_dim]");
  }
  const auto max_pos = static_cast<std::int64_t>(d.cos_sin.size()) / d.rotary_dim;
  if (static_cast<std::int64_t>(d.positions.size()) != tokens) {
    throw InvalidInput("positions", -1, std::to_string(d.positions.size()),
                       "expected one per token");
  }
  for (std::size_t t = 0; t < d.positions.size(); ++t) {
    if (d.positions[t] < 0 || d.positions[t] >= max_pos) {
      throw InvalidInput("positions", static_cast<std::int64_t>(t), std::to_string(d.positions[t]),
                         "outside the cos/sin table of " + std::to_string(max_pos) + " positions");
    }
  }
}

}  // namespace kvo::spec
