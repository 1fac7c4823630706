#pragma once
/// \file generator.hpp
/// Generated data (SPEC 8): every value is a pure function of (seed, layer, tensor, request, token
/// position, head, dim) through SplitMix64, so a replayed step writes the same K/V for the same
/// token on every machine, CPU and GPU alike. Edge-value mode mixes in zeros, subnormals, fp8
/// rounding ties and values at and past the fp8 maxima, and, where allowed, infinities and NaN.

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kvo/spec/generated_values.hpp"
#include "kvo/spec/types.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::reference {

/// SplitMix64's finaliser (spec/generated_values.hpp: the one definition, host and device).
using spec::mix64;

/// A SplitMix64 stream: next() = mix64(state += golden gamma).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  /// Uniform integer in [lo, hi] (hi - lo < 2^32; modulo bias is irrelevant for case drawing).
  std::int64_t uniform(std::int64_t lo, std::int64_t hi);
  /// True with probability num/den.
  bool chance(std::uint32_t num, std::uint32_t den);
  /// Fisher-Yates shuffle of `v` in place (last index first).
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) {
      std::swap(v[i - 1],
                v[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(i) - 1))]);
    }
  }

 private:
  std::uint64_t state_;
};

/// Which tensor a generated value belongs to (a key field).
enum class GenTensor : std::uint8_t { kK = 0, kV = 1, kIndexK = 2, kQ = 3, kIndexQ = 4 };

/// The key hash: h = mix64(seed); then for each field f in order, h = mix64(h ^ mix64(f + 1)).
std::uint64_t value_key(std::uint64_t seed, std::int64_t layer, GenTensor tensor,
                        std::int64_t request, std::int64_t position, std::int64_t head,
                        std::int64_t dim);

struct ValueGenerator {
  std::uint64_t seed = 0;
  float range = 4.0f;  ///< r: ordinary values are uniform in [-r, r)
  spec::DType act = spec::DType::kBF16;
  bool edge_values = false;      ///< mix in the edge table (one value in four)
  bool allow_nonfinite = false;  ///< let the edge table contribute +-inf and NaN

  /// The value for one element, already rounded to `act` (so widening it back is exact).
  /// Ordinary: u = top 24 bits of the key; x = fl(fl(u * 2^-23 - 1) * r), rounded to act.
  float value(std::int64_t layer, GenTensor tensor, std::int64_t request, std::int64_t position,
              std::int64_t head, std::int64_t dim) const;

  /// The same values a row at a time: the key chain up to the position is hashed once per row.
  /// row_key(...) then value_in_row(key, head, dim) == value(..., head, dim).
  std::uint64_t row_key(std::int64_t layer, GenTensor tensor, std::int64_t request,
                        std::int64_t position) const;
  float value_in_row(std::uint64_t row_key, std::int64_t head, std::int64_t dim) const;
  /// A whole row [heads, dim] (out[h * dim + d] == value_in_row(row_key, h, d)), hashing each
  /// head once and the dims from a table: a trace replay generates millions of values per step.
  void fill_row(std::uint64_t row_key, std::int64_t heads, std::int64_t dim, float* out) const;

 private:
  float value_of_key(std::uint64_t key) const;
  /// An ordinary value before its rounding to `act`: uniform in [-range, range).
  float ordinary_value(std::uint64_t key) const { return spec::ordinary_value(key, range); }
};

/// A generated row's key fields past (layer, tensor): the request id and the token position.
struct RowKey {
  std::int64_t request = 0, position = 0;
};

/// Generated values as the activations a case or a replay step hands a kernel: one row per key,
/// [keys, heads, dim] (heads > 0) or [keys, dim] (heads == 0: one head), in `gen.act` codes.
/// Row r, head h, dim d holds encode(x, act, satfinite) of x = gen.value(layer, which,
/// keys[r].request, keys[r].position, h, d), or, with a `bias`, of round_to(x + bias, act) (a read
/// case's shifted V; adding 0 turns -0 into +0).
spec::HostTensor generated_rows(const ValueGenerator& gen, std::int64_t layer, GenTensor which,
                                std::span<const RowKey> keys, std::int64_t heads, std::int64_t dim,
                                std::optional<float> bias = std::nullopt);

/// The rope table the dense insert's cases and replays hand it: [positions, rotary_dim], row p =
/// cos(p * theta_i) for i < rotary_dim / 2, then the sines, theta_i = 10000^(-2i / rotary_dim),
/// computed in double and rounded once (rotary_dim even, >= 2).
std::vector<float> rope_cos_sin(std::int64_t rotary_dim, std::int64_t positions);

}  // namespace kvo::reference
