// The table of write dimensions (kvo/oracle/write_dimensions.hpp) is the one definition of a
// write override: its flag text, what it does to the configuration, and, for a mode, mode
// detection's axis. These tests hold the consumers to the rows.

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/write_case.hpp"
#include "kvo/oracle/write_dimensions.hpp"
#include "kvo/spec/metadata.hpp"

namespace kvo::oracle {
namespace {

/// Values of T for a row's field: every enumerator, both booleans, two numbers, a strided view,
/// two layer mixes.
template <class T>
std::vector<T> sample_values() {
  if constexpr (std::is_same_v<T, bool>) {
    return {false, true};
  } else if constexpr (std::is_enum_v<T>) {
    std::vector<T> v;
    for (const auto& e : spec::EnumInfo<T>::kNames) v.push_back(e.value);
    return v;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    return {24, 40};
  } else if constexpr (std::is_same_v<T, spec::KvStrides>) {
    return {spec::parse_kv_strides("9000,300,70,0,16", "test")};
  } else if constexpr (std::is_same_v<T, spec::IndexStrides>) {
    return {spec::parse_index_strides("9000,300,16", "test")};
  } else {
    return {std::string("2D1S"), std::string("S")};
  }
}

TEST(WriteDimensions, NamesAndFlagsAreUniqueAndModesSayWhereTheyReach) {
  std::set<std::string_view> names, flags;
  visit_write_dimensions([&](const DimensionInfo& d, auto, auto set) {
    EXPECT_TRUE(names.insert(d.name).second) << d.name;
    EXPECT_TRUE(flags.insert(d.flag).second) << d.flag;
    EXPECT_EQ(d.flag.substr(0, 2), "--") << d.name;
    EXPECT_FALSE(d.help.empty()) << d.name;
    if (d.mode != ModeScope::kNotAMode) {
      EXPECT_NE(d.reaches, nullptr) << d.name;
      EXPECT_FALSE(std::is_null_pointer_v<decltype(set)>) << d.name << ": a mode sets the config";
    }
  });
}

// Each row alone: to_flags names its flag with the value's text, and apply_overrides changes the
// configuration in exactly the case-file metadata key that is the row's name (a row with no
// setter changes nothing).
TEST(WriteDimensions, EachRowsFlagSetterAndMetadataKeyFollowTheRow) {
  spec::Metadata defaults;
  spec::write_config(spec::ModelConfig{}, defaults);
  visit_write_dimensions([&](const DimensionInfo& d, auto member, auto set) {
    using T = typename std::remove_reference_t<decltype(CaseOverrides{}.*member)>::value_type;
    const bool sets = !std::is_null_pointer_v<decltype(set)>;
    bool some_value_changed_it = false;
    for (const T& value : sample_values<T>()) {
      CaseOverrides o;
      o.*member = value;
      EXPECT_EQ(o.to_flags(), " " + std::string(d.flag) + " " + dimension_text(value)) << d.name;
      spec::ModelConfig c;
      apply_overrides(o, c);
      spec::Metadata m;
      spec::write_config(c, m);
      std::set<std::string> changed;
      for (const auto& [key, text] : m) {
        const auto was = defaults.find(key);
        if (was == defaults.end() || was->second != text) changed.insert(key);
      }
      some_value_changed_it |= !changed.empty();
      EXPECT_TRUE(changed.empty() || changed == std::set<std::string>{std::string(d.name)})
          << d.name << " set to " << dimension_text(value) << " changed other keys";
    }
    EXPECT_EQ(some_value_changed_it, sets) << d.name;
  });
}

// Mode detection's axes are the mode rows, in table order, with the rows' names and value texts;
// the dense insert's leave out the write-only rows (the blockscale modes).
TEST(WriteDimensions, ModeAxesAreTheModeRows) {
  for (const spec::Op op : {spec::Op::kWrite, spec::Op::kDense}) {
    std::vector<std::string> rows;
    visit_write_dimensions([&](const DimensionInfo& d, auto, auto) {
      if (d.mode == ModeScope::kWriteAndDense ||
          (d.mode == ModeScope::kWriteOnly && op == spec::Op::kWrite))
        rows.emplace_back(d.name);
    });
    // The dense insert adds its own axis (dense_fp8_store) after the write modes.
    std::vector<std::string> axes;
    for (const ModeAxis& a : driver_of(op).mode_axes()) axes.push_back(a.name);
    axes.resize(std::min(axes.size(), rows.size()));
    EXPECT_EQ(axes, rows) << spec::name_of(op);
  }
  for (const ModeAxis& a : driver_of(spec::Op::kWrite).mode_axes()) {
    if (a.name == "saturation") {
      EXPECT_EQ(a.values, (std::vector<std::string>{"satfinite", "nosat", "torch"}));
    }
    if (a.name == "ue8m0") {
      EXPECT_EQ(a.values, (std::vector<std::string>{"false", "true"}));
    }
  }
}

}  // namespace
}  // namespace kvo::oracle
