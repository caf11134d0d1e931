#include "common/formats/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/os/file_system.h"
#include "common/status.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace safetensors {
namespace {

using ::sftctl::testing::StatusIs;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- helpers ------------------------------------------------------------------------------

std::string Le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Records every call, and can fail the n-th Append (1-based).
struct FileLog {
  std::vector<std::string> calls;  // "append:<size>", "sync", "close"
  std::string content;
  int fail_append_at = 0;
};

class LoggingFile : public WritableFile {
 public:
  explicit LoggingFile(FileLog* log) : log_(log) {}
  Status Append(std::string_view data) override {
    log_->calls.push_back("append:" + std::to_string(data.size()));
    if (static_cast<int>(log_->calls.size()) == log_->fail_append_at) {
      return Status(StatusCode::kResourceExhausted, "injected: disk full");
    }
    log_->content.append(data);
    return OkStatus();
  }
  Status Sync() override {
    log_->calls.push_back("sync");
    return OkStatus();
  }
  Status Close() override {
    log_->calls.push_back("close");
    return OkStatus();
  }

 private:
  FileLog* log_;
};

// In-memory FileSystem supporting NewWritableFile only.
class LoggingFileSystem : public FileSystem {
 public:
  FileLog log;
  int files_created = 0;
  StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    ++files_created;
    return std::unique_ptr<WritableFile>(new LoggingFile(&log));
  }
  StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string&) override {
    return UnimplementedError("NewAppendableFile");
  }
  StatusOr<std::string> ReadFile(const std::string&) override { return UnimplementedError("ReadFile"); }
  bool Exists(const std::string&) override { return false; }
  bool IsDirectory(const std::string&) override { return false; }
  Status CreateDirs(const std::string&) override { return UnimplementedError("CreateDirs"); }
  StatusOr<std::vector<std::string>> ListDir(const std::string&) override {
    return UnimplementedError("ListDir");
  }
  Status Rename(const std::string&, const std::string&) override { return UnimplementedError("Rename"); }
  Status RemoveAll(const std::string&) override { return UnimplementedError("RemoveAll"); }
  Status SyncDir(const std::string&) override { return UnimplementedError("SyncDir"); }
};

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::sftctl::testing::MakeTempDir("safetensors");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { ASSERT_TRUE(FileSystem::Default()->RemoveAll(dir_).ok()); }

  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }

  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    const std::string path = Path(name);
    EXPECT_TRUE(WriteFileAtomic(FileSystem::Default(), path, bytes).ok());
    return path;
  }

  std::string ReadRaw(const std::string& path) {
    StatusOr<std::string> s = FileSystem::Default()->ReadFile(path);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : std::string();
  }

  // Writes 8-byte length + header + data and opens it; returns the error of Open.
  Status OpenCrafted(const std::string& header, const std::string& data) {
    const std::string path = WriteRaw("crafted.safetensors", Le64(header.size()) + header + data);
    StatusOr<std::unique_ptr<Reader>> r = Reader::Open(path);
    return r.status();
  }

  // Asserts `s` is DATA_LOSS and names the crafted file and `substr`.
  void ExpectCorrupt(const Status& s, const std::string& substr) {
    EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss, HasSubstr(substr)));
    EXPECT_THAT(s.message(), HasSubstr(Path("crafted.safetensors")));
  }

  std::string dir_;
};

// ---- dtypes -------------------------------------------------------------------------------

TEST(DTypeTest, NamesSizesAndParse) {
  const std::vector<std::tuple<DType, const char*, size_t>> cases = {
      {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4},  {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
      {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},  {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},
      {DType::kU8, "U8", 1},   {DType::kBool, "BOOL", 1}};
  for (const auto& [dtype, name, size] : cases) {
    EXPECT_STREQ(DTypeName(dtype), name);
    EXPECT_EQ(DTypeSize(dtype), size) << name;
    StatusOr<DType> parsed = ParseDType(name);
    ASSERT_TRUE(parsed.ok()) << name;
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DTypeTest, ParseUnknown) {
  for (const char* bad : {"f32", "F8_E4M3", "U32", ""}) {
    StatusOr<DType> parsed = ParseDType(bad);
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(parsed, StatusIs(StatusCode::kInvalidArgument, HasSubstr(std::string("'") + bad + "'")));
  }
}

TEST(TensorInfoTest, Numel) {
  TensorInfo t;
  EXPECT_EQ(t.numel(), 1);  // scalar
  t.shape = {2, 3, 4};
  EXPECT_EQ(t.numel(), 24);
  t.shape = {5, 0};
  EXPECT_EQ(t.numel(), 0);
}

// ---- round trips --------------------------------------------------------------------------

TEST_F(SafetensorsTest, RoundTripManyDtypes) {
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, -0.0f, 1e30f};
  const std::vector<uint16_t> bf16 = {FloatToBF16(1.0f), FloatToBF16(-3.5f), FloatToBF16(0.1f)};
  const std::vector<uint16_t> f16 = {FloatToHalf(1.0f), FloatToHalf(65504.0f), FloatToHalf(-0.5f),
                                     FloatToHalf(1e-7f)};
  const std::vector<uint8_t> u8 = {0, 1, 127, 128, 255};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), -1, 0,
                                    std::numeric_limits<int64_t>::max()};
  const std::vector<float> scalar = {42.0f};
  const std::vector<TensorRef> refs = {
      {"model.f32", DType::kF32, {2, 3}, f32.data(), f32.size() * 4},
      {"model.bf16", DType::kBF16, {3}, bf16.data(), bf16.size() * 2},
      {"model.f16", DType::kF16, {2, 2}, f16.data(), f16.size() * 2},
      {"model.u8", DType::kU8, {5}, u8.data(), u8.size()},
      {"model.i64", DType::kI64, {4, 1}, i64.data(), i64.size() * 8},
      {"scalar", DType::kF32, {}, scalar.data(), 4},
      {"empty", DType::kF32, {0, 4}, nullptr, 0},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "h\xC3\xA9llo \"quoted\"\n"}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(Write(FileSystem::Default(), path, refs, metadata).ok());

  StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  const Reader& r = **reader;
  EXPECT_EQ(r.path(), path);
  EXPECT_EQ(r.metadata(), metadata);

  std::vector<std::string> names;
  for (const TensorInfo& t : r.tensors()) names.push_back(t.name);
  EXPECT_THAT(
      names, ElementsAre("empty", "model.bf16", "model.f16", "model.f32", "model.i64", "model.u8", "scalar"));

  for (const TensorRef& ref : refs) {
    SCOPED_TRACE(ref.name);
    const TensorInfo* t = r.Find(ref.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->name, ref.name);
    EXPECT_EQ(t->dtype, ref.dtype);
    EXPECT_EQ(t->shape, ref.shape);
    EXPECT_EQ(t->nbytes(), ref.nbytes);
    EXPECT_EQ(static_cast<size_t>(t->numel()) * DTypeSize(t->dtype), ref.nbytes);
    if (ref.nbytes > 0) {
      EXPECT_EQ(std::memcmp(r.data(*t), ref.data, ref.nbytes), 0);
    }
    // Our writer keeps every tensor naturally aligned (mmap is page-aligned).
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data(*t)) % DTypeSize(t->dtype), 0u);
  }
  EXPECT_EQ(r.Find("scalar")->numel(), 1);
  EXPECT_EQ(r.Find("empty")->numel(), 0);
  EXPECT_EQ(r.Find("missing"), nullptr);
  EXPECT_EQ(r.Find(""), nullptr);
  EXPECT_EQ(r.Find("model"), nullptr);
}

TEST_F(SafetensorsTest, EmptyFileRoundTrip) {
  const std::string path = Path("empty.safetensors");
  ASSERT_TRUE(Write(FileSystem::Default(), path, {}, {}).ok());
  EXPECT_EQ(ReadRaw(path), Le64(8) + "{}      ");
  StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_TRUE((*reader)->tensors().empty());
  EXPECT_TRUE((*reader)->metadata().empty());
}

TEST_F(SafetensorsTest, HeaderIsPaddedWithSpacesToMultipleOf8) {
  const std::vector<uint8_t> byte = {7};
  std::string name;
  for (int len = 1; len <= 9; ++len) {
    name += 'a';
    SCOPED_TRACE(name);
    const std::string path = Path("pad.safetensors");
    ASSERT_TRUE(Write(FileSystem::Default(), path, {{name, DType::kU8, {1}, byte.data(), 1}}, {}).ok());
    const std::string raw = ReadRaw(path);
    ASSERT_GE(raw.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
    EXPECT_EQ(n % 8, 0u);
    ASSERT_EQ(raw.size(), 8 + n + 1);
    const std::string header = raw.substr(8, n);
    const std::string json = "{\"" + name + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    EXPECT_EQ(header, json + std::string(n - json.size(), ' '));
    EXPECT_LT(n - json.size(), 8u);
    EXPECT_EQ(raw.back(), 7);
  }
}

// The byte layout the reference Python library produces for
// save_file({"x": torch.tensor([1.0, -2.0])}, metadata={"format": "pt"}).
TEST_F(SafetensorsTest, ExactBytesMatchReferenceLayout) {
  const std::vector<float> x = {1.0f, -2.0f};
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(
      Write(FileSystem::Default(), path, {{"x", DType::kF32, {2}, x.data(), 8}}, {{"format", "pt"}}).ok());
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 85u);
  const std::string expected = std::string("\x58\0\0\0\0\0\0\0", 8) + header + "   " +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  EXPECT_EQ(ReadRaw(path), expected);

  // A BF16 scalar without metadata: no "__metadata__" key at all.
  const uint16_t one = FloatToBF16(1.0f);
  ASSERT_TRUE(Write(FileSystem::Default(), path, {{"t", DType::kBF16, {}, &one, 2}}, {}).ok());
  EXPECT_EQ(ReadRaw(path), std::string("\x38\0\0\0\0\0\0\0", 8) +
                               R"({"t":{"dtype":"BF16","shape":[],"data_offsets":[0,2]}})" + "  " +
                               std::string("\x80\x3f", 2));
}

TEST_F(SafetensorsTest, MetadataIsFirstEvenWhenNamesSortBeforeIt) {
  const std::vector<uint8_t> byte = {1, 2};
  const std::string path = Path("m.safetensors");
  ASSERT_TRUE(Write(FileSystem::Default(), path,
                    {{"b", DType::kU8, {1}, &byte[1], 1}, {"A", DType::kU8, {1}, &byte[0], 1}}, {{"k", "v"}})
                  .ok());
  const std::string raw = ReadRaw(path);
  const std::string prefix = R"({"__metadata__":{"k":"v"},"A":{"dtype":"U8")";
  EXPECT_EQ(raw.substr(8, prefix.size()), prefix);
  StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ((*reader)->data(*(*reader)->Find("A"))[0], 1);
  EXPECT_EQ((*reader)->data(*(*reader)->Find("b"))[0], 2);
}

TEST_F(SafetensorsTest, DataOrderedByElementSizeThenName) {
  const std::vector<uint8_t> u8 = {1, 2, 3};
  const float f32 = 1.0f;
  const uint16_t bf16 = 0x3F80;
  const double f64 = 2.0;
  const std::string path = Path("order.safetensors");
  ASSERT_TRUE(Write(FileSystem::Default(), path,
                    {{"a", DType::kU8, {3}, u8.data(), 3},
                     {"b", DType::kBF16, {1}, &bf16, 2},
                     {"c", DType::kF32, {1}, &f32, 4},
                     {"d", DType::kF64, {}, &f64, 8},
                     {"e", DType::kF32, {1}, &f32, 4}},
                    {})
                  .ok());
  StatusOr<std::unique_ptr<Reader>> reader = Reader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto range = [&](const char* n) {
    const TensorInfo* t = (*reader)->Find(n);
    return std::make_pair(t->begin, t->end);
  };
  EXPECT_EQ(range("d"), std::make_pair(uint64_t{0}, uint64_t{8}));
  EXPECT_EQ(range("c"), std::make_pair(uint64_t{8}, uint64_t{12}));
  EXPECT_EQ(range("e"), std::make_pair(uint64_t{12}, uint64_t{16}));
  EXPECT_EQ(range("b"), std::make_pair(uint64_t{16}, uint64_t{18}));
  EXPECT_EQ(range("a"), std::make_pair(uint64_t{18}, uint64_t{21}));
}

TEST_F(SafetensorsTest, WriteStreamsOneAppendPerTensorThenSyncsAndCloses) {
  std::vector<float> big(1000, 1.0f);
  const std::vector<uint8_t> small = {1, 2, 3};
  LoggingFileSystem fs;
  ASSERT_TRUE(Write(&fs, "mem",
                    {{"big", DType::kF32, {1000}, big.data(), 4000},
                     {"empty", DType::kI8, {0}, nullptr, 0},
                     {"small", DType::kU8, {3}, small.data(), 3}},
                    {})
                  .ok());
  ASSERT_EQ(fs.log.calls.size(), 5u);
  EXPECT_THAT(fs.log.calls[0], HasSubstr("append:"));  // length prefix + header
  EXPECT_EQ(fs.log.calls[1], "append:4000");
  EXPECT_EQ(fs.log.calls[2], "append:3");
  EXPECT_EQ(fs.log.calls[3], "sync");
  EXPECT_EQ(fs.log.calls[4], "close");
  // The same bytes as the POSIX file system produces.
  const std::string path = Path("same.safetensors");
  ASSERT_TRUE(Write(FileSystem::Default(), path,
                    {{"big", DType::kF32, {1000}, big.data(), 4000},
                     {"empty", DType::kI8, {0}, nullptr, 0},
                     {"small", DType::kU8, {3}, small.data(), 3}},
                    {})
                  .ok());
  EXPECT_EQ(ReadRaw(path), fs.log.content);
}

TEST_F(SafetensorsTest, WritePropagatesIoErrors) {
  const std::vector<float> v = {1.0f};
  LoggingFileSystem fs;
  fs.log.fail_append_at = 2;  // the first tensor's bytes
  Status s = Write(&fs, "mem", {{"v", DType::kF32, {1}, v.data(), 4}}, {});
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, "injected: disk full"));

  s = Write(FileSystem::Default(), Path("no/such/dir/x.safetensors"), {{"v", DType::kF32, {1}, v.data(), 4}},
            {});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

TEST_F(SafetensorsTest, WriteRejectsBadArgumentsBeforeCreatingTheFile) {
  const std::vector<float> v = {1.0f, 2.0f};
  struct Case {
    std::vector<TensorRef> refs;
    std::map<std::string, std::string> metadata;
    std::string substr;
  };
  const std::vector<Case> cases = {
      {{{"w", DType::kF32, {2}, v.data(), 4}}, {}, "tensor 'w': nbytes 4 != 8"},
      {{{"w", DType::kBF16, {2}, v.data(), 8}}, {}, "tensor 'w': nbytes 8 != 4"},
      {{{"w", DType::kF32, {2}, v.data(), 8}, {"w", DType::kF32, {2}, v.data(), 8}},
       {},
       "tensor 'w': duplicate"},
      {{{"__metadata__", DType::kF32, {2}, v.data(), 8}}, {}, "tensor '__metadata__': the name is reserved"},
      {{{"", DType::kF32, {2}, v.data(), 8}}, {}, "tensor name is empty"},
      {{{"neg", DType::kF32, {-1, -2}, v.data(), 8}}, {}, "tensor 'neg': negative dimension"},
      {{{"null", DType::kF32, {2}, nullptr, 8}}, {}, "tensor 'null': data is null"},
      {{{"huge", DType::kF32, {1LL << 40, 1LL << 40}, v.data(), 8}}, {}, "tensor 'huge': shape"},
      {{{"bad\xFF", DType::kF32, {2}, v.data(), 8}}, {}, "not valid UTF-8"},
      {{{"w", DType::kF32, {2}, v.data(), 8}}, {{"k", "\xC3"}}, "not valid UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.substr);
    LoggingFileSystem fs;
    Status s = Write(&fs, "mem.safetensors", c.refs, c.metadata);
    EXPECT_THAT(s, StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.substr)));
    EXPECT_THAT(s.message(), HasSubstr("mem.safetensors"));
    EXPECT_EQ(fs.files_created, 0);
  }
}

// ---- reader validation --------------------------------------------------------------------

TEST_F(SafetensorsTest, AcceptsValidCraftedFiles) {
  // Trailing spaces, null metadata, unknown extra fields, and empty tensors sharing offsets.
  EXPECT_TRUE(OpenCrafted(R"({"__metadata__":null})", "").ok());
  EXPECT_TRUE(OpenCrafted("  {}  \n", "").ok());
  const std::string header = R"({"z":{"dtype":"I8","shape":[0],"data_offsets":[0,0]},)"
                             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"extra":1},)"
                             R"("e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},)"
                             R"("a":{"dtype":"BOOL","shape":[2],"data_offsets":[4,6]}})";
  Status s = OpenCrafted(header, "abcdef");
  EXPECT_TRUE(s.ok()) << s.ToString();
  StatusOr<std::unique_ptr<Reader>> r = Reader::Open(Path("crafted.safetensors"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ((*r)->tensors().size(), 4u);
  EXPECT_EQ((*r)->tensors()[0].name, "a");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*r)->data(*(*r)->Find("a"))), 2), "ef");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>((*r)->data(*(*r)->Find("b"))), 4), "abcd");
}

TEST_F(SafetensorsTest, RejectsTruncatedFiles) {
  ExpectCorrupt(Reader::Open(WriteRaw("crafted.safetensors", "")).status(), "truncated: 0 bytes");
  ExpectCorrupt(Reader::Open(WriteRaw("crafted.safetensors", std::string("\x02\0\0\0\0\0\0", 7))).status(),
                "truncated: 7 bytes");
  ExpectCorrupt(Reader::Open(WriteRaw("crafted.safetensors", Le64(100) + "{}")).status(),
                "truncated: header length 100 exceeds the 2 bytes");
  // A valid file cut short in its data section.
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"),
                "out of range");
}

TEST_F(SafetensorsTest, RejectsHugeHeader) {
  ExpectCorrupt(Reader::Open(WriteRaw("crafted.safetensors", Le64(100'000'001) + "{}")).status(),
                "header too large: 100000001 bytes");
  ExpectCorrupt(Reader::Open(WriteRaw("crafted.safetensors", Le64(~uint64_t{0}) + "{}")).status(),
                "header too large");
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  ExpectCorrupt(OpenCrafted(R"({"a":)", ""), "header is not valid JSON");
  ExpectCorrupt(OpenCrafted("", ""), "header is not valid JSON");
  ExpectCorrupt(OpenCrafted(std::string("{}\0\0", 4), ""), "header is not valid JSON: NUL byte at offset 2");
  ExpectCorrupt(OpenCrafted(std::string("{}\0garbage", 10), ""), "NUL byte");
  ExpectCorrupt(OpenCrafted("{\"\xFF\":1}", ""), "header is not valid JSON");
  ExpectCorrupt(OpenCrafted(std::string(1000, '[') + std::string(1000, ']'), ""), "nested deeper");
}

TEST_F(SafetensorsTest, RejectsNonObjectHeader) {
  ExpectCorrupt(OpenCrafted("[1,2]", ""), "header is not a JSON object");
  ExpectCorrupt(OpenCrafted("\"x\"", ""), "header is not a JSON object");
  ExpectCorrupt(OpenCrafted(R"({"a":[1]})", ""), "tensor 'a': entry is not a JSON object");
}

TEST_F(SafetensorsTest, RejectsBadTensorEntries) {
  struct Case {
    std::string header;
    std::string data;
    std::string substr;
  };
  const std::vector<Case> cases = {
      {R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "x",
       "tensor 'w': unknown dtype 'F8_E4M3'"},
      {R"({"w":{"dtype":3,"shape":[1],"data_offsets":[0,1]}})", "x", "tensor 'w': \"dtype\" is not a string"},
      {R"({"w":{"shape":[1],"data_offsets":[0,1]}})", "x", "tensor 'w': missing \"dtype\""},
      {R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", "x", "tensor 'w': missing \"shape\""},
      {R"({"w":{"dtype":"U8","shape":[1]}})", "x", "tensor 'w': missing \"data_offsets\""},
      {R"({"w":{"dtype":"U8","shape":[2,-2],"data_offsets":[0,0]}})", "",
       "tensor 'w': negative dimension -2"},
      {R"({"w":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}})", "x",
       "tensor 'w': \"shape\" must be an array"},
      {R"({"w":{"dtype":"U8","shape":1,"data_offsets":[0,1]}})", "x",
       "tensor 'w': \"shape\" is not an array"},
      {R"({"w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]}})", "x", "is too large"},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,1]}})", "x",
       "overflows int64"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,0]}})", "x",
       "tensor 'w': data_offsets [1, 0] has begin > end"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "x",
       "tensor 'w': \"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}})", "x",
       "\"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}})", "x",
       "\"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":"0,1"}})", "x",
       "\"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,2]}})", "x",
       "tensor 'w': data_offsets [0, 2] out of range: the data section has 1 bytes"},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234",
       "tensor 'w': byte length 4 of data_offsets [0, 4] does not match shape [2] and dtype F32"},
      {R"({"w":{"dtype":"BF16","shape":[],"data_offsets":[0,4]}})", "1234",
       "does not match shape [] and dtype BF16"},
      {R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", "12345678",
       "does not match"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    ExpectCorrupt(OpenCrafted(c.header, c.data), c.substr);
  }
}

TEST_F(SafetensorsTest, RejectsOverlapsGapsAndUncoveredData) {
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            "123456789012"),
                "tensor 'b': data_offsets [4, 12] overlap tensor 'a'");
  // Two tensors on the very same bytes.
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                            "1234"),
                "tensor 'b': data_offsets [0, 4] overlap tensor 'a'");
  // An empty tensor placed inside another one.
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
                            "1234"),
                "tensor 'e': data_offsets [2, 2] overlap tensor 'a'");
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                            "123456789012"),
                "tensor 'b': gap in the data section: bytes [4, 8)");
  ExpectCorrupt(OpenCrafted(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678"),
                "tensor 'b': gap in the data section: bytes [0, 4)");
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "12345678"),
                "data section not fully covered: bytes [4, 8) belong to no tensor");
  ExpectCorrupt(OpenCrafted("{}", "x"), "data section not fully covered: bytes [0, 1)");
}

TEST_F(SafetensorsTest, RejectsDuplicateKeys) {
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                            "x"),
                "duplicate key 'a' in header");
  ExpectCorrupt(OpenCrafted(R"({"a":{"dtype":"U8","dtype":"I8","shape":[1],"data_offsets":[0,1]}})", "x"),
                "tensor 'a': duplicate key 'dtype'");
  ExpectCorrupt(OpenCrafted(R"({"__metadata__":{"format":"pt","format":"np"}})", ""),
                "duplicate key 'format' in __metadata__");
  ExpectCorrupt(OpenCrafted(R"({"__metadata__":{},"__metadata__":{}})", ""), "duplicate key '__metadata__'");
  // The same key in sibling objects is fine.
  Status s = OpenCrafted(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                         R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                         "xy");
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(SafetensorsTest, RejectsBadMetadata) {
  ExpectCorrupt(OpenCrafted(R"({"__metadata__":{"format":1}})", ""),
                "__metadata__ value for key 'format' is not a string");
  ExpectCorrupt(OpenCrafted(R"({"__metadata__":{"a":"b","nested":{"x":"y"}}})", ""),
                "__metadata__ value for key 'nested' is not a string");
  ExpectCorrupt(OpenCrafted(R"({"__metadata__":["format","pt"]})", ""), "__metadata__ is not a JSON object");
}

TEST_F(SafetensorsTest, OpenReportsIoErrors) {
  StatusOr<std::unique_ptr<Reader>> r = Reader::Open(Path("missing.safetensors"));
  EXPECT_THAT(r, StatusIs(StatusCode::kNotFound, HasSubstr("missing.safetensors")));
  r = Reader::Open(dir_);
  EXPECT_THAT(r, StatusIs(StatusCode::kInvalidArgument, HasSubstr("not a regular file")));
}

TEST(ParseHeaderTest, UsesDataSizeAndPathForErrors) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  StatusOr<Header> h = Reader::ParseHeader(header, 6, "some/path");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->tensors.size(), 1u);
  EXPECT_EQ(h->tensors[0].name, "w");
  EXPECT_EQ(h->tensors[0].dtype, DType::kF16);
  EXPECT_EQ(h->tensors[0].shape, std::vector<int64_t>{3});
  EXPECT_EQ(h->tensors[0].begin, 0u);
  EXPECT_EQ(h->tensors[0].end, 6u);
  EXPECT_EQ(h->metadata.at("format"), "pt");

  h = Reader::ParseHeader(header, 5, "some/path");
  EXPECT_THAT(
      h, StatusIs(StatusCode::kDataLoss,
                  HasSubstr("safetensors file 'some/path': tensor 'w': data_offsets [0, 6] out of range")));
  h = Reader::ParseHeader(header, 7, "some/path");
  EXPECT_THAT(h, StatusIs(StatusCode::kDataLoss, HasSubstr("not fully covered")));
}

TEST_F(SafetensorsTest, ConcurrentReads) {
  std::vector<float> v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const std::string path = Path("c.safetensors");
  ASSERT_TRUE(
      Write(FileSystem::Default(), path, {{"v", DType::kF32, {4096}, v.data(), v.size() * 4}}, {}).ok());
  StatusOr<std::unique_ptr<Reader>> r = Reader::Open(path);
  ASSERT_TRUE(r.ok());
  const Reader* reader = r->get();
  std::vector<int> ok(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([reader, &v, &ok, t] {
      const TensorInfo* info = reader->Find("v");
      ok[t] = info != nullptr && std::memcmp(reader->data(*info), v.data(), v.size() * 4) == 0;
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_THAT(ok, ElementsAre(1, 1, 1, 1));
}

// ---- 16-bit float conversions -------------------------------------------------------------

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

TEST(BF16Test, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xC000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()), 0xFF80);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7F80);  // rounds up to inf
  // Ties go to even; anything above the tie rounds up.
  EXPECT_EQ(FloatToBF16(FromBits(0x3F808000)), 0x3F80);
  EXPECT_EQ(FloatToBF16(FromBits(0x3F818000)), 0x3F82);
  EXPECT_EQ(FloatToBF16(FromBits(0x3F808001)), 0x3F81);
  EXPECT_EQ(FloatToBF16(FromBits(0x3F807FFF)), 0x3F80);
  EXPECT_EQ(FloatToBF16(FromBits(0x00000001)), 0x0000);  // tiny subnormal
  // NaNs stay NaN, even those whose payload lives only in the dropped bits.
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu}) {
    const uint16_t b = FloatToBF16(FromBits(nan_bits));
    EXPECT_TRUE(std::isnan(BF16ToFloat(b))) << std::hex << nan_bits;
    EXPECT_EQ(b & 0x8000, (nan_bits >> 16) & 0x8000);
  }
}

TEST(BF16Test, AllValuesRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = BF16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(f))));
    } else {
      ASSERT_EQ(FloatToBF16(f), h) << std::hex << h;
    }
  }
  EXPECT_EQ(BF16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0xC0A0), -5.0f);
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(HalfToFloat(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7C01)));
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));

  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // the tie rounds to even, i.e. to inf
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xFC00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0001f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2 ulps -> 2
  EXPECT_EQ(FloatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(FloatToHalf(-1e-10f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);                   // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);               // tie -> even
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -30)), 0x0400);  // rounds up to min normal
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  for (uint32_t nan_bits : {0x7FC00000u, 0x7F800001u, 0xFF800001u}) {
    const uint16_t h = FloatToHalf(FromBits(nan_bits));
    EXPECT_TRUE(std::isnan(HalfToFloat(h))) << std::hex << nan_bits;
    EXPECT_EQ(h & 0x8000, (nan_bits >> 16) & 0x8000);
  }
}

TEST(HalfTest, AllValuesRoundTrip) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
    } else {
      ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    }
  }
}

#ifdef __FLT16_MANT_DIG__
// Cross-checks against the compiler's correctly rounded float -> _Float16 conversion.
TEST(HalfTest, MatchesCompilerFloat16) {
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 4093) {
    const float f = FromBits(static_cast<uint32_t>(bits));
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), ref_bits) << std::hex << bits;
    EXPECT_EQ(HalfToFloat(ref_bits), static_cast<float>(ref));
  }
}
#endif

}  // namespace
}  // namespace safetensors
}  // namespace sftctl
