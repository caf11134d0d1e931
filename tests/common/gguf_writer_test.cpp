// common/formats/ggml_types.h encoders and common/formats/gguf_writer.h's checks and failure handling. The
// file layout itself is checked end to end by tests/trainer/gguf_export_test.cpp with an independent reader.
#include "common/formats/gguf_writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/formats/safetensors.h"
#include "tests/util/temp_dir.h"

namespace sftctl::gguf {
namespace {

namespace fs = std::filesystem;

int8_t Q(const std::string& block, int i) { return static_cast<int8_t>(block[2 + i]); }

TEST(GgmlTypes, Q8_0ScaleIsMaxOver127AndRoundsHalfAwayFromZero) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // d = 1 exactly
  x[1] = -63.5f;  // -63.5 -> -64
  x[2] = 2.5f;    // 2.5 -> 3
  x[3] = -0.49f;  // -> 0
  std::string out;
  AppendEncoded(TensorType::kQ8_0, x.data(), 32, &out);
  ASSERT_EQ(out.size(), 34u);
  EXPECT_EQ(static_cast<uint8_t>(out[0]) | (static_cast<uint8_t>(out[1]) << 8), 0x3C00);  // fp16 1.0
  EXPECT_EQ(Q(out, 0), 127);
  EXPECT_EQ(Q(out, 1), -64);
  EXPECT_EQ(Q(out, 2), 3);
  EXPECT_EQ(Q(out, 3), 0);
  EXPECT_EQ(Q(out, 31), 0);
}

TEST(GgmlTypes, Q8_0ReadsBackWithinHalfTheStoredScale) {
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.37f * static_cast<float>(i)) * (i < 32 ? 0.013f : 3.1f);
  std::string out;
  AppendEncoded(TensorType::kQ8_0, x.data(), 64, &out);
  ASSERT_EQ(out.size(), 68u);
  for (int b = 0; b < 2; ++b) {
    const std::string block = out.substr(34 * b, 34);
    const float d = safetensors::HalfToFloat(
        static_cast<uint16_t>(static_cast<uint8_t>(block[0]) | (static_cast<uint8_t>(block[1]) << 8)));
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    EXPECT_NEAR(d, amax / 127, amax / 127 / 1024) << "block " << b;
    for (int i = 0; i < 32; ++i)
      EXPECT_LE(std::fabs(x[32 * b + i] - Q(block, i) * d), d / 2) << b << "," << i;
  }
  std::vector<float> zeros(32, 0.0f);
  std::string z;
  AppendEncoded(TensorType::kQ8_0, zeros.data(), 32, &z);
  EXPECT_EQ(z, std::string(34, '\0'));
}

TEST(GgmlTypes, SizesAndLittleEndianHalves) {
  EXPECT_EQ(TensorBytes(TensorType::kF32, {3, 5}), 60u);
  EXPECT_EQ(TensorBytes(TensorType::kF16, {3, 5}), 30u);
  EXPECT_EQ(TensorBytes(TensorType::kQ8_0, {3, 64}), 3u * 2 * 34);
  const float v[2] = {1.0f, -2.0f};
  std::string out;
  AppendEncoded(TensorType::kF16, v, 2, &out);
  EXPECT_EQ(out, std::string("\x00\x3C\x00\xC0", 4));
  out.clear();
  AppendEncoded(TensorType::kF32, v, 1, &out);
  EXPECT_EQ(out, std::string("\x00\x00\x80\x3F", 4));
}

TEST(GgufWriter, RefusesBadTensors) {
  GgufWriter w;
  auto none = [](std::string*) { return OkStatus(); };
  EXPECT_EQ(w.AddTensor("a", {2, 40}, TensorType::kQ8_0, none).message(),
            "GGUF tensor 'a': Q8_0 needs rows of a multiple of 32 values, not 40");
  ASSERT_TRUE(w.AddTensor("a", {2, 64}, TensorType::kQ8_0, none).ok());
  EXPECT_EQ(w.AddTensor("a", {2}, TensorType::kF32, none).message(), "GGUF tensor 'a' is added twice");
  EXPECT_EQ(w.AddTensor(std::string(64, 'n'), {2}, TensorType::kF32, none).message(),
            "GGUF tensor name '" + std::string(64, 'n') + "' must have 1 to 63 characters");
  EXPECT_EQ(w.AddTensor("b", {2, 0}, TensorType::kF32, none).message(),
            "GGUF tensor 'b' has a dimension of size <= 0");
}

TEST(GgufWriter, FailedProducerLeavesNoFile) {
  sftctl::testing::TempDir dir("gguf-writer");
  const std::string path = dir.path() + "/m.gguf";
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  ASSERT_TRUE(w.AddTensor("x", {4}, TensorType::kF32, [](std::string* out) {
                 out->assign(12, '\0');  // one value short
                 return OkStatus();
               }).ok());
  Status s = w.Write(FileSystem::Default(), path);
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "GGUF tensor 'x': produced 12 bytes, expected 16");
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp-gguf"));
}

TEST(GgufWriter, HeaderAndAlignedData) {
  sftctl::testing::TempDir dir("gguf-writer");
  const std::string path = dir.path() + "/m.gguf";
  GgufWriter w;
  const float v[3] = {1, 2, 3};
  ASSERT_TRUE(w.AddTensor("x", {3}, TensorType::kF32, [&](std::string* out) {
                 AppendEncoded(TensorType::kF32, v, 3, out);
                 return OkStatus();
               }).ok());
  ASSERT_TRUE(w.Write(FileSystem::Default(), path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GE(file.size(), 24u);
  EXPECT_EQ(file.substr(0, 8), std::string("GGUF\x03\x00\x00\x00", 8));
  EXPECT_EQ(file.substr(8, 8), std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8));   // 1 tensor
  EXPECT_EQ(file.substr(16, 8), std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8));  // general.alignment
  EXPECT_EQ(file.size() % kAlignment, 0u);
  EXPECT_EQ(file.substr(file.size() - 32, 12),
            std::string("\x00\x00\x80\x3F\x00\x00\x00\x40\x00\x00\x40\x40", 12));
}

}  // namespace
}  // namespace sftctl::gguf
