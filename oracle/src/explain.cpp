#include "kvo/oracle/explain.hpp"

namespace kvo::oracle {

Explanation explain_case(const CheckOptions& o, std::uint64_t seed, const std::string& name,
                         spec::Op op, SubjectList& subjects) {
  Subject& subject = find_subject(subjects, name);
  if (!subject.implements(op)) {
    throw spec::InvalidInput(
        "subject", -1, name,
        "implements " + implemented_ops(subject) + ", not " + std::string(spec::name_of(op)));
  }
  const OpDriver& driver = driver_of(op);
  const std::unique_ptr<PreparedCase> c = driver.prepare(seed, o.overrides);
  const Verdict v = driver.explain(subject, *c);
  return {v.outcome, v.report};
}

}  // namespace kvo::oracle
