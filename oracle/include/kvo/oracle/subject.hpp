#pragma once
/// \file subject.hpp
/// A subject is a named implementation of one layer's cache write that the oracle diffs against the
/// reference: the CPU emulations always, CUDA kernels when a GPU answers, a user's own kernel
/// through make_function_subject. Adding one touches neither the diff nor the campaign.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvo/spec/config.hpp"
#include "kvo/spec/write.hpp"

namespace kvo::oracle {

class WriteSubject {
 public:
  virtual ~WriteSubject() = default;
  virtual std::string name() const = 0;
  /// Empty when the subject can run here; otherwise why not ("no CUDA device").
  virtual std::string unavailable_reason() const { return {}; }
  /// Writes one layer into `caches` (host buffers, guards included; the subject moves them to its
  /// device and back as it needs). Throws spec::InvalidInput on rejected input, spec::FailedToRun
  /// on a runtime error, spec::Unsupported for a configuration it does not implement.
  virtual void write_layer(const spec::ModelConfig& config, const spec::LayerWrite& write,
                           spec::LayerCaches& caches) = 0;
};

using WriteFunction =
    std::function<void(const spec::ModelConfig&, const spec::LayerWrite&, spec::LayerCaches&)>;

/// A subject from a plain function (a user's kernel wrapper, or a test's planted bug).
std::unique_ptr<WriteSubject> make_function_subject(std::string name, WriteFunction fn);

/// Every write subject this build knows, available here or not, in a fixed order.
std::vector<std::unique_ptr<WriteSubject>> make_write_subjects();

/// Names of make_write_subjects(), for usage messages.
std::vector<std::string> write_subject_names();

}  // namespace kvo::oracle
