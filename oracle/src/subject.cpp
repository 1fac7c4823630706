#include "kvo/oracle/subject.hpp"

#include "kvo/oracle/cpu_subjects.hpp"
#ifdef KVO_HAVE_CUDA
#include "kvo/oracle/cuda_subjects.hpp"
#endif

namespace kvo::oracle {
namespace {

[[noreturn]] void not_implemented(const Subject& s, spec::Op op) {
  throw spec::Unsupported("subject " + s.name() + " does not implement op " +
                          std::string(spec::name_of(op)));
}

class FunctionSubject final : public Subject {
 public:
  FunctionSubject(std::string name, SubjectFunctions fns)
      : name_(std::move(name)), fns_(std::move(fns)) {}
  std::string name() const override { return name_; }
  std::string unavailable_reason() const override {
    return fns_.unavailable_reason ? fns_.unavailable_reason() : std::string();
  }
  bool implements(spec::Op op) const override {
    switch (op) {
      case spec::Op::kWrite:
        return static_cast<bool>(fns_.write);
      case spec::Op::kDense:
        return static_cast<bool>(fns_.dense);
      case spec::Op::kIndexer:
        return static_cast<bool>(fns_.indexer);
      case spec::Op::kAttention:
        return static_cast<bool>(fns_.attention);
    }
    return false;
  }
  spec::Ordering ordering() const override { return fns_.ordering; }
  TopkForm topk_form() const override { return fns_.topk_form; }
  spec::AttentionProfile attention_profile() const override { return fns_.attention_profile; }
  bool concurrent() const override { return fns_.concurrent; }
  bool device_concurrent() const override { return fns_.device_concurrent; }
  DeviceWriteFn device_write() const override { return fns_.device_write; }
  DeviceIndexerFn device_indexer() const override { return fns_.device_indexer; }
  DeviceAttentionFn device_attention() const override { return fns_.device_attention; }
  void write_layer(const spec::ModelConfig& c, const spec::LayerWrite& w,
                   spec::LayerCaches& caches) override {
    if (!fns_.write) not_implemented(*this, spec::Op::kWrite);
    fns_.write(c, w, caches);
  }
  spec::HostTensor dense_insert(const spec::ModelConfig& c, const spec::DenseInsert& in,
                                spec::LayerCaches& caches) override {
    if (!fns_.dense) not_implemented(*this, spec::Op::kDense);
    return fns_.dense(c, in, caches);
  }
  std::vector<std::int32_t> indexer(const ReadCase& c) override {
    if (!fns_.indexer) not_implemented(*this, spec::Op::kIndexer);
    return fns_.indexer(c);
  }
  spec::HostTensor attention(const ReadCase& c, const reference::TopkSelection* sel) override {
    if (!fns_.attention) not_implemented(*this, spec::Op::kAttention);
    return fns_.attention(c, sel);
  }
  reference::TopkSelection indexer_selection(const ReadCase& c) override {
    if (!fns_.indexer_selection) return Subject::indexer_selection(c);
    return fns_.indexer_selection(c);
  }

 private:
  std::string name_;
  SubjectFunctions fns_;
};

}  // namespace

void Subject::write_layer(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&) {
  not_implemented(*this, spec::Op::kWrite);
}
spec::HostTensor Subject::dense_insert(const spec::ModelConfig&, const spec::DenseInsert&,
                                       spec::LayerCaches&) {
  not_implemented(*this, spec::Op::kDense);
}
std::vector<std::int32_t> Subject::indexer(const ReadCase&) {
  not_implemented(*this, spec::Op::kIndexer);
}
spec::HostTensor Subject::attention(const ReadCase&, const reference::TopkSelection*) {
  not_implemented(*this, spec::Op::kAttention);
}
reference::TopkSelection Subject::indexer_selection(const ReadCase&) {
  throw spec::Unsupported("subject " + name() +
                          " gives no block scores with its selection (not a tier's answerer)");
}

std::unique_ptr<Subject> make_function_subject(std::string name, SubjectFunctions functions) {
  return std::make_unique<FunctionSubject>(std::move(name), std::move(functions));
}

std::unique_ptr<Subject> make_function_subject(std::string name, WriteFunction write,
                                               bool concurrent) {
  SubjectFunctions fns;
  fns.write = std::move(write);
  fns.concurrent = concurrent;
  return make_function_subject(std::move(name), std::move(fns));
}

SubjectList make_subjects() {
  SubjectList out = make_cpu_subjects();
#ifdef KVO_HAVE_CUDA
  for (auto& s : make_cuda_subjects()) out.push_back(std::move(s));
#endif
  return out;
}

std::vector<std::string> subject_names() {
  std::vector<std::string> names;
  for (const auto& s : make_subjects()) names.push_back(s->name());
  return names;
}

std::string implemented_ops(const Subject& s) {
  std::string out;
  for (const auto& entry : spec::EnumInfo<spec::Op>::kNames) {
    if (!s.implements(entry.value)) continue;
    if (!out.empty()) out += ',';
    out += entry.name;
  }
  return out;
}

}  // namespace kvo::oracle
