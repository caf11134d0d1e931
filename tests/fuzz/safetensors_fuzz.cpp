// Fuzz target: a whole .safetensors file (u64 header length, JSON header, data section) as
// safetensors::Reader::Open maps and validates it (model weights come from the Hub or another host).
//
// Properties checked on every accepted file: each tensor's byte range lies inside the data section
// and matches numel * DTypeSize; every byte of it can be read; Find() finds each tensor; and what
// Reader accepts, Write writes back to a file that Reader reads as the same tensors and bytes.
#include <cstring>

#include "common/formats/safetensors.h"
#include "common/os/file_system.h"
#include "tests/fuzz/fuzz_util.h"

using namespace sftctl;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::ScratchDir() + "/in.safetensors";
  fuzz::WriteFile(path, fuzz::AsView(data, size));
  auto reader = safetensors::Reader::Open(path);
  fuzz::Log("Open", reader.status());
  if (!reader.ok()) return 0;
  const safetensors::Reader& r = **reader;

  uint64_t header_len = 0;
  FUZZ_CHECK(size >= 8, "accepted a file shorter than its length prefix");
  std::memcpy(&header_len, data, 8);
  FUZZ_CHECK(header_len <= size - 8, "header longer than the file");
  const uint64_t data_size = size - 8 - header_len;

  std::vector<safetensors::TensorRef> refs;
  uint64_t sum = 0;
  for (const auto& t : r.tensors()) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_size, "tensor '" + t.name + "' outside the data section");
    FUZZ_CHECK(t.nbytes() == static_cast<uint64_t>(t.numel()) * safetensors::DTypeSize(t.dtype),
               "tensor '" + t.name + "' byte length does not match its shape");
    FUZZ_CHECK(r.Find(t.name) == &t, "Find('" + t.name + "')");
    const uint8_t* p = r.data(t);
    for (uint64_t i = 0; i < t.nbytes(); ++i) sum += p[i];  // every byte readable
    refs.push_back({t.name, t.dtype, t.shape, p, static_cast<size_t>(t.nbytes())});
  }
  (void)sum;

  // Round trip through the writer.
  const std::string out = fuzz::ScratchDir() + "/out.safetensors";
  Status written = safetensors::Write(FileSystem::Default(), out, refs, r.metadata());
  fuzz::Log("Write", written);
  FUZZ_CHECK(written.ok(), "a file Reader accepts cannot be written back: " + written.ToString());
  auto again = safetensors::Reader::Open(out);
  FUZZ_CHECK(again.ok(), "a file Write produced is rejected: " + again.status().ToString());
  FUZZ_CHECK((*again)->tensors().size() == r.tensors().size(), "tensor count changed");
  FUZZ_CHECK((*again)->metadata() == r.metadata(), "metadata changed");
  for (size_t i = 0; i < r.tensors().size(); ++i) {
    const auto& a = r.tensors()[i];
    const auto& b = (*again)->tensors()[i];
    FUZZ_CHECK(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes(),
               "tensor '" + a.name + "' changed");
    FUZZ_CHECK(a.nbytes() == 0 || std::memcmp(r.data(a), (*again)->data(b), a.nbytes()) == 0,
               "bytes of '" + a.name + "' changed");
  }
  return 0;
}
