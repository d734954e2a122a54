// GGUF reader and writer: exact round trips, the real model files, and one test per kind of malformed file.
// Malformed files are made by writing a good file with gguf::Writer and patching or truncating its bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/tensor_types.h"
#include "gguf_test_util.h"
#include "runtime/resources.h"
#include "util/error.h"

namespace sparrow::gguf {
namespace {

using namespace test_util;

// Real files, found as the tools find them (runtime/resources.h); empty paths when absent.
const std::string kDefaultModel = resources::default_model().path.string();
const std::string kGemma4Vocab = resources::gemma4_vocab_path().string();

// ---------------------------------------------------------------------------------------------------------
// Building and comparing values

Value scalar_unsigned(ValueType t, uint64_t u) {
  Value v;
  v.type = t;
  v.u = u;
  return v;
}
Value scalar_signed(ValueType t, int64_t i) {
  Value v;
  v.type = t;
  v.i = i;
  return v;
}
Value scalar_float(ValueType t, double f) {
  Value v;
  v.type = t;
  v.f = f;
  return v;
}
Value scalar_string(const std::string& s) {
  Value v;
  v.type = ValueType::STRING;
  v.s = s;
  return v;
}
Value array(ValueType element_type) {
  Value v;
  v.type = ValueType::ARRAY;
  v.element_type = element_type;
  return v;
}
Value array_unsigned(ValueType t, std::vector<uint64_t> u) {
  Value v = array(t);
  v.array_u = std::move(u);
  return v;
}
Value array_signed(ValueType t, std::vector<int64_t> i) {
  Value v = array(t);
  v.array_i = std::move(i);
  return v;
}
Value array_float(ValueType t, std::vector<double> f) {
  Value v = array(t);
  v.array_f = std::move(f);
  return v;
}
Value array_string(std::vector<std::string> s) {
  Value v = array(ValueType::STRING);
  v.array_s = std::move(s);
  return v;
}

// Floats compare by bits, so that -0.0, infinities and NaN payloads must survive too.
std::vector<uint64_t> float_bits(const std::vector<double>& f) {
  std::vector<uint64_t> bits;
  for (double x : f) bits.push_back(std::bit_cast<uint64_t>(x));
  return bits;
}

void expect_same_value(const std::string& key, const Value& expected, const Value& actual) {
  ASSERT_EQ(static_cast<int>(expected.type), static_cast<int>(actual.type)) << key;
  if (expected.type == ValueType::ARRAY) {
    EXPECT_EQ(static_cast<int>(expected.element_type), static_cast<int>(actual.element_type)) << key;
    EXPECT_EQ(expected.array_size(), actual.array_size()) << key;
    EXPECT_EQ(expected.array_u, actual.array_u) << key;
    EXPECT_EQ(expected.array_i, actual.array_i) << key;
    EXPECT_EQ(float_bits(expected.array_f), float_bits(actual.array_f)) << key;
    EXPECT_EQ(expected.array_s, actual.array_s) << key;
    return;
  }
  switch (expected.type) {
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
    case ValueType::BOOL:
      EXPECT_EQ(expected.u, actual.u) << key;
      break;
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      EXPECT_EQ(expected.i, actual.i) << key;
      break;
    case ValueType::FLOAT32: case ValueType::FLOAT64:
      EXPECT_EQ(std::bit_cast<uint64_t>(expected.f), std::bit_cast<uint64_t>(actual.f)) << key;
      break;
    case ValueType::STRING:
      EXPECT_EQ(expected.s, actual.s) << key;
      break;
    case ValueType::ARRAY:
      break;
  }
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// Every value type as a scalar and as an array (empty arrays and extreme values included).
std::map<std::string, Value> every_value_type() {
  using VT = ValueType;
  const double kInf = std::numeric_limits<double>::infinity();
  std::map<std::string, Value> values;
  values["scalar.uint8"] = scalar_unsigned(VT::UINT8, 255);
  values["scalar.int8"] = scalar_signed(VT::INT8, -128);
  values["scalar.uint16"] = scalar_unsigned(VT::UINT16, 65535);
  values["scalar.int16"] = scalar_signed(VT::INT16, -32768);
  values["scalar.uint32"] = scalar_unsigned(VT::UINT32, 4294967295u);
  values["scalar.int32"] = scalar_signed(VT::INT32, std::numeric_limits<int32_t>::min());
  values["scalar.float32"] = scalar_float(VT::FLOAT32, 1e-6f);
  values["scalar.bool.true"] = scalar_unsigned(VT::BOOL, 1);
  values["scalar.bool.false"] = scalar_unsigned(VT::BOOL, 0);
  values["scalar.string"] = scalar_string(std::string("h\xC3\xA9llo, \0 world", 15));
  values["scalar.string.empty"] = scalar_string("");
  values["scalar.uint64"] = scalar_unsigned(VT::UINT64, std::numeric_limits<uint64_t>::max());
  values["scalar.int64"] = scalar_signed(VT::INT64, std::numeric_limits<int64_t>::min());
  values["scalar.float64"] = scalar_float(VT::FLOAT64, -0.0);
  values["array.uint8"] = array_unsigned(VT::UINT8, {0, 1, 255});
  values["array.int8"] = array_signed(VT::INT8, {-128, 0, 127});
  values["array.uint16"] = array_unsigned(VT::UINT16, {0, 65535});
  values["array.int16"] = array_signed(VT::INT16, {-32768, 32767});
  values["array.uint32"] = array_unsigned(VT::UINT32, {0, 7, 4294967295u});
  values["array.int32"] = array_signed(VT::INT32, {-1, 2, -3});
  values["array.float32"] = array_float(VT::FLOAT32, {0.5, -kInf, 3.4028234663852886e38});
  values["array.bool"] = array_unsigned(VT::BOOL, {1, 0, 1, 1});
  values["array.string"] = array_string({"", "a", std::string(1000, 'x'), "\xE2\x96\x81the"});
  values["array.uint64"] = array_unsigned(VT::UINT64, {std::numeric_limits<uint64_t>::max(), 0});
  values["array.int64"] = array_signed(VT::INT64, {std::numeric_limits<int64_t>::max(), -5});
  values["array.float64"] = array_float(VT::FLOAT64, {1e300, 5e-324, kInf});
  values["array.empty.int32"] = array(VT::INT32);
  values["array.empty.string"] = array(VT::STRING);
  return values;
}

struct TensorSpec {
  std::string name;
  TensorType type;
  std::vector<int64_t> ne;
};

const std::vector<TensorSpec> kSomeTensors = {
    {.name = "t.f32", .type = TensorType::F32, .ne = {4, 3}},
    {.name = "t.f16", .type = TensorType::F16, .ne = {7}},
    {.name = "t.bf16", .type = TensorType::BF16, .ne = {2, 2, 2, 2}},
    {.name = "t.q8_0", .type = TensorType::Q8_0, .ne = {64, 2}},
    {.name = "t.q4_k", .type = TensorType::Q4_K, .ne = {256, 3}},
    {.name = "t.q6_k", .type = TensorType::Q6_K, .ne = {512}},
    {.name = "t.iq4_nl", .type = TensorType::IQ4_NL, .ne = {32, 1, 1, 2}},
    {.name = "t.i32", .type = TensorType::I32, .ne = {5, 1}},
};

size_t tensor_bytes(const TensorSpec& spec) {
  size_t rows = 1;
  for (size_t d = 1; d < spec.ne.size(); ++d) rows *= static_cast<size_t>(spec.ne[d]);
  return tensor_row_bytes(spec.type, spec.ne[0]) * rows;
}

// ---------------------------------------------------------------------------------------------------------
// Tensor types

TEST(TensorTypes, BlockGeometryMatchesGgml) {
  struct Expected {
    TensorType type;
    const char* name;
    uint32_t elements;
    uint32_t bytes;
  };
  const Expected expected[] = {
      {.type = TensorType::F32, .name = "f32", .elements = 1, .bytes = 4},
      {.type = TensorType::F16, .name = "f16", .elements = 1, .bytes = 2},
      {.type = TensorType::BF16, .name = "bf16", .elements = 1, .bytes = 2},
      {.type = TensorType::Q4_0, .name = "q4_0", .elements = 32, .bytes = 18},
      {.type = TensorType::Q8_0, .name = "q8_0", .elements = 32, .bytes = 34},
      {.type = TensorType::Q4_K, .name = "q4_K", .elements = 256, .bytes = 144},
      {.type = TensorType::Q6_K, .name = "q6_K", .elements = 256, .bytes = 210},
      {.type = TensorType::Q8_K, .name = "q8_K", .elements = 256, .bytes = 292},
      {.type = TensorType::IQ2_XXS, .name = "iq2_xxs", .elements = 256, .bytes = 66},
      {.type = TensorType::IQ4_XS, .name = "iq4_xs", .elements = 256, .bytes = 136},
      {.type = TensorType::TQ1_0, .name = "tq1_0", .elements = 256, .bytes = 54},
      {.type = TensorType::MXFP4, .name = "mxfp4", .elements = 32, .bytes = 17},
      {.type = TensorType::I64, .name = "i64", .elements = 1, .bytes = 8},
  };
  for (const Expected& e : expected) {
    const TensorTypeInfo* info = tensor_type_info(static_cast<uint32_t>(e.type));
    ASSERT_NE(info, nullptr) << e.name;
    EXPECT_EQ(info->name, e.name);
    EXPECT_EQ(info->block_elements, e.elements) << e.name;
    EXPECT_EQ(info->block_bytes, e.bytes) << e.name;
  }
}

TEST(TensorTypes, RemovedAndFutureIdsAreUnknown) {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 1000u, 0xFFFFFFFFu}) {
    EXPECT_EQ(tensor_type_info(id), nullptr) << "id " << id;
  }
  EXPECT_EQ(tensor_type_name(static_cast<TensorType>(4)), "type 4");
}

TEST(TensorTypes, RowBytes) {
  EXPECT_EQ(tensor_row_bytes(TensorType::Q4_K, 640 * 4), 10u * 144);
  EXPECT_EQ(tensor_row_bytes(TensorType::F16, 3), 6u);
  EXPECT_THROW(tensor_row_bytes(TensorType::Q8_0, 33), Error);
  EXPECT_THROW(tensor_row_bytes(static_cast<TensorType>(4), 32), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Round trips

// How the tensors of a round trip get their bytes.
enum class TensorData { Copied, Streamed, EveryOtherStreamed };

bool is_streamed(TensorData how, size_t k) {
  return how == TensorData::Streamed || (how == TensorData::EveryOtherStreamed && k % 2 == 1);
}

// A producer that hands over each tensor's bytes in uneven pieces (1 byte, 5 bytes, then the rest), checking that
// the writer asks for the declared tensors in order and tells each one's size and offset.
TensorProducer piecewise_producer(const std::vector<std::vector<uint8_t>>& data, const std::vector<size_t>& streamed,
                                  uint32_t alignment) {
  return [&data, streamed, alignment, next = size_t{0}](const TensorInfo& tensor, TensorSink& sink) mutable {
    ASSERT_LT(next, streamed.size());
    const size_t k = streamed[next++];
    EXPECT_EQ(tensor.name, kSomeTensors[k].name);
    EXPECT_EQ(tensor.nbytes, data[k].size()) << tensor.name;
    EXPECT_EQ(tensor.offset % alignment, 0u) << tensor.name;
    EXPECT_EQ(tensor.data, nullptr) << tensor.name;
    size_t done = 0;
    for (size_t piece : {size_t{1}, size_t{5}, data[k].size()}) {
      const size_t n = std::min(piece, data[k].size() - done);
      sink.write(data[k].data() + done, n);
      done += n;
    }
  };
}

void write_and_check_round_trip(uint32_t alignment, TensorData how = TensorData::Copied) {
  TempDir dir;
  const std::string path = dir.file("round_trip.gguf");
  const std::map<std::string, Value> values = every_value_type();

  Writer writer;
  for (const auto& [key, value] : values) writer.set_value(key, value);
  std::vector<std::vector<uint8_t>> data;
  std::vector<size_t> streamed;
  for (size_t k = 0; k < kSomeTensors.size(); ++k) {
    const TensorSpec& spec = kSomeTensors[k];
    data.push_back(random_bytes(tensor_bytes(spec), static_cast<uint32_t>(k)));
    if (is_streamed(how, k)) {
      writer.declare_tensor(spec.name, spec.type, spec.ne);
      streamed.push_back(k);
    } else {
      writer.add_tensor(spec.name, spec.type, spec.ne, data.back().data(), data.back().size());
    }
  }
  if (how == TensorData::Copied) {
    writer.write(path, alignment);
  } else {
    writer.write(path, piecewise_producer(data, streamed, alignment), alignment);
  }

  auto file = File::open(path);
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->alignment(), alignment);
  EXPECT_EQ(file->has("general.alignment"), alignment != 32);
  EXPECT_EQ(file->metadata().size(), values.size() + (alignment != 32 ? 1 : 0));
  for (const auto& [key, value] : values) {
    const Value* read = file->find(key);
    ASSERT_NE(read, nullptr) << key;
    expect_same_value(key, value, *read);
  }
  ASSERT_EQ(file->tensors().size(), kSomeTensors.size());
  for (size_t k = 0; k < kSomeTensors.size(); ++k) {
    const TensorSpec& spec = kSomeTensors[k];
    const TensorInfo& t = file->tensors()[k];  // tensor infos keep the order they were added in
    EXPECT_EQ(t.name, spec.name);
    EXPECT_EQ(t.type, spec.type) << spec.name;
    ASSERT_EQ(t.n_dims, spec.ne.size()) << spec.name;
    for (size_t d = 0; d < 4; ++d) EXPECT_EQ(t.ne[d], d < spec.ne.size() ? spec.ne[d] : 1) << spec.name;
    EXPECT_EQ(t.nbytes, data[k].size()) << spec.name;
    EXPECT_EQ(t.offset % alignment, 0u) << spec.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u) << spec.name;
    EXPECT_EQ(std::memcmp(t.data, data[k].data(), t.nbytes), 0) << spec.name;
    EXPECT_EQ(file->find_tensor(spec.name), &t);
  }
}

TEST(GgufRoundTrip, EveryValueTypeAndSeveralTensorTypes) { write_and_check_round_trip(32); }
TEST(GgufRoundTrip, Alignment64) { write_and_check_round_trip(64); }
TEST(GgufRoundTrip, Alignment8) { write_and_check_round_trip(8); }
TEST(GgufRoundTrip, StreamedTensors) { write_and_check_round_trip(32, TensorData::Streamed); }
TEST(GgufRoundTrip, StreamedAndCopiedTensorsAlignment64) {
  write_and_check_round_trip(64, TensorData::EveryOtherStreamed);
}
TEST(GgufRoundTrip, StreamedAndCopiedTensorsAlignment8) {
  write_and_check_round_trip(8, TensorData::EveryOtherStreamed);
}

TEST(GgufRoundTrip, TypedSetters) {
  TempDir dir;
  const std::string path = dir.file("setters.gguf");
  Writer writer;
  writer.set_u32("u32", 4000000000u);
  writer.set_i32("i32", -7);
  writer.set_u64("u64", uint64_t{1} << 40);
  writer.set_f32("f32", 0.1f);
  writer.set_bool("bool", true);
  writer.set_string("string", "gemma3");
  writer.set_array_i32("array.i32", {-1, 0, 1});
  writer.set_array_u32("array.u32", {4000000000u, 3});
  writer.set_array_f32("array.f32", {0.25f, -1.5f});
  writer.set_array_bool("array.bool", {true, false, true});
  writer.set_array_string("array.string", {"<pad>", "<eos>"});
  writer.write(path);

  auto file = File::open(path);
  EXPECT_EQ(file->get_uint("u32"), 4000000000u);
  EXPECT_EQ(file->find("i32")->i, -7);
  EXPECT_EQ(file->get_uint("u64"), uint64_t{1} << 40);
  EXPECT_EQ(file->get_float("f32"), static_cast<double>(0.1f));
  EXPECT_TRUE(file->get_bool("bool"));
  EXPECT_EQ(file->get_string("string"), "gemma3");
  EXPECT_EQ(file->get_int_array("array.i32"), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(file->get_int_array("array.u32"), (std::vector<int64_t>{4000000000, 3}));
  EXPECT_EQ(file->get_float_array("array.f32"), (std::vector<double>{0.25, -1.5}));
  EXPECT_EQ(file->get_bool_array("array.bool"), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(file->get_string_array("array.string"), (std::vector<std::string>{"<pad>", "<eos>"}));
  EXPECT_TRUE(file->tensors().empty());
}

TEST(GgufWriter, KeepsMetadataInInsertionOrder) {
  TempDir dir;
  const std::string path = dir.file("order.gguf");
  Writer writer;
  writer.set_string("z.first", "1");
  writer.set_string("a.second", "2");
  writer.set_string("z.first", "replaced");  // a key set twice keeps its first position
  writer.write(path);
  const std::vector<uint8_t> bytes = read_bytes(path);
  EXPECT_EQ(peek<uint64_t>(bytes, 16), 2u);  // n_kv
  EXPECT_LT(find_unique(bytes, "z.first"), find_unique(bytes, "a.second"));
  EXPECT_EQ(File::open(path)->get_string("z.first"), "replaced");
}

TEST(GgufWriter, AlignmentKeyFollowsTheWrittenAlignment) {
  TempDir dir;
  Writer writer;
  writer.set_u32("general.alignment", 64);  // stale: the alignment passed to write() is the one used
  const float x[8] = {};
  writer.add_tensor("x", TensorType::F32, {8}, x, sizeof(x));
  writer.write(dir.file("a32.gguf"), 32);
  writer.write(dir.file("a128.gguf"), 128);
  EXPECT_FALSE(File::open(dir.file("a32.gguf"))->has("general.alignment"));
  auto f128 = File::open(dir.file("a128.gguf"));
  EXPECT_EQ(f128->alignment(), 128u);
  EXPECT_EQ(f128->get_uint("general.alignment"), 128u);
  EXPECT_EQ(f128->find("general.alignment")->type, ValueType::UINT32);
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer writer;
  const std::vector<uint8_t> bytes(4096);
  EXPECT_THROW(writer.add_tensor("bad.size", TensorType::F32, {4}, bytes.data(), 15), Error);
  EXPECT_THROW(writer.add_tensor("bad.block", TensorType::Q8_0, {33}, bytes.data(), 34), Error);
  EXPECT_THROW(writer.add_tensor("bad.dims", TensorType::F32, {1, 1, 1, 1, 1}, bytes.data(), 4), Error);
  EXPECT_THROW(writer.add_tensor("bad.zero", TensorType::F32, {4, 0}, bytes.data(), 0), Error);
  EXPECT_THROW(writer.add_tensor("bad.type", static_cast<TensorType>(4), {32}, bytes.data(), 18), Error);
  EXPECT_THROW(writer.add_tensor(std::string(64, 'n'), TensorType::F32, {1}, bytes.data(), 4), Error);
  EXPECT_THROW(writer.add_tensor("", TensorType::F32, {1}, bytes.data(), 4), Error);
  writer.add_tensor("ok", TensorType::F32, {1}, bytes.data(), 4);
  EXPECT_THROW(writer.add_tensor("ok", TensorType::F32, {1}, bytes.data(), 4), Error);

  EXPECT_THROW(writer.set_value("u8", scalar_unsigned(ValueType::UINT8, 256)), Error);
  EXPECT_THROW(writer.set_value("i16", array_signed(ValueType::INT16, {40000})), Error);
  EXPECT_THROW(writer.set_value("nested", array(ValueType::ARRAY)), Error);
  EXPECT_THROW(writer.set_value("type", scalar_unsigned(static_cast<ValueType>(13), 0)), Error);
  EXPECT_THROW(writer.set_string("", "x"), Error);

  EXPECT_THROW(writer.declare_tensor("ok", TensorType::F32, {1}), Error);
  EXPECT_THROW(writer.declare_tensor("bad.block", TensorType::Q8_0, {33}), Error);
  EXPECT_THROW(writer.declare_tensor("bad.zero", TensorType::F32, {4, 0}), Error);
  EXPECT_THROW(writer.declare_tensor("bad.type", static_cast<TensorType>(4), {32}), Error);
  EXPECT_THROW(writer.declare_tensor("bad.overflow", TensorType::F32, {int64_t{1} << 62, 4}), Error);

  TempDir dir;
  EXPECT_THROW(writer.write(dir.file("a.gguf"), 48), Error);
  EXPECT_THROW(writer.data_layout(48), Error);
  EXPECT_THROW(writer.write(dir.file("missing_dir/a.gguf")), Error);
}

TEST(GgufWriter, DataLayoutAlignsEveryTensor) {
  Writer writer;
  const std::vector<uint8_t> zeros(64);
  writer.add_tensor("f32x3", TensorType::F32, {3}, zeros.data(), 12);
  writer.declare_tensor("q8_0x32", TensorType::Q8_0, {32});  // one 34-byte block
  writer.add_tensor("f16x1", TensorType::F16, {1}, zeros.data(), 2);
  struct Expected {
    uint32_t alignment;
    uint64_t offsets[3];
    uint64_t nbytes;
  };
  for (const Expected& e : {Expected{.alignment = 32, .offsets = {0, 32, 96}, .nbytes = 128},
                            Expected{.alignment = 8, .offsets = {0, 16, 56}, .nbytes = 64}}) {
    SCOPED_TRACE("alignment " + std::to_string(e.alignment));
    const Writer::DataLayout layout = writer.data_layout(e.alignment);
    ASSERT_EQ(layout.tensors.size(), 3u);
    EXPECT_EQ(layout.nbytes, e.nbytes);
    const uint64_t sizes[3] = {12, 34, 2};
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_EQ(layout.tensors[k].offset, e.offsets[k]) << layout.tensors[k].name;
      EXPECT_EQ(layout.tensors[k].nbytes, sizes[k]) << layout.tensors[k].name;
    }
    EXPECT_NE(layout.tensors[0].data, nullptr);  // the writer's copy
    EXPECT_EQ(layout.tensors[1].data, nullptr);  // declared: produced during write()
  }
}

// Expects write() to fail with "<path>.tmp: tensor <name>: ..." containing detail, leaving no file behind.
void expect_write_error(const Writer& writer, const TensorProducer& produce, const std::string& tensor,
                        const std::string& detail) {
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  try {
    writer.write(path, produce);
    ADD_FAILURE() << "writing succeeded, expected an error about tensor " << tensor;
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(path + ".tmp: tensor " + tensor + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(detail), std::string::npos) << message;
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, ProducerMustWriteExactlyTheTensorSize) {
  Writer writer;
  writer.declare_tensor("x", TensorType::F32, {4});  // 16 bytes
  const std::vector<uint8_t> bytes(32);
  expect_write_error(
      writer, [&](const TensorInfo&, TensorSink& sink) { sink.write(bytes.data(), 12); }, "x",
      "producer wrote 12 bytes, shape {4} of f32 needs 16 bytes");
  expect_write_error(
      writer,
      [&](const TensorInfo&, TensorSink& sink) {
        sink.write(bytes.data(), 12);
        sink.write(bytes.data(), 8);
      },
      "x", "producer wrote 12 + 8 bytes, shape {4} of f32 needs 16 bytes");
  expect_write_error(
      writer, [&](const TensorInfo&, TensorSink& sink) { sink.write(nullptr, 16); }, "x", "no data");
}

TEST(GgufWriter, DeclaredTensorsNeedAProducer) {
  Writer writer;
  writer.declare_tensor("x", TensorType::F32, {4});
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  try {
    writer.write(path);
    ADD_FAILURE() << "writing a declared tensor without a producer succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), path + ": tensor x: declared without data, and no producer given");
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(GgufWriter, ProducerErrorLeavesNoFile) {
  Writer writer;
  writer.declare_tensor("x", TensorType::F32, {4});
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  EXPECT_THROW(writer.write(path, [](const TensorInfo&, TensorSink&) { throw Error("producer failed"); }), Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// A file larger than memory can be written only if each streamed tensor goes to disk before the next is produced.
TEST(GgufWriter, StreamedTensorReachesTheFileBeforeTheNextIsProduced) {
  constexpr int64_t kFirstElements = int64_t{1} << 21;  // 8 MiB of f32
  Writer writer;
  writer.declare_tensor("first", TensorType::F32, {kFirstElements});
  writer.declare_tensor("second", TensorType::F32, {8});
  TempDir dir;
  const std::string path = dir.file("out.gguf");
  uintmax_t size_when_second_starts = 0;
  writer.write(path, [&](const TensorInfo& tensor, TensorSink& sink) {
    if (tensor.name == "second") size_when_second_starts = std::filesystem::file_size(path + ".tmp");
    const std::vector<uint8_t> zeros(tensor.nbytes);
    sink.write(zeros.data(), zeros.size());
  });
  // Output buffering may hold back a little of the first tensor, far less than all of it.
  EXPECT_GE(size_when_second_starts, uintmax_t{6} << 20);
  EXPECT_EQ(File::open(path)->tensor("first").nbytes, size_t{8} << 20);
}

// ---------------------------------------------------------------------------------------------------------
// Typed getters

class GgufGetters : public ::testing::Test {
 protected:
  void SetUp() override {
    Writer writer;
    writer.set_u32("u32", 5);
    writer.set_i32("i32.negative", -5);
    writer.set_i32("i32.positive", 9);
    writer.set_f32("f32", 2.5f);
    writer.set_value("f64", scalar_float(ValueType::FLOAT64, 0.125));
    writer.set_string("string", "text");
    writer.set_bool("bool", false);
    writer.set_array_u32("array.u32", {1, 2});
    writer.set_value("array.u64.huge", array_unsigned(ValueType::UINT64, {uint64_t{1} << 63}));
    writer.set_array_string("array.string", {"a"});
    writer.set_array_bool("array.bool", {false, true});
    const float x[640 * 2] = {};
    writer.add_tensor("token_embd.weight", TensorType::F32, {640, 2}, x, sizeof(x));
    path_ = dir_.file("getters.gguf");
    writer.write(path_);
    file_ = File::open(path_);
  }
  // The getter must throw "<path>: <key>: ..." containing detail.
  template <class F>
  void expect_error(F&& get, const std::string& key, const std::string& detail) {
    try {
      get();
      ADD_FAILURE() << "no error for " << key;
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path_ + ": " + key + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(detail), std::string::npos) << message;
    }
  }
  TempDir dir_;
  std::string path_;
  std::unique_ptr<File> file_;
};

TEST_F(GgufGetters, IntegersAcceptAnyIntegerType) {
  EXPECT_EQ(file_->get_uint("u32"), 5u);
  EXPECT_EQ(file_->get_uint("i32.positive"), 9u);
  EXPECT_EQ(file_->get_uint_opt("absent"), std::nullopt);
  EXPECT_EQ(file_->get_uint_opt("u32"), 5u);
  expect_error([&] { file_->get_uint("i32.negative"); }, "i32.negative", "negative");
  expect_error([&] { file_->get_uint("string"); }, "string", "found string");
  expect_error([&] { file_->get_uint("absent"); }, "absent", "missing");
}

TEST_F(GgufGetters, FloatsBoolsStrings) {
  EXPECT_EQ(file_->get_float("f32"), 2.5);
  EXPECT_EQ(file_->get_float("f64"), 0.125);
  EXPECT_EQ(file_->get_float_opt("absent"), std::nullopt);
  EXPECT_FALSE(file_->get_bool("bool"));
  EXPECT_EQ(file_->get_string("string"), "text");
  EXPECT_EQ(file_->get_string_opt("absent"), std::nullopt);
  expect_error([&] { file_->get_float("u32"); }, "u32", "expected float32 or float64, found uint32");
  expect_error([&] { file_->get_bool("u32"); }, "u32", "expected bool, found uint32");
  expect_error([&] { file_->get_string("array.string"); }, "array.string", "expected string, found array of string");
  expect_error([&] { file_->get_string_opt("bool"); }, "bool", "found bool");
}

TEST_F(GgufGetters, Arrays) {
  EXPECT_EQ(file_->get_int_array("array.u32"), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(file_->get_int_array("array.bool"), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(file_->get_bool_array("array.bool"), (std::vector<bool>{false, true}));
  EXPECT_EQ(file_->get_string_array("array.string").size(), 1u);
  expect_error([&] { file_->get_int_array("array.u64.huge"); }, "array.u64.huge", "does not fit in int64");
  expect_error([&] { file_->get_int_array("u32"); }, "u32", "expected array of integers, found uint32");
  expect_error([&] { file_->get_float_array("array.u32"); }, "array.u32", "found array of uint32");
  expect_error([&] { file_->get_string_array("array.bool"); }, "array.bool", "expected array of string");
  expect_error([&] { file_->get_bool_array("array.u32"); }, "array.u32", "expected array of bool");
}

TEST_F(GgufGetters, Tensors) {
  const TensorInfo& t = file_->tensor("token_embd.weight");
  file_->expect_shape(t, {640, 2});
  file_->expect_shape(t, {640, 2, 1, 1});
  EXPECT_EQ(file_->find_tensor("absent"), nullptr);
  expect_error([&] { file_->tensor("absent"); }, "tensor absent", "missing");
  expect_error([&] { file_->expect_shape(t, {2, 640}); }, "tensor token_embd.weight",
               "shape {640,2} expected {2,640}");
  expect_error([&] { file_->expect_shape(t, {640}); }, "tensor token_embd.weight", "expected {640}");
}

// ---------------------------------------------------------------------------------------------------------
// Real files (mmap only: opening reads the header, never the tensor data)

TEST(GgufRealFiles, DefaultGemma3Model) {
  if (!std::filesystem::exists(kDefaultModel)) GTEST_SKIP() << "default model absent: " << kDefaultModel;
  auto file = File::open(kDefaultModel);
  EXPECT_EQ(file->get_string("general.architecture"), "gemma3");
  EXPECT_GT(file->tensors().size(), 0u);
  const uint64_t n_embd = file->get_uint("gemma3.embedding_length");
  const size_t n_vocab = file->get_string_array("tokenizer.ggml.tokens").size();
  const TensorInfo& embd = file->tensor("token_embd.weight");
  file->expect_shape(embd, {static_cast<int64_t>(n_embd), static_cast<int64_t>(n_vocab)});
  EXPECT_EQ(n_embd, 640u);
  EXPECT_EQ(n_vocab, 262144u);
  for (const TensorInfo& t : file->tensors()) {
    EXPECT_EQ(t.nbytes, tensor_row_bytes(t.type, t.ne[0]) * static_cast<size_t>(t.ne[1] * t.ne[2] * t.ne[3]))
        << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % file->alignment(), 0u) << t.name;
  }
}

TEST(GgufRealFiles, Gemma4VocabFixture) {
  if (!std::filesystem::exists(kGemma4Vocab)) GTEST_SKIP() << "fixture absent: " << kGemma4Vocab;
  auto file = File::open(kGemma4Vocab);
  const std::vector<std::string>& tokens = file->get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 262144u);
  EXPECT_EQ(tokens[file->get_uint("tokenizer.ggml.bos_token_id")], "<bos>");
  EXPECT_EQ(file->get_float_array("tokenizer.ggml.scores").size(), 262144u);
  EXPECT_EQ(file->get_int_array("tokenizer.ggml.token_type").size(), 262144u);
  EXPECT_GT(file->get_string_array("tokenizer.ggml.merges").size(), 0u);
  EXPECT_TRUE(file->tensors().empty());
}

// Copying every key of a real file through Writer::set_value must reproduce it exactly.
TEST(GgufRealFiles, Gemma4VocabMetadataCopiesExactly) {
  if (!std::filesystem::exists(kGemma4Vocab)) GTEST_SKIP() << "fixture absent: " << kGemma4Vocab;
  auto original = File::open(kGemma4Vocab);
  Writer writer;
  for (const auto& [key, value] : original->metadata()) writer.set_value(key, value);
  TempDir dir;
  writer.write(dir.file("copy.gguf"));
  auto copy = File::open(dir.file("copy.gguf"));
  ASSERT_EQ(copy->metadata().size(), original->metadata().size());
  for (const auto& [key, value] : original->metadata()) {
    ASSERT_TRUE(copy->has(key)) << key;
    expect_same_value(key, value, *copy->find(key));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Malformed files: each test patches or truncates one good file and expects "<path>: <field>: <detail>".

class MalformedGguf : public ::testing::Test {
 protected:
  void SetUp() override {
    Writer writer;
    // Truncation cases cut inside the later keys: the earlier ones cover the minimum size of the key count.
    writer.set_string("general.architecture", "test");
    writer.set_u32("test.key1", 1);
    writer.set_u32("test.key2", 2);
    writer.set_array_string("test.strings", {"alpha", "beta"});
    writer.set_array_i32("test.ints", {1, 2, 3});
    writer.set_u32("test.count", 7);
    writer.set_string("test.name", "a string value");
    const std::vector<float> one(16, 1.0f);
    writer.add_tensor("weight.one", TensorType::F32, {8, 2}, one.data(), 64);
    const std::vector<uint8_t> two(68, 0x11);
    writer.add_tensor("weight.two", TensorType::Q8_0, {32, 2}, two.data(), 68);
    writer.write(dir_.file("good.gguf"));
    bytes_ = read_bytes(dir_.file("good.gguf"));
    File::open(dir_.file("good.gguf"));  // the starting point must be valid
  }

  // Writes bytes to a fresh file and returns its path.
  std::string save(const std::vector<uint8_t>& bytes) {
    const std::string path = dir_.file("bad" + std::to_string(saved_++) + ".gguf");
    write_bytes(path, bytes);
    return path;
  }
  std::string save_patched() { return save(bytes_); }
  std::string save_truncated(size_t size) {
    return save(std::vector<uint8_t>(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(size)));
  }

  // Offsets of fields in the good file, found from the names written before them.
  size_t key_at(std::string_view key) { return find_unique(bytes_, key); }
  size_t value_type_at(std::string_view key) { return key_at(key) + key.size(); }
  size_t value_at(std::string_view key) { return value_type_at(key) + 4; }
  size_t array_count_at(std::string_view key) { return value_at(key) + 4; }
  size_t n_dims_at(std::string_view tensor) { return find_unique(bytes_, tensor) + tensor.size(); }
  size_t ne_at(std::string_view tensor, size_t d) { return n_dims_at(tensor) + 4 + 8 * d; }
  size_t tensor_type_at(std::string_view tensor) {
    return ne_at(tensor, peek<uint32_t>(bytes_, n_dims_at(tensor)));
  }
  size_t tensor_offset_at(std::string_view tensor) { return tensor_type_at(tensor) + 4; }
  // End of the tensor infos: the last tensor's offset field is the last thing before the padding.
  size_t header_end() { return tensor_offset_at("weight.two") + 8; }

  TempDir dir_;
  std::vector<uint8_t> bytes_;
  int saved_ = 0;
};

TEST_F(MalformedGguf, MissingFile) {
  expect_open_error(dir_.file("absent.gguf"), "open", "No such file");
}

TEST_F(MalformedGguf, FileTooSmall) {
  expect_open_error(save_truncated(0), "header", "file too small: 0 bytes");
  expect_open_error(save_truncated(23), "header", "file too small: 23 bytes");
}

TEST_F(MalformedGguf, BadMagic) {
  bytes_[3] = 'X';
  expect_open_error(save_patched(), "magic", "expected \"GGUF\", found \"GGUX\"");
}

TEST_F(MalformedGguf, UnsupportedVersion) {
  for (uint32_t version : {0u, 1u, 4u, 0x7FFFFFFFu}) {
    poke<uint32_t>(bytes_, 4, version);
    expect_open_error(save_patched(), "version", "unsupported version " + std::to_string(version));
  }
}

TEST_F(MalformedGguf, VersionIsBigEndian) {
  poke<uint32_t>(bytes_, 4, 0x03000000u);
  expect_open_error(save_patched(), "version", "big-endian");
}

TEST_F(MalformedGguf, VersionTwoIsAccepted) {
  poke<uint32_t>(bytes_, 4, 2);
  EXPECT_EQ(File::open(save_patched())->version(), 2u);
}

TEST_F(MalformedGguf, TensorCountCannotFit) {
  for (uint64_t n : {uint64_t{1} << 40, std::numeric_limits<uint64_t>::max()}) {
    poke<uint64_t>(bytes_, 8, n);
    expect_open_error(save_patched(), "n_tensors", "cannot fit in the");
  }
}

TEST_F(MalformedGguf, KeyCountCannotFit) {
  for (uint64_t n : {uint64_t{1} << 40, std::numeric_limits<uint64_t>::max()}) {
    poke<uint64_t>(bytes_, 16, n);
    expect_open_error(save_patched(), "n_kv", "cannot fit in the");
  }
}

TEST_F(MalformedGguf, StringLengthCannotFit) {
  poke<uint64_t>(bytes_, value_at("general.architecture"), uint64_t{1} << 62);
  expect_open_error(save_patched(), "general.architecture", "string length 4611686018427387904 exceeds the");
}

TEST_F(MalformedGguf, KeyLengthCannotFit) {
  poke<uint64_t>(bytes_, key_at("general.architecture") - 8, std::numeric_limits<uint64_t>::max());
  expect_open_error(save_patched(), "key #0", "string length 18446744073709551615 exceeds the");
}

TEST_F(MalformedGguf, EmptyKey) {
  poke<uint64_t>(bytes_, key_at("general.architecture") - 8, 0);
  expect_open_error(save_patched(), "key #0", "empty key");
}

TEST_F(MalformedGguf, ArrayLengthCannotFit) {
  poke<uint64_t>(bytes_, array_count_at("test.ints"), uint64_t{1} << 61);
  expect_open_error(save_patched(), "test.ints", "2305843009213693952 array elements of type int32 cannot fit");
}

TEST_F(MalformedGguf, StringArrayLengthCannotFit) {
  poke<uint64_t>(bytes_, array_count_at("test.strings"), std::numeric_limits<uint64_t>::max());
  expect_open_error(save_patched(), "test.strings", "array elements of type string cannot fit");
}

TEST_F(MalformedGguf, StringInArrayCannotFit) {
  const size_t alpha = find_unique(bytes_, "alpha");
  poke<uint64_t>(bytes_, alpha - 8, uint64_t{1} << 50);
  expect_open_error(save_patched(), "test.strings[0]", "string length");
}

TEST_F(MalformedGguf, UnknownValueType) {
  poke<uint32_t>(bytes_, value_type_at("test.count"), 13);
  expect_open_error(save_patched(), "test.count", "unknown value type 13");
}

TEST_F(MalformedGguf, UnknownArrayElementType) {
  poke<uint32_t>(bytes_, value_at("test.ints"), 0xFFFFFFFFu);
  expect_open_error(save_patched(), "test.ints", "unknown array element type 4294967295");
}

TEST_F(MalformedGguf, NestedArray) {
  poke<uint32_t>(bytes_, value_at("test.ints"), static_cast<uint32_t>(ValueType::ARRAY));
  expect_open_error(save_patched(), "test.ints", "nested arrays are not supported");
}

TEST_F(MalformedGguf, ControlCharactersInNamesAreEscaped) {
  // Keys are arbitrary bytes; a newline in one must not split the one-line message.
  poke<uint32_t>(bytes_, value_type_at("test.count"), 13);
  bytes_[key_at("test.count") + 9] = '\n';
  expect_open_error(save_patched(), "test.coun\\x0a", "unknown value type 13");
}

TEST_F(MalformedGguf, DuplicateKey) {
  bytes_[key_at("test.key2") + 8] = '1';  // "test.key2" -> "test.key1"
  expect_open_error(save_patched(), "test.key1", "duplicate key");
}

TEST_F(MalformedGguf, TruncatedInString) {
  expect_open_error(save_truncated(value_at("test.name") + 8 + 2), "test.name",
                    "string length 14 exceeds the 2 bytes left");
}

TEST_F(MalformedGguf, TruncatedInScalar) {
  expect_open_error(save_truncated(value_at("test.count") + 2), "test.count", "truncated");
}

TEST_F(MalformedGguf, TruncatedInArray) {
  // Cut inside the int32 elements: the element count no longer fits the bytes left.
  expect_open_error(save_truncated(array_count_at("test.ints") + 8 + 6), "test.ints",
                    "3 array elements of type int32 cannot fit in the 6 bytes left");
}

TEST_F(MalformedGguf, TruncatedInStringArray) {
  expect_open_error(save_truncated(find_unique(bytes_, "beta") + 2), "test.strings[1]",
                    "string length 4 exceeds the 2 bytes left");
}

TEST_F(MalformedGguf, TruncatedInTensorInfo) {
  expect_open_error(save_truncated(ne_at("weight.two", 1) + 3), "tensor weight.two", "truncated");
}

TEST_F(MalformedGguf, TruncatedBeforeDataSection) {
  ASSERT_NE(header_end() % 32, 0u) << "the fixture's tensor infos must end unaligned for this case";
  expect_open_error(save_truncated(header_end()), "data section", "past the end of the file");
}

TEST_F(MalformedGguf, TruncatedTensorData) {
  const size_t data_start = (header_end() + 31) / 32 * 32;
  expect_open_error(save_truncated(data_start + 64 + 10), "tensor weight.two", "runs past the end of the file");
}

TEST_F(MalformedGguf, UnknownTensorType) {
  for (uint32_t id : {4u, 99u}) {  // 4 is ggml's removed q4_2
    poke<uint32_t>(bytes_, tensor_type_at("weight.one"), id);
    expect_open_error(save_patched(), "tensor weight.one", "unknown tensor type id " + std::to_string(id));
  }
}

TEST_F(MalformedGguf, ZeroDims) {
  poke<uint32_t>(bytes_, n_dims_at("weight.one"), 0);
  expect_open_error(save_patched(), "tensor weight.one", "n_dims = 0 (must be 1..4)");
}

TEST_F(MalformedGguf, TooManyDims) {
  poke<uint32_t>(bytes_, n_dims_at("weight.one"), 5);
  expect_open_error(save_patched(), "tensor weight.one", "n_dims = 5 (must be 1..4)");
}

TEST_F(MalformedGguf, NonPositiveDim) {
  for (int64_t n : {int64_t{0}, int64_t{-3}}) {
    poke<int64_t>(bytes_, ne_at("weight.one", 1), n);
    expect_open_error(save_patched(), "tensor weight.one", "ne[1] = " + std::to_string(n));
  }
}

TEST_F(MalformedGguf, ElementCountOverflows) {
  poke<int64_t>(bytes_, ne_at("weight.one", 0), int64_t{1} << 40);
  poke<int64_t>(bytes_, ne_at("weight.one", 1), int64_t{1} << 40);
  expect_open_error(save_patched(), "tensor weight.one", "overflows int64");
}

TEST_F(MalformedGguf, SizeInBytesOverflows) {
  // 2^62 f64 elements are representable, their 2^65 bytes are not.
  poke<uint32_t>(bytes_, tensor_type_at("weight.one"), static_cast<uint32_t>(TensorType::F64));
  poke<int64_t>(bytes_, ne_at("weight.one", 0), int64_t{1} << 61);
  expect_open_error(save_patched(), "tensor weight.one", "size in bytes");
}

TEST_F(MalformedGguf, RowNotAMultipleOfTheBlockSize) {
  poke<int64_t>(bytes_, ne_at("weight.two", 0), 33);
  expect_open_error(save_patched(), "tensor weight.two", "ne[0] = 33 elements is not a multiple of the q8_0 block size 32");
}

TEST_F(MalformedGguf, OffsetNotAligned) {
  poke<uint64_t>(bytes_, tensor_offset_at("weight.two"), 65);
  expect_open_error(save_patched(), "tensor weight.two", "offset 65 is not a multiple of the alignment 32");
}

TEST_F(MalformedGguf, OffsetPlusSizeOverflows) {
  poke<uint64_t>(bytes_, tensor_offset_at("weight.two"), std::numeric_limits<uint64_t>::max() - 31);
  expect_open_error(save_patched(), "tensor weight.two", "overflows");
}

TEST_F(MalformedGguf, DataPastEndOfFile) {
  poke<uint64_t>(bytes_, tensor_offset_at("weight.two"), uint64_t{1} << 20);
  expect_open_error(save_patched(), "tensor weight.two", "runs past the end of the file");
}

TEST_F(MalformedGguf, OverlappingTensors) {
  poke<uint64_t>(bytes_, tensor_offset_at("weight.two"), 32);  // weight.one occupies [0, 64)
  expect_open_error(save_patched(), "tensor weight.two", "overlaps tensor weight.one [0, 64)");
}

TEST_F(MalformedGguf, DuplicateTensorName) {
  const size_t name = find_unique(bytes_, "weight.two");
  std::memcpy(bytes_.data() + name, "weight.one", 10);
  expect_open_error(save_patched(), "tensor weight.one", "duplicate tensor name (also tensor #0)");
}

TEST_F(MalformedGguf, EmptyTensorName) {
  const size_t name = find_unique(bytes_, "weight.one");
  poke<uint64_t>(bytes_, name - 8, 0);
  expect_open_error(save_patched(), "tensor #0", "empty tensor name");
}

TEST_F(MalformedGguf, AlignmentNotAPowerOfTwo) {
  Writer writer;
  writer.set_string("general.architecture", "test");
  writer.write(dir_.file("aligned.gguf"), 64);
  bytes_ = read_bytes(dir_.file("aligned.gguf"));
  for (uint32_t alignment : {0u, 48u}) {
    poke<uint32_t>(bytes_, value_at("general.alignment"), alignment);
    expect_open_error(save_patched(), "general.alignment", std::to_string(alignment) + " is not a power of two");
  }
}

TEST_F(MalformedGguf, AlignmentWrongType) {
  Writer writer;
  writer.write(dir_.file("aligned.gguf"), 64);
  bytes_ = read_bytes(dir_.file("aligned.gguf"));
  poke<uint32_t>(bytes_, value_type_at("general.alignment"), static_cast<uint32_t>(ValueType::INT32));
  expect_open_error(save_patched(), "general.alignment", "expected uint32, found int32");
}

TEST_F(MalformedGguf, GarbageAfterEveryTruncationPointNeverCrashes) {
  // Every prefix of the good file is either rejected with an Error or (past the last tensor) accepted.
  const size_t data_start = (header_end() + 31) / 32 * 32;
  for (size_t size = 0; size < bytes_.size(); ++size) {
    const std::string path = save_truncated(size);
    try {
      File::open(path);
      EXPECT_GE(size, data_start + 64 + 68) << "accepted a file cut at " << size;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
    }
    std::filesystem::remove(path);
  }
}

TEST_F(MalformedGguf, RandomCorruptionNeverCrashes) {
  // Overwrite a few random header bytes with random or extreme values: every result must be a clean open or
  // an Error naming the file (run under ASan/UBSan to also catch out-of-bounds reads).
  std::mt19937 rng(1234);
  const std::string path = dir_.file("corrupt.gguf");
  const size_t header = header_end();
  const uint8_t extremes[] = {0x00, 0x01, 0x7F, 0x80, 0xFF};
  for (int iteration = 0; iteration < 300; ++iteration) {
    std::vector<uint8_t> bytes = bytes_;
    const int n_changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < n_changes; ++c) {
      const uint32_t r = rng();
      bytes[rng() % header] = (r & 1) ? static_cast<uint8_t>(r >> 8) : extremes[(r >> 8) % 5];
    }
    write_bytes(path, bytes);
    try {
      File::open(path);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
    }
  }
}

}  // namespace
}  // namespace sparrow::gguf
