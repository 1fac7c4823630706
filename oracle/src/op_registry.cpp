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

std::string failure_class_of(const Verdict& v) {
  const std::string outcome(spec::name_of(v.outcome));
  if (!v.failure_class.empty()) return outcome + ": " + v.failure_class;
  // The error's first line says what went wrong; a mismatch's up to its first colon (its location
  // follows), the others' whole, numbers folded so that one cause is one class whatever the case.
  // A first line that ends in a colon heads a traceback: its last line names the error.
  std::string line = v.report.substr(0, v.report.find('\n'));
  if (v.outcome == spec::Outcome::kMismatch) {
    line = line.substr(0, line.find(':'));
  } else if (!line.empty() && line.back() == ':') {
    const std::size_t end = v.report.find_last_not_of("\n ");
    const std::size_t start = v.report.rfind('\n', end);
    if (end != std::string::npos && start != std::string::npos)
      line = v.report.substr(start + 1, end - start);
  }
  std::string folded;
  for (const char ch : line) {
    const bool digit = ch >= '0' && ch <= '9';
    if (!digit)
      folded += ch;
    else if (folded.empty() || folded.back() != 'N')
      folded += 'N';
  }
  constexpr std::size_t kMostChars = 80;  // a cause, not the case's description
  if (folded.size() > kMostChars) folded = folded.substr(0, kMostChars) + "...";
  // run_guarded's prefix ("failed to run: ") says the outcome again.
  std::string spoken = outcome;
  std::replace(spoken.begin(), spoken.end(), '-', ' ');
  if (folded.rfind(spoken + ": ", 0) == 0) folded.erase(0, spoken.size() + 2);
  return folded.empty() ? outcome : outcome + ": " + folded;
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
