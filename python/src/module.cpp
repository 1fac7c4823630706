// kvoracle._core: the compiled half of the Python package (nanobind). Thin by rule: every decision
// (cases, judging, shrinking, reports, the flag table, case files) is a library's that the C++
// tests use; this file converts between those libraries and Python objects.
//
// A Python subject's functions receive the call of kvo/gpu/device_calls.hpp as a dict: every tensor
// an array with its shape and strides (NumPy in host memory; a DLPack-capable array on the CUDA
// device, for torch.from_dlpack), raw integer views for bf16 and fp8 with their dtype in
// `dtypes`, the caches as the layout's views with their guard bands around them, the stream.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "../../cli/case_flags.hpp"
#include "kvo/gpu/device.hpp"
#include "kvo/gpu/device_calls.hpp"
#include "kvo/oracle/campaign.hpp"
#include "kvo/oracle/detect.hpp"
#include "kvo/oracle/device_subject.hpp"
#include "kvo/oracle/op_driver.hpp"
#include "kvo/oracle/subject.hpp"
#include "kvo/oracle/test_campaign.hpp"
#include "kvo/oracle/write_dimensions.hpp"
#include "kvo/spec/metadata.hpp"
#include "kvo/spec/outcome.hpp"
#include "kvo/traces/case_file.hpp"
#include "kvo/traces/safetensors.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvo::python {
namespace {

/// Where a Python subject's calls live.
enum class Memory : std::uint8_t { kHost, kCuda };

/// The array dtype of an element type: bf16 as raw uint16 bits in NumPy (which has no bf16), as
/// DLPack's bfloat for torch on the device; fp8 as raw bytes everywhere (the package views them).
nb::dlpack::dtype array_dtype(gpu::ElementType t, Memory memory) {
  if (t == gpu::ElementType::kBF16 && memory == Memory::kCuda)
    return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  switch (t) {
    case gpu::ElementType::kF32:
      return nb::dtype<float>();
    case gpu::ElementType::kF16:
      return {static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
    case gpu::ElementType::kBF16:  // raw bits; `dtypes` names the type
      return nb::dtype<std::uint16_t>();
    case gpu::ElementType::kI32:
      return nb::dtype<std::int32_t>();
    case gpu::ElementType::kI64:
      return nb::dtype<std::int64_t>();
    case gpu::ElementType::kFp8E4M3:
    case gpu::ElementType::kFp8E5M2:
    case gpu::ElementType::kU8:
      return nb::dtype<std::uint8_t>();
  }
  return nb::dtype<std::uint8_t>();
}

/// A view of `t` (no copy; valid during the call only), or None for an absent tensor.
nb::object array_of(const gpu::DeviceTensor& t, Memory memory) {
  if (!t.present()) return nb::none();
  std::vector<std::size_t> shape(t.shape.begin(), t.shape.end());
  if (memory == Memory::kHost) {
    nb::ndarray<nb::numpy> a(t.data, shape.size(), shape.data(), nb::handle(), t.strides.data(),
                             array_dtype(t.type, memory), nb::device::cpu::value, 0);
    return a.cast(nb::rv_policy::reference);
  }
  nb::ndarray<> a(t.data, shape.size(), shape.data(), nb::handle(), t.strides.data(),
                  array_dtype(t.type, memory), nb::device::cuda::value, 0);
  return a.cast(nb::rv_policy::reference);
}

/// The call's tensors and their dtype names into `call`.
class CallDict {
 public:
  CallDict(const char* op, Memory memory, void* stream) : memory_(memory) {
    call_["op"] = op;
    call_["device"] = memory == Memory::kHost ? "cpu" : "cuda";
    call_["stream"] = reinterpret_cast<std::uintptr_t>(stream);
  }
  void put(const char* name, const gpu::DeviceTensor& t) {
    call_[name] = array_of(t, memory_);
    if (t.present()) dtypes_[name] = std::string(gpu::name_of(t.type));
  }
  void put_caches(const gpu::DeviceKvCaches& c) {
    put("k_cache", c.k_cache);
    put("v_cache", c.v_cache);
    put("k_view", c.k);
    put("v_view", c.v);
    put("index_cache", c.index_cache);
  }
  void put_batch(const gpu::DeviceBatch& b) {
    put("block_table", b.block_table);
    put("seq_lens", b.seq_lens);
    put("query_start_loc", b.query_start_loc);
    put("row_request", b.row_request);
    put("row_position", b.row_position);
  }
  void put_config(const spec::ModelConfig& c) {
    spec::Metadata m;
    spec::write_config(c, m);
    nb::dict config;
    for (const auto& [k, v] : m) config[k.c_str()] = v;
    call_["config"] = config;
  }
  nb::dict& dict() { return call_; }
  nb::dict done() {
    call_["dtypes"] = dtypes_;
    return call_;
  }

 private:
  Memory memory_;
  nb::dict call_;
  nb::dict dtypes_;
};

/// Calls a Python function; what it raises becomes the subject's outcome: `unsupported` (the
/// package's kvoracle.Unsupported) spec::Unsupported, anything else spec::FailedToRun with the
/// Python error and its traceback.
void call_python(const nb::object& fn, const nb::object& unsupported, nb::dict call) {
  try {
    fn(call);
  } catch (nb::python_error& e) {
    // The exception's own text (the package puts the function's traceback in it), not nanobind's
    // rendering of the whole interpreter stack.
    const std::string what = nb::str(e.value()).c_str();
    if (!unsupported.is_none() && e.matches(unsupported)) throw spec::Unsupported(what);
    throw spec::FailedToRun("the Python function raised:\n" + what);
  }
}

struct PyFunctions {
  nb::object write, dense, indexer, attention, unsupported;
};

// What each op's call puts in its dict besides the config (kvo/gpu/device_calls.hpp's fields).

void fill(CallDict& d, const gpu::DeviceWriteCall& c) {
  d.dict()["layer_kind"] = std::string(spec::name_of(c.kind));
  for (const auto& [name, t] : {std::pair{"k", &c.k},
                                {"v", &c.v},
                                {"index_k", &c.index_k},
                                {"slot_mapping", &c.slot_mapping},
                                {"index_slot_mapping", &c.index_slot_mapping},
                                {"k_scale", &c.k_scale},
                                {"v_scale", &c.v_scale}})
    d.put(name, *t);
  d.put_caches(c.caches);
}

void fill(CallDict& d, const gpu::DeviceDenseCall& c) {
  for (const auto& [name, t] : {std::pair{"q", &c.q},
                                {"k", &c.k},
                                {"v", &c.v},
                                {"slot_mapping", &c.slot_mapping},
                                {"k_scale", &c.k_scale},
                                {"v_scale", &c.v_scale},
                                {"q_norm_weight", &c.q_norm_weight},
                                {"k_norm_weight", &c.k_norm_weight},
                                {"cos_sin", &c.cos_sin},
                                {"positions", &c.positions},
                                {"q_out", &c.q_out}})
    d.put(name, *t);
  d.dict()["eps"] = c.eps;
  d.dict()["rotary_dim"] = c.rotary_dim;
  d.dict()["fp8_store"] = std::string(spec::name_of(c.fp8_store));
  d.put_caches(c.caches);
}

void fill(CallDict& d, const gpu::DeviceIndexerCall& c) {
  nb::dict p;
  p["num_index_heads"] = c.params.num_index_heads;
  p["sparse_block"] = c.params.sparse_block;
  p["topk"] = c.params.topk;
  p["init_blocks"] = c.params.init_blocks;
  p["local_blocks"] = c.params.local_blocks;
  p["index_nan"] = std::string(spec::name_of(c.params.index_nan));
  p["index_score_scale"] = std::string(spec::name_of(c.params.score_scale));
  p["index_group"] = std::string(spec::name_of(c.params.index_group));
  p["index_neg_inf"] = std::string(spec::name_of(c.params.neg_inf));
  p["index_q"] = std::string(spec::name_of(c.params.index_q_type));
  d.dict()["params"] = p;
  d.put("index_q", c.index_q);
  d.put_batch(c.batch);
  d.put_caches(c.caches);
  d.put("ids", c.ids);
}

void fill(CallDict& d, const gpu::DeviceAttentionCall& c) {
  nb::dict p;
  p["num_q_heads"] = c.params.num_q_heads;
  p["sparse_block"] = c.params.sparse_block;
  p["sm_scale"] = c.params.sm_scale;
  p["out_dtype"] = std::string(spec::name_of(c.params.out_dtype));
  d.dict()["params"] = p;
  d.put("q", c.q);
  d.put_batch(c.batch);
  d.put_caches(c.caches);
  d.put("k_scale", c.k_scale);
  d.put("v_scale", c.v_scale);
  d.put("selection", c.selection);
  d.put("out", c.out);
}

/// The call function of one op: the call as a dict, handed to the Python function `fn` (none: the
/// subject does not implement the op).
template <class Call>
std::function<void(const Call&)> python_call(const char* op, Memory memory, const nb::object& fn,
                                             const nb::object& unsupported) {
  if (fn.is_none()) return {};
  return [op, memory, fn, unsupported](const Call& c) {
    CallDict d(op, memory, c.stream);
    d.put_config(*c.config);
    fill(d, c);
    call_python(fn, unsupported, d.done());
  };
}

std::unique_ptr<oracle::Subject> make_python_subject(const std::string& name, const PyFunctions& py,
                                                     Memory memory,
                                                     const oracle::SubjectFunctions& declared) {
  oracle::DeviceSubjectFunctions f;
  f.write = python_call<gpu::DeviceWriteCall>("write", memory, py.write, py.unsupported);
  f.dense = python_call<gpu::DeviceDenseCall>("dense", memory, py.dense, py.unsupported);
  f.indexer = python_call<gpu::DeviceIndexerCall>("indexer", memory, py.indexer, py.unsupported);
  f.attention =
      python_call<gpu::DeviceAttentionCall>("attention", memory, py.attention, py.unsupported);
  f.ordering = declared.ordering;
  f.topk_form = declared.topk_form;
  f.attention_profile = declared.attention_profile;
  return memory == Memory::kHost ? oracle::make_host_call_subject(name, std::move(f))
                                 : oracle::make_device_subject(name, std::move(f));
}

/// E's value named `text`; InvalidInput naming `field` and E's names otherwise.
template <class E>
E parse_name(const std::string& text, const std::string& field) {
  const std::optional<E> v = spec::parse_enum<E>(text);
  if (!v) throw spec::InvalidInput(field, -1, text, "expected one of " + spec::enum_choices<E>());
  return *v;
}

/// The declaration of a subject from its names ("canonical", "ascending_ids" or another top-k form
/// such as "descending_score,head_major", "fp32").
oracle::SubjectFunctions declared_from(const std::string& ordering, const std::string& topk_order,
                                       const std::string& profile) {
  oracle::SubjectFunctions d;
  d.ordering = parse_name<spec::Ordering>(ordering, "ordering");
  d.topk_form = spec::parse_topk_form(topk_order, "topk_order");
  d.attention_profile = parse_name<spec::AttentionProfile>(profile, "profile");
  return d;
}

Memory memory_from(const std::string& device) {
  if (device == "cpu") return Memory::kHost;
  if (device == "cuda") return Memory::kCuda;
  throw spec::InvalidInput("device", -1, device, "expected cpu or cuda");
}

oracle::CheckOptions options_from(const std::vector<std::string>& ops, std::int64_t cases,
                                  std::uint64_t seed, std::optional<std::uint64_t> case_seed,
                                  const std::vector<std::string>& flags) {
  oracle::CheckOptions o;
  o.ops = oracle::parse_ops(ops);
  o.cases = cases;
  o.seed = seed;
  o.case_seed = case_seed;
  o.overrides = cli::parse_case_flags(flags);
  return o;
}

/// The subject of a check or a detection.
struct SubjectArgs {
  std::string name;
  PyFunctions functions;
  std::string device, ordering, topk_order, profile;
};

std::unique_ptr<oracle::Subject> subject_from(const SubjectArgs& a) {
  return make_python_subject(a.name, a.functions, memory_from(a.device),
                             declared_from(a.ordering, a.topk_order, a.profile));
}

/// A case file's tensors as (name, dtype, shape, bytes) and its metadata.
using TensorTuple = std::tuple<std::string, std::string, std::vector<std::int64_t>, nb::bytes>;

std::pair<std::map<std::string, std::string>, std::vector<TensorTuple>> read_tensors(
    const nb::bytes& file) {
  const auto* p = static_cast<const std::uint8_t*>(file.data());
  const traces::StFile f = traces::parse_safetensors({p, file.size()});
  std::vector<TensorTuple> out;
  for (const traces::StTensor& t : f.tensors) {
    out.emplace_back(t.name, std::string(traces::st_dtype_name(t.dtype)), t.shape,
                     nb::bytes(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size()));
  }
  return {f.metadata, std::move(out)};
}

oracle::NamedTensor named_tensor(const TensorTuple& t) {
  oracle::NamedTensor n;
  n.name = std::get<0>(t);
  n.dtype = parse_name<oracle::TensorDType>(std::get<1>(t), "dtype of " + n.name);
  n.shape = std::get<2>(t);
  const nb::bytes& b = std::get<3>(t);
  const auto* p = static_cast<const std::uint8_t*>(b.data());
  n.bytes.assign(p, p + b.size());
  return n;
}

std::vector<std::uint8_t> bytes_of(const nb::bytes& b) {
  const auto* p = static_cast<const std::uint8_t*>(b.data());
  return {p, p + b.size()};
}

nb::bytes to_bytes(const std::vector<std::uint8_t>& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size());
}

}  // namespace
}  // namespace kvo::python

NB_MODULE(_core, m) {
  m.attr("__version__") = KVO_VERSION;  // the project's version (CMakeLists.txt's project())
  using namespace kvo;
  using namespace kvo::python;
  m.doc() =
      "kvoracle's compiled core: campaigns, mode detection and case files over Python kernels";

  // spec::InvalidInput is the user's error (a ValueError naming what and where); spec::Unsupported
  // a NotImplementedError (the package raises its Unsupported from it); the rest of kvoracle's
  // exceptions are RuntimeErrors with their message.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const spec::InvalidInput& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const spec::Unsupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    }
  });

  nb::class_<PyFunctions>(m, "_Functions")
      .def(nb::init<>())
      .def_rw("write", &PyFunctions::write, nb::arg().none())
      .def_rw("dense", &PyFunctions::dense, nb::arg().none())
      .def_rw("indexer", &PyFunctions::indexer, nb::arg().none())
      .def_rw("attention", &PyFunctions::attention, nb::arg().none())
      .def_rw("unsupported", &PyFunctions::unsupported, nb::arg().none());

  m.def("built_with_cuda", &gpu::built_with_cuda);
  m.def("cuda_unavailable_reason", &oracle::device_unavailable_reason);
  m.def("ops", [] {
    std::vector<std::string> names;
    for (spec::Op op : oracle::all_ops()) names.emplace_back(spec::name_of(op));
    return names;
  });
  m.def("case_flag_names", &cli::case_flag_names);
  // The write modes' rows (kvo/oracle/write_dimensions.hpp): each flag and the name mode detection
  // prints it under, so that the Python side keeps no copy of the table.
  m.def("mode_axes", [] {
    std::vector<std::pair<std::string, std::string>> axes;
    oracle::visit_write_dimensions([&](const oracle::DimensionInfo& d, auto, auto) {
      if (d.mode != oracle::ModeScope::kNotAMode) axes.emplace_back(d.flag, d.name);
    });
    return axes;
  });
  m.def("parse_flags", [](const std::vector<std::string>& flags) {
    const oracle::Overrides o = cli::parse_case_flags(flags);
    std::string out;
    for (const oracle::OpDriver* d : oracle::op_registry()) {
      const std::string f = d->flags(o);
      if (!f.empty() && out.find(f) == std::string::npos) out += (out.empty() ? "" : " ") + f;
    }
    return out;
  });

  m.def(
      "check",
      [](const std::string& name, const PyFunctions& functions, const std::string& device,
         const std::string& ordering, const std::string& topk_order, const std::string& profile,
         const std::vector<std::string>& ops, std::int64_t cases, std::uint64_t seed,
         std::optional<std::uint64_t> case_seed, const std::vector<std::string>& flags,
         const std::string& rerun, std::int64_t jobs, bool shrink, bool fail_fast,
         double time_budget_s) {
        oracle::SubjectList subjects;
        subjects.push_back(subject_from({name, functions, device, ordering, topk_order, profile}));
        oracle::CheckOptions o = options_from(ops, cases, seed, case_seed, flags);
        o.subjects = {name};
        o.jobs = oracle::campaign_jobs(jobs);
        o.fail_fast = fail_fast;
        o.time_budget_s = time_budget_s;
        const oracle::testing::TestVerdict v =
            oracle::testing::run_test_campaign(subjects, o, rerun, shrink);
        // Options the campaign rejects are the caller's error, raised as Python raises one.
        if (!v.ran && v.outcome == spec::name_of(spec::Outcome::kInvalidInput))
          throw nb::value_error(v.message.c_str());
        return std::make_tuple(v.passed, v.seed, v.message, v.outcome);
      },
      "name"_a, "functions"_a, "device"_a, "ordering"_a, "topk_order"_a, "profile"_a, "ops"_a,
      "cases"_a, "seed"_a, "case_seed"_a.none(), "flags"_a, "rerun"_a, "jobs"_a, "shrink"_a,
      "fail_fast"_a, "time_budget_s"_a);

  // A built-in subject (cpu-fused, cuda-fused, ...) over the same campaign: the baseline the
  // Python path's cost is measured against (python/bench).
  m.def(
      "check_builtin",
      [](const std::string& name, const std::vector<std::string>& ops, std::int64_t cases,
         std::uint64_t seed, const std::vector<std::string>& flags) {
        oracle::SubjectList subjects = oracle::make_subjects();
        oracle::CheckOptions o = options_from(ops, cases, seed, std::nullopt, flags);
        o.subjects = {name};
        const oracle::CheckReport r = oracle::run_check(o, subjects);
        return std::make_tuple(r.worst == spec::Outcome::kPass, r.seconds, r.summary());
      },
      "name"_a, "ops"_a, "cases"_a, "seed"_a, "flags"_a);

  m.def(
      "detect",
      [](const std::string& name, const PyFunctions& functions, const std::string& device,
         const std::string& ordering, const std::string& topk_order, const std::string& profile,
         const std::vector<std::string>& ops, std::int64_t cases, std::uint64_t seed,
         const std::vector<std::string>& flags) {
        oracle::SubjectList subjects;
        subjects.push_back(subject_from({name, functions, device, ordering, topk_order, profile}));
        const oracle::CheckOptions o = options_from(ops, cases, seed, std::nullopt, flags);
        std::vector<std::tuple<std::string, std::string, std::vector<std::string>, std::string>>
            out;
        for (const oracle::DetectResult& r : oracle::detect_modes(o, subjects, name)) {
          std::vector<std::string> matched;
          for (const oracle::ModeCombination& c : r.matched)
            matched.push_back(r.describe(c.choice));
          out.emplace_back(std::string(spec::name_of(r.op)),
                           std::string(spec::name_of(r.outcome())), matched, r.report());
        }
        return out;
      },
      "name"_a, "functions"_a, "device"_a, "ordering"_a, "topk_order"_a, "profile"_a, "ops"_a,
      "cases"_a, "seed"_a, "flags"_a);

  m.def(
      "emit_case",
      [](const std::string& op_name, std::uint64_t seed, const std::vector<std::string>& flags) {
        const spec::Op op = oracle::parse_ops({op_name}, "op").front();
        const oracle::Overrides o = cli::parse_case_flags(flags);
        const oracle::OpDriver& driver = oracle::driver_of(op);
        const std::unique_ptr<oracle::PreparedCase> c = driver.prepare(seed, o);
        return to_bytes(traces::serialize_case(op, *c, driver.flags(o)));
      },
      "op"_a, "seed"_a, "flags"_a);

  m.def("read_tensors", &read_tensors, "file"_a);

  m.def(
      "judge",
      [](const nb::bytes& case_file, const std::vector<TensorTuple>& result,
         const std::string& subject, const std::string& ordering, const std::string& topk_order,
         const std::string& profile) {
        traces::CaseFile c = traces::parse_case(bytes_of(case_file));
        std::vector<oracle::NamedTensor> tensors;
        for (const TensorTuple& t : result) tensors.push_back(named_tensor(t));
        const oracle::SubjectFunctions d = declared_from(ordering, topk_order, profile);
        const std::vector<std::uint8_t> file = traces::serialize_result(
            c, std::move(tensors), subject, {d.ordering, d.attention_profile, d.topk_form});
        const traces::Judgement j = traces::judge_result(c, file, {});
        return std::make_tuple(std::string(spec::name_of(j.outcome)), spec::exit_status(j.outcome),
                               j.report, to_bytes(file));
      },
      "case_file"_a, "result"_a, "subject"_a, "ordering"_a, "topk_order"_a, "profile"_a);
}
