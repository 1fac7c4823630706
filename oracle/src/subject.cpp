#include "kvo/oracle/subject.hpp"

#include "kvo/reference/layer_write.hpp"

namespace kvo::oracle {

#ifdef KVO_HAVE_CUDA
/// cuda-fused and cuda-unfused (cuda_subjects.cpp, built only with CUDA).
std::vector<std::unique_ptr<WriteSubject>> make_cuda_write_subjects();
#endif

namespace {

class FunctionSubject final : public WriteSubject {
 public:
  FunctionSubject(std::string name, WriteFunction fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string name() const override { return name_; }
  void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                   spec::LayerCaches& caches) override {
    fn_(config, write, caches);
  }

 private:
  std::string name_;
  WriteFunction fn_;
};

}  // namespace

std::unique_ptr<WriteSubject> make_function_subject(std::string name, WriteFunction fn) {
  return std::make_unique<FunctionSubject>(std::move(name), std::move(fn));
}

std::vector<std::unique_ptr<WriteSubject>> make_write_subjects() {
  std::vector<std::unique_ptr<WriteSubject>> out;
  out.push_back(make_function_subject("cpu-fused", reference::write_layer_fused));
  out.push_back(make_function_subject(
      "cpu-unfused",
      [](const spec::ModelConfig& c, const spec::LayerWrite& w, spec::LayerCaches& caches) {
        reference::write_layer_unfused(c, w, caches);
      }));
#ifdef KVO_HAVE_CUDA
  for (auto& s : make_cuda_write_subjects()) out.push_back(std::move(s));
#endif
  return out;
}

std::vector<std::string> write_subject_names() {
  std::vector<std::string> names;
  for (const auto& s : make_write_subjects()) names.push_back(s->name());
  return names;
}

}  // namespace kvo::oracle
