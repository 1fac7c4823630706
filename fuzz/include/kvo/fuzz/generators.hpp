#pragma once
/// \file generators.hpp
/// rapidcheck generators for the whole domain of kvoracle cases. Every dimension is drawn
/// explicitly (never "left to the seed"), from generators that shrink toward the simplest value:
/// one layer, one token, one KV head, head_dim 8, block size 1, the first layout, no edge values. A
/// failing property therefore shrinks to a small case, printed as the flags that replay it.

#include <rapidcheck.h>

#include <ostream>
#include <string>

#include "kvo/oracle/read_case.hpp"
#include "kvo/oracle/write_case.hpp"

namespace kvo::fuzz {

/// Page sizes 1..1024: mostly the engines' powers of two, often odd sizes that straddle nothing.
inline rc::Gen<std::int64_t> block_size() {
  return rc::gen::weightedOneOf<std::int64_t>(
      {{6, rc::gen::element<std::int64_t>(16, 32, 64, 128, 256)},
       {3, rc::gen::element<std::int64_t>(1, 3, 7, 17, 31, 127, 255, 1023)},
       {1, rc::gen::inRange<std::int64_t>(1, 1025)}});
}

/// Layer mixes: all dense, all sparse, MiniMax-M3-like, or random.
inline rc::Gen<std::string> layer_mix() {
  return rc::gen::weightedOneOf<std::string>(
      {{3, rc::gen::element<std::string>("S", "D", "DS")},
       {2, rc::gen::map(rc::gen::inRange(1, 7), [](int n) { return std::to_string(n) + "D"; })},
       {2, rc::gen::map(rc::gen::inRange(1, 7), [](int n) { return std::to_string(n) + "S"; })},
       {1, rc::gen::just(std::string("3D57S"))},
       {2, rc::gen::mapcat(rc::gen::inRange<std::size_t>(1, 7), [](std::size_t n) {
          return rc::gen::container<std::string>(n, rc::gen::element('D', 'S'));
        })}});
}

template <class E>
rc::Gen<E> any_of() {
  std::vector<E> values;
  for (const auto& e : spec::EnumInfo<E>::kNames) values.push_back(e.value);
  return rc::gen::elementOf(values);
}

/// A write case's dimensions, every one fixed (tokens and requests kept consistent).
inline rc::Gen<oracle::CaseOverrides> write_overrides() {
  return rc::gen::exec([] {
    oracle::CaseOverrides o;
    o.layers = *layer_mix();
    const bool long_mix = spec::parse_layer_mix(*o.layers).size() > 8;
    o.block_size = long_mix ? *rc::gen::element<std::int64_t>(1, 16, 32) : *block_size();
    o.num_kv_heads = *rc::gen::inRange<std::int64_t>(1, long_mix ? 3 : 9);
    o.head_dim = *rc::gen::element<std::int64_t>(8, 16, 32, 64, 128, 256);
    if (long_mix || *o.block_size * *o.num_kv_heads * *o.head_dim > (1 << 17)) o.head_dim = 8;
    o.index_layout = *any_of<spec::IndexLayout>();
    o.index_dim = *o.index_layout == spec::IndexLayout::kBlockScale
                      ? 128 * *rc::gen::inRange<std::int64_t>(1, 3)
                      : 8 * *rc::gen::inRange<std::int64_t>(1, 33);
    o.tokens = *rc::gen::weightedOneOf<std::int64_t>(
        {{8, rc::gen::inRange<std::int64_t>(1, 40)}, {1, rc::gen::inRange<std::int64_t>(40, 300)}});
    o.requests = *rc::gen::inRange<std::int64_t>(1, std::min<std::int64_t>(*o.tokens, 8) + 1);
    o.act_dtype = *rc::gen::element(spec::DType::kBF16, spec::DType::kF16, spec::DType::kF32);
    o.kv_dtype = *any_of<spec::DType>();
    o.index_dtype = *rc::gen::element(spec::DType::kBF16, spec::DType::kFp8E4M3);
    o.layout = *any_of<spec::KvLayout>();
    o.saturation = *any_of<spec::Saturation>();
    o.scale_mode = *any_of<spec::ScaleMode>();
    o.slot_mode =
        *rc::gen::weightedOneOf<spec::SlotMode>({{7, rc::gen::just(spec::SlotMode::kStrict)},
                                                 {1, rc::gen::just(spec::SlotMode::kLegacyWrap)}});
    o.slot_type = *any_of<spec::SlotType>();
    o.allocator = *any_of<oracle::AllocatorShape>();
    o.per_head_scale = *rc::gen::arbitrary<bool>();
    o.via_model_dtype = *rc::gen::arbitrary<bool>();
    o.ue8m0 = *rc::gen::arbitrary<bool>();
    o.separate_index_slots = *rc::gen::arbitrary<bool>();
    o.edge_values = *rc::gen::arbitrary<bool>();
    return o;
  });
}

/// A read case's dimensions: page and selection block sizes, GQA ratios 1 to 16, index heads,
/// sequence lengths around block edges.
inline rc::Gen<oracle::ReadOverrides> read_overrides() {
  return rc::gen::exec([] {
    oracle::ReadOverrides r;
    r.block_size = *rc::gen::element<std::int64_t>(1, 2, 3, 16, 17, 64, 128);
    r.sparse_block = *rc::gen::element<std::int64_t>(1, 4, 16, 32, 128);
    r.num_kv_heads = *rc::gen::inRange<std::int64_t>(1, 4);
    r.group_size = *rc::gen::element<std::int64_t>(1, 2, 4, 8, 16);
    r.index_heads_per_kv = *rc::gen::inRange<std::int64_t>(1, 3);
    r.head_dim = *rc::gen::element<std::int64_t>(8, 16, 32, 64);
    r.topk = *rc::gen::inRange<std::int64_t>(1, 17);
    r.requests = *rc::gen::inRange<std::int64_t>(1, 4);
    // Lengths at, just under and just over a block edge, or anywhere.
    r.max_seq_len = *rc::gen::oneOf(
        rc::gen::map(rc::gen::pair(rc::gen::inRange<std::int64_t>(1, 4),
                                   rc::gen::inRange<std::int64_t>(-1, 2)),
                     [sb = *r.sparse_block](std::pair<std::int64_t, std::int64_t> p) {
                       return std::max<std::int64_t>(1, p.first * sb + p.second);
                     }),
        rc::gen::inRange<std::int64_t>(1, 300));
    r.kv_dtype = *rc::gen::element(spec::DType::kBF16, spec::DType::kF16, spec::DType::kFp8E4M3,
                                   spec::DType::kFp8E5M2);
    r.layout = *any_of<spec::KvLayout>();
    r.index_layout = *any_of<spec::IndexLayout>();
    r.adversarial = *rc::gen::arbitrary<bool>();
    r.tied_scores =
        *rc::gen::weightedOneOf<bool>({{6, rc::gen::just(false)}, {1, rc::gen::just(true)}});
    return r;
  });
}

}  // namespace kvo::fuzz

namespace kvo::oracle {
/// rapidcheck prints a counterexample with these: the flags that replay it.
inline void showValue(const CaseOverrides& o, std::ostream& os) { os << "flags:" << o.to_flags(); }
inline void showValue(const ReadOverrides& o, std::ostream& os) {
  os << "read flags:" << o.to_flags();
}
}  // namespace kvo::oracle
