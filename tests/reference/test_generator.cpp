// The value generator of SPEC 8: a pure function of its key, representable in the activation dtype.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <vector>

#include "kvo/reference/generator.hpp"
#include "kvo/reference/numbers.hpp"

namespace kvo::reference {
namespace {

TEST(SplitMix64, MatchesThePublishedSequence) {
  // SplitMix64 from seed 0 (Vigna's reference implementation): first outputs.
  SplitMix64 rng(0);
  EXPECT_EQ(rng.next(), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(rng.next(), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(rng.next(), 0x06C45D188009454Full);
}

TEST(ValueGenerator, KeyFieldsAllMatter) {
  const std::uint64_t base = value_key(7, 1, GenTensor::kK, 2, 3, 4, 5);
  EXPECT_EQ(base, value_key(7, 1, GenTensor::kK, 2, 3, 4, 5));
  EXPECT_NE(base, value_key(8, 1, GenTensor::kK, 2, 3, 4, 5));
  EXPECT_NE(base, value_key(7, 0, GenTensor::kK, 2, 3, 4, 5));
  EXPECT_NE(base, value_key(7, 1, GenTensor::kV, 2, 3, 4, 5));
  EXPECT_NE(base, value_key(7, 1, GenTensor::kK, 1, 3, 4, 5));
  EXPECT_NE(base, value_key(7, 1, GenTensor::kK, 2, 2, 4, 5));
  EXPECT_NE(base, value_key(7, 1, GenTensor::kK, 2, 3, 3, 5));
  EXPECT_NE(base, value_key(7, 1, GenTensor::kK, 2, 3, 4, 4));
}

/// A generator of any seed, activation dtype, range, with or without the edge table (inside a
/// rapidcheck property).
ValueGenerator arbitrary_generator() {
  ValueGenerator g;
  g.seed = *rc::gen::arbitrary<std::uint64_t>();
  g.act = *rc::gen::element(spec::DType::kF32, spec::DType::kBF16, spec::DType::kF16);
  g.range = std::ldexp(1.0f, *rc::gen::inRange(-4, 10));
  g.edge_values = *rc::gen::arbitrary<bool>();
  g.allow_nonfinite = g.edge_values && *rc::gen::arbitrary<bool>();
  return g;
}

RC_GTEST_PROP(ValueGenerator, ValuesAreRepresentableInRangeAndDeterministic, ()) {
  const ValueGenerator g = arbitrary_generator();
  int edges_outside_range = 0;
  for (int i = 0; i < 256; ++i) {
    const float x = g.value(1, GenTensor::kIndexK, 2, i, 0, i % 7);
    RC_ASSERT(bits_of(x) == bits_of(g.value(1, GenTensor::kIndexK, 2, i, 0, i % 7)));
    if (!g.allow_nonfinite) RC_ASSERT(std::isfinite(x));
    if (std::isnan(x)) continue;
    RC_ASSERT(bits_of(round_to(x, g.act)) == bits_of(x));  // already in the activation dtype
    // Ordinary values lie in [-r, r] (r itself only through rounding to the activation dtype).
    if (!g.edge_values) RC_ASSERT(std::fabs(x) <= g.range);
    edges_outside_range += std::fabs(x) > g.range;
  }
  if (g.edge_values && g.range <= 1.0f)
    RC_ASSERT(edges_outside_range > 0);  // the edge table shows up
}

// fill_row is value() a row at a time (its hashes from a table, its rounding one loop per dtype):
// the same bits for every element, every activation dtype, with and without the edge table.
RC_GTEST_PROP(ValueGenerator, FillRowIsValueElementByElement, ()) {
  const ValueGenerator g = arbitrary_generator();
  const auto tensor = *rc::gen::element(GenTensor::kK, GenTensor::kV, GenTensor::kIndexK,
                                        GenTensor::kQ, GenTensor::kIndexQ);
  const std::int64_t layer = *rc::gen::inRange(0, 60), request = *rc::gen::inRange(0, 64);
  const std::int64_t position = *rc::gen::inRange(0, 5000);
  const std::int64_t heads = *rc::gen::inRange(1, 5), dim = *rc::gen::inRange(1, 300);
  std::vector<float> row(static_cast<std::size_t>(heads * dim));
  g.fill_row(g.row_key(layer, tensor, request, position), heads, dim, row.data());
  for (std::int64_t h = 0; h < heads; ++h) {
    for (std::int64_t d = 0; d < dim; ++d) {
      const float want = g.value(layer, tensor, request, position, h, d);
      RC_ASSERT(bits_of(row[static_cast<std::size_t>(h * dim + d)]) == bits_of(want));
    }
  }
}

}  // namespace
}  // namespace kvo::reference
