// The trace format: writer/reader round trip (property), and one test per class of malformed file,
// each asserting that the message names the byte offset or the tensor and what was expected.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <filesystem>
#include <fstream>

#include "kvo/spec/outcome.hpp"
#include "kvo/traces/safetensors.hpp"
#include "kvo/traces/simulator.hpp"
#include "kvo/traces/trace.hpp"
#include "trace_fixture.hpp"

namespace kvo::traces {
namespace {

using testing::FileParts;
using testing::join;
using testing::small_trace;
using testing::split;

/// Parses `bytes`, expecting InvalidInput whose message contains every one of `parts`.
void expect_rejected(const std::vector<std::uint8_t>& bytes, std::vector<std::string> parts) {
  try {
    (void)parse_trace(bytes);
    ADD_FAILURE() << "accepted; expected a message with '" << parts.front() << "'";
  } catch (const spec::InvalidInput& e) {
    for (const std::string& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message: " << e.what() << "\nexpected to contain: " << p;
    }
  }
}

FileParts valid_parts() { return split(serialize_trace(small_trace())); }

TEST(TraceFormat, SimulatedTraceRoundTripsByteForByte) {
  const Trace t = small_trace();
  const auto bytes = serialize_trace(t);
  const Trace back = parse_trace(bytes);
  EXPECT_TRUE(back == t);
  EXPECT_EQ(serialize_trace(back), bytes);
  EXPECT_EQ((bytes.size() - 8 - split(bytes).data.size()) % 8, 0u) << "header padded to 8";
}

RC_GTEST_PROP(TraceFormat, WriterReaderRoundTrip, ()) {
  const auto seed = *rc::gen::arbitrary<std::uint64_t>();
  SimOptions o;
  o.seed = seed;
  o.steps = *rc::gen::inRange<std::int64_t>(1, 20);
  o.config.layers = spec::parse_layer_mix(*rc::gen::element<std::string>("D", "S", "2D3S"));
  o.config.geometry.block_size = *rc::gen::inRange<std::int64_t>(1, 20);
  o.config.geometry.num_blocks =
      (73 + o.config.geometry.block_size - 1) / o.config.geometry.block_size +
      *rc::gen::inRange<std::int64_t>(0, 30);
  o.config.slot_type = *rc::gen::element(spec::SlotType::kI32, spec::SlotType::kI64);
  o.config.separate_index_slots = *rc::gen::arbitrary<bool>();
  o.prompt_max = 40;
  o.output_max = 30;
  o.mtp = *rc::gen::inRange<std::int64_t>(0, 3);
  o.query_lens_form = *rc::gen::arbitrary<bool>();
  Trace t = simulate(o);
  // Vary what the simulator does not: storage types, optional tensors, metadata.
  for (TraceStep& st : t.steps) {
    if (*rc::gen::arbitrary<bool>()) st.block_table.type = spec::SlotType::kI64;
    if (*rc::gen::arbitrary<bool>()) st.seq_lens.type = spec::SlotType::kI64;
    if (*rc::gen::arbitrary<bool>()) st.request_ids.reset();
    if (*rc::gen::arbitrary<bool>()) {
      const std::int64_t k = *rc::gen::inRange<std::int64_t>(0, 4);
      IntTensor topk;
      topk.type = *rc::gen::element(spec::SlotType::kI32, spec::SlotType::kI64);
      topk.shape = {st.tokens(), k};
      topk.values = *rc::gen::container<std::vector<std::int64_t>>(
          static_cast<std::size_t>(st.tokens() * k), rc::gen::inRange<std::int64_t>(-1, 1000));
      st.topk_ids = topk;
    }
  }
  t.engine = *rc::gen::container<std::string>(rc::gen::inRange<char>(' ', '~'));
  t.extra["note"] = *rc::gen::container<std::string>(rc::gen::inRange<char>(' ', '~'));
  RC_TAG(seed);
  const auto bytes = serialize_trace(t);
  const Trace back = parse_trace(bytes);
  RC_ASSERT(back == t);
  RC_ASSERT(serialize_trace(back) == bytes);
}

RC_GTEST_PROP(TraceFormat, EveryTruncationIsRejected, ()) {
  const auto bytes = serialize_trace(small_trace(*rc::gen::inRange<std::uint64_t>(0, 50)));
  const auto cut = *rc::gen::inRange<std::size_t>(0, bytes.size());
  const std::vector<std::uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(cut));
  RC_ASSERT_THROWS_AS(parse_trace(prefix), spec::InvalidInput);
}

TEST(TraceMalformed, ShorterThanTheLengthField) {
  expect_rejected({1, 0, 0}, {"trace file size = 3", "byte offset 0", "8-byte"});
}

TEST(TraceMalformed, HeaderLengthZero) {
  expect_rejected(std::vector<std::uint8_t>(16, 0), {"trace header length = 0", "byte offset 0"});
}

TEST(TraceMalformed, HeaderLengthPastTheFile) {
  auto bytes = join("{}", {});
  bytes[0] = 200;
  expect_rejected(
      bytes, {"trace header length = 200", "byte offset 0", "past the end of the 10-byte file"});
}

TEST(TraceMalformed, HeaderLengthOverTheLimit) {
  std::vector<std::uint8_t> bytes(16, 0);
  bytes[4] = 1;  // 2^32
  expect_rejected(bytes, {"trace header length = 4294967296", "at most 104857600"});
}

TEST(TraceMalformed, InvalidJsonNamesTheByteOffset) {
  // {"a":} : the parser stops at the '}' at header byte 5, file byte 13.
  expect_rejected(join("{\"a\":}", {}), {"trace header", "at byte offset 13", "JSON"});
}

TEST(TraceMalformed, NumberTooLargeForJson) {
  // Found by fuzzing: nlohmann reports this as out_of_range, not as a parse error.
  expect_rejected(join(R"({"a":1E99999})", {}), {"trace header", "at byte offset 8", "overflow"});
}

TEST(TraceMalformed, HeaderNotAnObject) {
  expect_rejected(join("[1, 2]  ", {}), {"at byte offset 8", "expected '{'"});
}

TEST(TraceMalformed, InvalidUtf8InHeader) {
  expect_rejected(join("{\"\xff\": 1}", {}), {"at byte offset", "JSON"});
}

TEST(TraceMalformed, DuplicateKey) {
  const std::string h = R"({"t":{"dtype":"I32","shape":[0],"data_offsets":[0,0]},)"
                        R"("t":{"dtype":"I32","shape":[0],"data_offsets":[0,0]}})";
  expect_rejected(join(h, {}), {"duplicate key", "\"t\""});
}

TEST(TraceMalformed, UnknownDtypeNamesTheTensor) {
  FileParts p = valid_parts();
  p.header["step.0.seq_lens"]["dtype"] = "I33";
  expect_rejected(join(p), {"tensor 'step.0.seq_lens' dtype", "\"I33\"", "unknown dtype", "I32|"});
}

TEST(TraceMalformed, KnownDtypeWrongForATrace) {
  FileParts p = valid_parts();
  auto& e = p.header["step.0.seq_lens"];
  const auto begin = e["data_offsets"][0].get<std::uint64_t>();
  const auto end = e["data_offsets"][1].get<std::uint64_t>();
  e["dtype"] = "F32";  // same 4-byte size: the container accepts it, the trace does not
  (void)begin;
  (void)end;
  expect_rejected(join(p), {"tensor 'step.0.seq_lens' dtype", "F32", "expected I32 or I64"});
}

TEST(TraceMalformed, OffsetsPastTheDataSection) {
  FileParts p = valid_parts();
  const auto size = p.data.size();
  p.header["step.0.slot_mapping"]["data_offsets"][1] = size + 8;
  expect_rejected(join(p), {"tensor 'step.0.slot_mapping' data_offsets",
                            "past the end of the " + std::to_string(size) + "-byte data section"});
}

TEST(TraceMalformed, OffsetsReversed) {
  FileParts p = valid_parts();
  auto& off = p.header["step.1.block_table"]["data_offsets"];
  const auto a = off[0].get<std::uint64_t>(), b = off[1].get<std::uint64_t>();
  off = {b, a};
  expect_rejected(join(p), {"tensor 'step.1.block_table' data_offsets", "reversed"});
}

TEST(TraceMalformed, OverlappingTensorsNameBoth) {
  const std::string h = R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}})";
  expect_rejected(join(h, std::vector<std::uint8_t>(12)),
                  {"tensor 'b' data_offsets = [4, 12]", "overlaps tensor 'a'"});
}

TEST(TraceMalformed, GapBetweenTensors) {
  const std::string h = R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]},)"
                        R"("b":{"dtype":"I32","shape":[1],"data_offsets":[8,12]}})";
  const auto bytes = join(h, std::vector<std::uint8_t>(12));
  expect_rejected(
      bytes, {"tensor 'b'", "gap of 4 bytes", "file byte " + std::to_string(8 + h.size() + 4)});
}

TEST(TraceMalformed, TrailingBytes) {
  const std::string h = R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})";
  expect_rejected(join(h, std::vector<std::uint8_t>(11)),
                  {"trace data section", "at byte offset " + std::to_string(8 + h.size() + 8),
                   "3 trailing bytes"});
}

TEST(TraceMalformed, ShapeAndByteSizeDisagree) {
  FileParts p = valid_parts();
  p.header["step.0.slot_mapping"]["shape"][0] =
      p.header["step.0.slot_mapping"]["shape"][0].get<std::int64_t>() + 1;
  expect_rejected(join(p), {"tensor 'step.0.slot_mapping' shape", "shape and byte size disagree"});
}

TEST(TraceMalformed, ShapeOverflowIsNotWrapped) {
  const std::string h =
      R"({"a":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  expect_rejected(join(h, {}), {"tensor 'a' shape", "shape overflows"});
}

TEST(TraceMalformed, NegativeOrFractionalDimension) {
  expect_rejected(join(R"({"a":{"dtype":"I64","shape":[-1],"data_offsets":[0,0]}})", {}),
                  {"tensor 'a' shape = -1", "non-negative integer"});
  expect_rejected(join(R"({"a":{"dtype":"I64","shape":[1.5],"data_offsets":[0,8]}})",
                       std::vector<std::uint8_t>(8)),
                  {"tensor 'a' shape = 1.5", "non-negative integer"});
}

TEST(TraceMalformed, UnexpectedOrMissingEntryKey) {
  expect_rejected(join(R"({"a":{"dtype":"I64","shape":[0],"data_offsets":[0,0],"x":1}})", {}),
                  {"tensor 'a' key 'x'", "expected exactly dtype, shape and data_offsets"});
  expect_rejected(join(R"({"a":{"dtype":"I64","data_offsets":[0,0]}})", {}),
                  {"tensor 'a' shape = missing"});
}

TEST(TraceMalformed, MetadataValueNotAString) {
  expect_rejected(join(R"({"__metadata__":{"num_steps":3}})", {}),
                  {"__metadata__ 'num_steps' = 3", "expected a string value"});
}

TEST(TraceMalformed, EveryConfigurationKeyIsRequired) {
  const FileParts valid = valid_parts();
  for (const auto& [key, value] : valid.header["__metadata__"].items()) {
    if (key == "generator") continue;  // not a configuration key
    if (std::find(kReadParamKeys.begin(), kReadParamKeys.end(), key) != kReadParamKeys.end())
      continue;  // optional: TraceReadParamsAreOptional
    FileParts p = valid;
    p.header["__metadata__"].erase(key);
    SCOPED_TRACE(key);
    expect_rejected(join(p), {"__metadata__ '" + key + "' = missing"});
  }
}

/// Files written before read replay have no read-side keys: they parse, with the defaults (head
/// counts resolved against the geometry), and the keys written back are exactly what was read.
TEST(TraceFormat, TraceReadParamsAreOptional) {
  FileParts p = valid_parts();
  for (const std::string& key : kReadParamKeys) {
    // dense_rotary_dim and the indexer modes are written only when set, so old traces keep bytes.
    const bool when_set = key.rfind("dense_", 0) == 0 || key.rfind("index_", 0) == 0;
    if (!when_set) {
      ASSERT_TRUE(p.header["__metadata__"].contains(key)) << key << " is written";
    }
    p.header["__metadata__"].erase(key);
  }
  const Trace t = parse_trace(join(p));
  const std::int64_t nkv = t.config.geometry.num_kv_heads;
  const spec::IndexerParams ip = indexer_params(t);
  const spec::AttentionParams ap = attention_params(t);
  EXPECT_EQ(ip.num_index_heads, (4 + nkv - 1) / nkv * nkv);
  EXPECT_EQ(ap.num_q_heads, (16 + nkv - 1) / nkv * nkv);
  EXPECT_EQ(ip.sparse_block, 128);
  EXPECT_EQ(ip.topk, 16);
  EXPECT_EQ(ip.init_blocks, 0);
  EXPECT_EQ(ip.local_blocks, 1);
  EXPECT_EQ(ap.sm_scale, 0.0f);
  EXPECT_EQ(ap.out_dtype, spec::DType::kBF16);
  EXPECT_TRUE(t.extra.empty() || !t.extra.count("topk"));

  Trace custom = t;
  custom.read.num_index_heads = 2 * nkv;
  custom.read.num_q_heads = 3 * nkv;
  custom.read.sparse_block = 8;
  custom.read.topk = 3;
  custom.read.init_blocks = 1;
  custom.read.local_blocks = 2;
  custom.read.sm_scale = 0.125f;
  custom.read.out_dtype = spec::DType::kF32;
  custom.read.dense_rotary_dim = 4;
  custom.read.index_nan = spec::IndexNan::kLowest;
  custom.read.index_score_scale = spec::IndexScoreScale::kRsqrtDim;
  custom.read.index_group = spec::IndexGroup::kUnion;
  custom.read.index_neg_inf = spec::IndexNegInf::kDrop;
  custom.read.dense_fp8_store = spec::DenseFp8Store::kIdentity;
  const Trace back = parse_trace(serialize_trace(custom));
  EXPECT_EQ(back.read, custom.read);
  EXPECT_EQ(back, custom);
}

TEST(TraceFormat, LaterWriteModesAreOptionalAndRoundTrip) {
  // Absent keys are the defaults; set modes are written and read back; a contradiction is rejected
  // naming the key.
  FileParts p = valid_parts();
  for (const std::string& key : kOptionalModeKeys) {
    EXPECT_FALSE(p.header["__metadata__"].contains(key)) << key << " is written only when set";
  }
  const Trace t = parse_trace(join(p));
  EXPECT_FALSE(t.config.kv.scale_in_model_dtype);
  EXPECT_EQ(t.config.index.blockscale_scale, spec::BlockScaleFormula::kDivide);
  Trace custom = t;
  custom.config.kv.scale_mode = spec::ScaleMode::kDivApprox;
  custom.config.kv.scale_in_model_dtype = true;
  custom.config.index.layout = spec::IndexLayout::kBlockScale;
  custom.config.geometry.index_dim = 128;
  custom.config.index.blockscale_scale = spec::BlockScaleFormula::kMulRecip;
  const Trace back = parse_trace(serialize_trace(custom));
  EXPECT_EQ(back, custom);
  EXPECT_TRUE(back.config.kv.scale_in_model_dtype);
  EXPECT_EQ(back.config.index.blockscale_scale, spec::BlockScaleFormula::kMulRecip);
  EXPECT_TRUE(back.extra.empty()) << "mode keys are not extras";
  FileParts bad = valid_parts();
  bad.header["__metadata__"]["scale_mode"] = "none";
  bad.header["__metadata__"]["scale_in_model_dtype"] = "true";
  expect_rejected(join(bad), {"scale_in_model_dtype"});
  bad = valid_parts();
  bad.header["__metadata__"]["index_layout"] = "flat";
  bad.header["__metadata__"]["blockscale_scale"] = "mul_recip";
  expect_rejected(join(bad), {"blockscale_scale"});
  bad = valid_parts();
  bad.header["__metadata__"]["blockscale_scale"] = "halve";
  expect_rejected(join(bad), {"blockscale_scale", "halve"});
}

TEST(TraceMalformed, BadConfigurationValues) {
  const FileParts valid = valid_parts();
  const std::vector<std::pair<std::string, std::string>> cases{
      {"block_size", "0x10"},
      {"num_blocks", "-4"},
      {"num_blocks", "007"},
      {"kv_dtype", "fp9"},
      {"ue8m0", "yes"},
      {"format", "kvoracle-trace/2"},
      {"k_scale", "1,,2"},
      {"layers", "3X"},
      {"num_steps", "99999999999999999999"},
      // The optional read-side keys, when present, are as strict.
      {"topk", "0"},
      {"sparse_block", "0"},
      {"num_index_heads", "3"},
      {"num_q_heads", "-16"},
      {"out_dtype", "fp8_e4m3"},
      {"sm_scale", "1,2"},
      {"sm_scale", "-1"},
      {"topk", "99999999"},
      {"local_blocks", "x"}};
  for (const auto& [key, value] : cases) {
    FileParts p = valid;
    p.header["__metadata__"][key] = value;
    SCOPED_TRACE(key + "=" + value);
    try {
      (void)parse_trace(join(p));
      ADD_FAILURE() << "accepted";
    } catch (const spec::InvalidInput& e) {
      const std::string m = e.what();
      EXPECT_TRUE(m.find(key) != std::string::npos || key == "layers") << m;
    }
  }
  FileParts p = valid;
  p.header["__metadata__"]["block_size"] = "0";
  expect_rejected(join(p), {"block_size = 0"});
  p = valid;
  p.header["__metadata__"]["k_scale"] = "0";
  expect_rejected(join(p), {"k_scale", "0"});
}

TEST(TraceMalformed, MissingStepTensor) {
  FileParts p = valid_parts();
  // Remove step 4's seq_lens and give its bytes to no one: drop it from the data too.
  auto& e = p.header["step.4.seq_lens"];
  const auto a = e["data_offsets"][0].get<std::uint64_t>();
  const auto b = e["data_offsets"][1].get<std::uint64_t>();
  p.header.erase("step.4.seq_lens");
  p.data.erase(p.data.begin() + static_cast<long>(a), p.data.begin() + static_cast<long>(b));
  for (auto& [name, entry] : p.header.items()) {
    if (name == "__metadata__") continue;
    auto& off = entry["data_offsets"];
    for (int i = 0; i < 2; ++i) {
      if (off[i].get<std::uint64_t>() >= b) off[i] = off[i].get<std::uint64_t>() - (b - a);
    }
  }
  expect_rejected(join(p), {"tensor 'step.4.seq_lens' = missing", "num_steps' = 12"});
}

TEST(TraceMalformed, MissingWholeStep) {
  FileParts p = valid_parts();
  p.header["__metadata__"]["num_steps"] = "13";
  expect_rejected(join(p), {"tensor 'step.12.slot_mapping' = missing"});
}

TEST(TraceMalformed, StepPastNumSteps) {
  FileParts p = valid_parts();
  p.header["__metadata__"]["num_steps"] = "11";
  expect_rejected(join(p), {"tensor 'step.11.", "past __metadata__ 'num_steps' = 11"});
}

TEST(TraceMalformed, UnknownTensorName) {
  FileParts p = valid_parts();
  p.header["step.0.slots"] = p.header["step.0.slot_mapping"];
  p.header.erase("step.0.slot_mapping");
  expect_rejected(join(p), {"tensor 'step.0.slots'", "unknown part"});
  p = valid_parts();
  p.header["step.01.slot_mapping"] = p.header["step.1.slot_mapping"];
  p.header.erase("step.1.slot_mapping");
  expect_rejected(join(p), {"tensor 'step.01.slot_mapping'", "step.<s>.<part>"});
}

/// Rewrites element `i` of an integer tensor in place.
void poke(FileParts& p, const std::string& name, std::size_t i, std::int64_t v) {
  const auto& e = p.header[name];
  const std::size_t size = e["dtype"] == "I32" ? 4 : 8;
  const std::size_t at = e["data_offsets"][0].get<std::size_t>() + i * size;
  for (std::size_t k = 0; k < size; ++k) {
    p.data[at + k] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(v) >> (8 * k));
  }
}

TEST(TraceInconsistent, BatchSizesDisagree) {
  FileParts p = valid_parts();
  auto& e = p.header["step.2.seq_lens"];
  e["shape"][0] = e["shape"][0].get<std::int64_t>() - 1;
  // Keep the byte size consistent by claiming the last element belongs to a 1-element tensor.
  const auto end = e["data_offsets"][1].get<std::uint64_t>();
  const std::size_t eb = e["dtype"] == "I32" ? 4 : 8;
  e["data_offsets"][1] = end - eb;
  p.header["x.pad"] = {{"dtype", e["dtype"]}, {"shape", {1}}, {"data_offsets", {end - eb, end}}};
  expect_rejected(join(p), {"tensor 'step.2.seq_lens' shape", "one per block_table row"});
}

TEST(TraceInconsistent, QueryStartLocMustStartAtZeroAndIncrease) {
  FileParts p = valid_parts();
  poke(p, "step.3.query_start_loc", 0, 1);
  expect_rejected(join(p), {"tensor 'step.3.query_start_loc'[0] = 1", "expected 0"});
  p = valid_parts();
  poke(p, "step.3.query_start_loc", 1, 0);
  expect_rejected(join(p), {"tensor 'step.3.query_start_loc'[1] = 0", "expected > the previous"});
}

TEST(TraceInconsistent, SeqLenBeyondTheBlockTable) {
  FileParts p = valid_parts();
  const auto width = p.header["step.5.block_table"]["shape"][1].get<std::int64_t>();
  poke(p, "step.5.seq_lens", 0, width * 4 + 1);
  expect_rejected(join(p), {"tensor 'step.5.seq_lens'[0]",
                            "block_table has " + std::to_string(width) + " columns"});
}

TEST(TraceInconsistent, SeqLenBelowQueryLen) {
  FileParts p = valid_parts();
  poke(p, "step.0.seq_lens", 0, 0);
  expect_rejected(join(p), {"tensor 'step.0.seq_lens'[0] = 0", "query length"});
}

TEST(TraceInconsistent, TokensPastTheSlotMapping) {
  // Built at the trace level: the writer runs the reader over its output, so it rejects too.
  Trace t = small_trace();
  TraceStep& st = t.steps[6];
  const std::int64_t real = st.starts().back();
  st.slot_mapping.values.resize(static_cast<std::size_t>(real - 1));
  st.slot_mapping.shape = {real - 1};
  try {
    (void)serialize_trace(t);
    ADD_FAILURE() << "wrote a step whose tokens run past its slot mapping";
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("step.6."), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("past the slot mapping's " + std::to_string(real - 1)),
              std::string::npos)
        << e.what();
  }
}

TEST(TraceInconsistent, MetadataMustBeUtf8) {
  Trace t = small_trace();
  t.extra["note"] = "\xff\xfe";
  EXPECT_THROW((void)serialize_trace(t), spec::InvalidInput);
}

TEST(TraceInconsistent, SlotTypeMustBeTheModels) {
  FileParts p = valid_parts();
  p.header["__metadata__"]["slot_type"] = "i32";
  expect_rejected(join(p), {"tensor 'step.0.slot_mapping' dtype = I64", "slot type i32"});
}

TEST(TraceInconsistent, IndexSlotMappingPresentIffSeparate) {
  FileParts p = split(serialize_trace(small_trace(5, true)));
  p.header["__metadata__"]["separate_index_slots"] = "false";
  expect_rejected(join(p), {"tensor 'step.0.index_slot_mapping' = present", "expected absent"});
  p = valid_parts();
  p.header["__metadata__"]["separate_index_slots"] = "true";
  expect_rejected(join(p), {"tensor 'step.0.index_slot_mapping' = missing"});
}

TEST(TraceInconsistent, RequestIdsRepeat) {
  const Trace t = small_trace();
  std::size_t s = 0;
  while (t.steps[s].batch() < 2) ++s;
  FileParts p = split(serialize_trace(t));
  poke(p, "step." + std::to_string(s) + ".request_ids", 1, t.steps[s].request_ids->values[0]);
  expect_rejected(join(p), {"tensor 'step." + std::to_string(s) + ".request_ids'[1]", "repeats"});
}

TEST(TraceFile, SaveIsAtomicAndLoadNamesThePath) {
  const auto dir = std::filesystem::temp_directory_path() / "kvo_trace_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto path = dir / "t.st";
  save_trace(small_trace(), path);
  EXPECT_TRUE(load_trace(path) == small_trace());
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1u) << "no temporary left behind";
  EXPECT_THROW(save_trace(small_trace(), dir / "missing" / "t.st"), spec::InvalidInput);
  EXPECT_FALSE(std::filesystem::exists(dir / "missing"));
  try {
    (void)load_trace(dir / "nope.st");
    ADD_FAILURE();
  } catch (const spec::InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("nope.st"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

TEST(Safetensors, ZeroSizedTensorsAndAllDtypes) {
  const std::string h = R"({"a":{"dtype":"BF16","shape":[0,3],"data_offsets":[0,0]},)"
                        R"("b":{"dtype":"F8_E5M2","shape":[3],"data_offsets":[0,3]},)"
                        R"("c":{"dtype":"F64","shape":[],"data_offsets":[3,11]}})";
  const auto bytes = join(h, std::vector<std::uint8_t>(11, 7));
  const StFile f = parse_safetensors(bytes);
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[2].name, "c");
  EXPECT_EQ(f.tensors[2].bytes.size(), 8u);
  EXPECT_EQ(f.data_offset, 8 + h.size());
}

}  // namespace
}  // namespace kvo::traces
