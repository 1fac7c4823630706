#pragma once
// Hand-checkable fixtures shared by the test suites: the tiny configuration the layout tests
// work out by hand, and float32 tensors from literal values.

#include <cstdint>
#include <vector>

#include "kvo/reference/numbers.hpp"
#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::testing {

/// nb = 2 blocks, bs = 3, nkv = 2 heads, hd = 8, index_dim 256, one sparse layer.
inline spec::ModelConfig tiny(spec::KvLayout layout) {
  spec::ModelConfig c;
  c.layers = {spec::LayerKind::kSparse};
  c.geometry = {2, 3, 2, 8, 256};
  c.layout = layout;
  return c;
}

/// A float32 tensor of `shape` holding `v` (row-major).
inline spec::HostTensor f32_tensor(std::vector<std::int64_t> shape, const std::vector<float>& v) {
  spec::HostTensor t;
  t.dtype = spec::DType::kF32;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * 4);
  for (std::size_t i = 0; i < v.size(); ++i)
    reference::store_code(reference::bits_of(v[i]), spec::DType::kF32, &t.bytes[i * 4]);
  return t;
}

}  // namespace kvo::testing
