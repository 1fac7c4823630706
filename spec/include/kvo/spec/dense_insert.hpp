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

/// How the dense insert scales K and V before the cast (SPEC 4): `scaled` as the write's scale mode
/// says (vLLM's unfused path: divide by k_scale / v_scale, via the model dtype when declared), or
/// `identity` (vLLM's fused kernel: scale 1, the scales ignored). The two paths of one engine
/// disagree whenever a scale is not 1, so which one a kernel implements is a mode.
enum class DenseFp8Store : std::uint8_t { kScaled, kIdentity };

template <>
struct EnumInfo<DenseFp8Store> {
  static constexpr std::string_view kNoun = "dense_fp8_store";
  static constexpr std::array<EnumName<DenseFp8Store>, 2> kNames{
      {{DenseFp8Store::kScaled, "scaled"}, {DenseFp8Store::kIdentity, "identity"}}};
};

struct DenseInsert {
  HostTensor q;                      ///< [T_src, nq, hd] act dtype
  LayerWrite kv;                     ///< dense write: k, v [T_src, nkv, hd], slots [T], scales
  std::vector<float> q_norm_weight;  ///< [hd]: y = x * r * (1 + w)
  std::vector<float> k_norm_weight;  ///< [hd]
  float eps = 1e-6f;                 ///< RMSNorm epsilon
  std::int64_t rotary_dim = 64;      ///< even, <= hd: dims [0, rotary_dim) are rotated
  std::vector<float> cos_sin;  ///< [max_pos, rotary_dim]: cos of the rotary_dim/2 pairs, then sin
  std::vector<std::int64_t> positions;  ///< [T] in [0, max_pos)
  DenseFp8Store fp8_store = DenseFp8Store::kScaled;

  /// The scale K (which 0) or V (which 1) of KV head h is stored with: its scale, or 1 under
  /// identity.
  float store_scale(int which, std::int64_t h, bool per_head_scale) const {
    if (fp8_store == DenseFp8Store::kIdentity) return 1.0f;
    const std::vector<float>& s = which == 0 ? kv.k_scale : kv.v_scale;
    return s[per_head_scale ? static_cast<std::size_t>(h) : 0];
  }
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
