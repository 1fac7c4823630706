// The op registry: the one list of op drivers, in spec::Op order.
#include <algorithm>

#include "op_drivers.hpp"

namespace kvo::oracle {

const std::vector<const OpDriver*>& op_registry() {
  static const std::vector<const OpDriver*> registry = [] {
    std::vector<const OpDriver*> r{&write_driver(), &dense_driver(), &indexer_driver(),
                                   &attention_driver()};
    // One driver per op, in the enum's order: op_registry()[i]->op() == Op(i).
    for (std::size_t i = 0; i < r.size(); ++i) {
      if (static_cast<std::size_t>(r[i]->op()) != i ||
          r.size() != spec::EnumInfo<spec::Op>::kNames.size())
        throw std::logic_error("op registry out of order with spec::Op");
    }
    return r;
  }();
  return registry;
}

std::unique_ptr<CapturedAnswer> OpDriver::capture(Subject& /*subject*/, PreparedCase& /*c*/) const {
  throw std::logic_error("op " + std::string(spec::name_of(op())) + " has no modes to detect");
}

const OpDriver& driver_of(spec::Op op) { return *op_registry()[static_cast<std::size_t>(op)]; }

std::vector<spec::Op> all_ops() {
  std::vector<spec::Op> ops;
  for (const OpDriver* d : op_registry()) ops.push_back(d->op());
  return ops;
}

std::vector<spec::Op> parse_ops(const std::vector<std::string>& names, const char* field) {
  std::vector<spec::Op> ops;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto op = spec::parse_enum<spec::Op>(names[i]);
    if (!op) {
      throw spec::InvalidInput(field, static_cast<std::int64_t>(i), names[i],
                               "unknown op; known: " + spec::enum_choices<spec::Op>());
    }
    if (std::find(ops.begin(), ops.end(), *op) == ops.end()) ops.push_back(*op);
  }
  return ops;
}

}  // namespace kvo::oracle
