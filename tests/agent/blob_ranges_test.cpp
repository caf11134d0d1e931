// Ranged uploads into the BlobStore (agent/state/blob_store.h): blocks in any order and at once, the
// blocks held across a restart, a whole that does not verify, bad ranges, and what a sequential
// upload and garbage collection do to a ranged one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <climits>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "agent/state/blob_store.h"
#include "agent/state/state_store.h"
#include "common/sha256.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::agent {
namespace {

using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 1000;

class BlobRanges : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(blobs->Init().ok());
    for (int i = 0; i < 4500; ++i) data.push_back(static_cast<char>('a' + (i * 7) % 26));
    sha = Sha256Hex(data);
  }
  // Sends block b whole (or its first `cut` bytes); *complete as the store answered.
  Status Send(BlobStore& store, size_t b, bool* complete, size_t cut = SIZE_MAX) {
    const uint64_t off = b * kBlock, len = std::min<uint64_t>(kBlock, data.size() - off);
    auto up = store.BeginRange(sha, data.size(), kBlock, off, len);
    if (!up.ok()) return up.status();
    Status w = (*up)->Write(data.substr(off, std::min<uint64_t>(len, cut)));
    if (!w.ok()) return w;
    return (*up)->Finish(complete);
  }
  std::vector<uint64_t> Held(BlobStore& store) {
    auto st = store.StatBlob(sha);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->blocks_held : std::vector<uint64_t>{};
  }

  TempDir dir;
  std::unique_ptr<StateStore> state = StateStore::Open(dir.path() + "/agent.db").value();
  std::unique_ptr<BlobStore> blobs = std::make_unique<BlobStore>(dir.path() + "/blobs", state.get());
  std::string data, sha;  // 4.5 blocks
};

TEST_F(BlobRanges, BlocksInAnyOrderCompleteTheBlobOnlyWithTheLastOne) {
  bool complete = true;
  for (size_t b : {3, 0, 4, 1}) {
    ASSERT_TRUE(Send(*blobs, b, &complete).ok()) << b;
    EXPECT_FALSE(complete) << b;
  }
  auto st = blobs->StatBlob(sha);
  ASSERT_TRUE(st.ok());
  EXPECT_FALSE(st->complete);
  EXPECT_EQ(st->block, kBlock);
  EXPECT_EQ(st->blocks_held, (std::vector<uint64_t>{0, 1, 3, 4}));
  ASSERT_TRUE(Send(*blobs, 2, &complete).ok());
  EXPECT_TRUE(complete);
  EXPECT_TRUE(blobs->StatBlob(sha)->complete);
  EXPECT_EQ(ReadWholeFile(blobs->BlobPath(sha)), data);
  EXPECT_FALSE(std::filesystem::exists(blobs->PartialDir() + "/" + sha + ".ranges"));
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 0, kBlock).status().code(),
            StatusCode::kAlreadyExists);
}

TEST_F(BlobRanges, BlocksSentAtOnceFromSeveralThreadsVerify) {
  std::vector<std::thread> threads;
  std::atomic<int> completes{0}, failures{0};
  for (size_t b = 0; b < 5; ++b) {
    threads.emplace_back([&, b] {
      bool complete = false;
      if (!Send(*blobs, b, &complete).ok()) ++failures;
      if (complete) ++completes;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(completes.load(), 1);  // exactly the last block to arrive
  EXPECT_TRUE(blobs->StatBlob(sha)->complete);
}

TEST_F(BlobRanges, TheBlocksHeldOutliveARestartAndAShortBlockIsNotHeld) {
  bool complete = false;
  ASSERT_TRUE(Send(*blobs, 0, &complete).ok());
  ASSERT_TRUE(Send(*blobs, 2, &complete).ok());
  EXPECT_EQ(Send(*blobs, 1, &complete, 10).code(), StatusCode::kDataLoss);  // the stream ended early
  {
    auto up = blobs->BeginRange(sha, data.size(), kBlock, 3 * kBlock, kBlock).value();
    EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 3 * kBlock, kBlock).status().code(),
              StatusCode::kAborted);  // one stream per block
    EXPECT_EQ(blobs->BeginUpload(sha, data.size(), 0).status().code(), StatusCode::kAborted);
    EXPECT_EQ(up->Write(std::string(kBlock + 1, 'x')).code(), StatusCode::kInvalidArgument);
  }  // the client went away mid-block
  EXPECT_EQ(Held(*blobs), (std::vector<uint64_t>{0, 2}));

  blobs = std::make_unique<BlobStore>(dir.path() + "/blobs", state.get());  // the agent restarts
  ASSERT_TRUE(blobs->Init().ok());
  EXPECT_EQ(Held(*blobs), (std::vector<uint64_t>{0, 2}));
  for (size_t b : {1, 3, 4}) ASSERT_TRUE(Send(*blobs, b, &complete).ok()) << b;
  EXPECT_TRUE(complete);  // hashed from the start, blocks 0 and 2 read back
  EXPECT_TRUE(blobs->StatBlob(sha)->complete);
}

TEST_F(BlobRanges, AWholeThatDoesNotVerifyIsDeleted) {
  data[2 * kBlock + 5] ^= 1;  // the file changed while it was read: blocks no longer hash to sha
  bool complete = false;
  for (size_t b : {0, 1, 2, 3}) ASSERT_TRUE(Send(*blobs, b, &complete).ok()) << b;
  Status s = Send(*blobs, 4, &complete);
  EXPECT_THAT(s, StatusIs(StatusCode::kDataLoss, HasSubstr("nothing stored")));
  EXPECT_FALSE(complete);
  EXPECT_FALSE(std::filesystem::exists(blobs->BlobPath(sha)));
  EXPECT_FALSE(std::filesystem::exists(blobs->PartialDir() + "/" + sha));
  EXPECT_TRUE(Held(*blobs).empty());
}

TEST_F(BlobRanges, RangesMustBeWholeBlocks) {
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 500, kBlock).status().code(),
            StatusCode::kInvalidArgument);  // not at a block boundary
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 0, 999).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 4 * kBlock, kBlock).status().code(),
            StatusCode::kInvalidArgument);  // the last block is 500 bytes
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), 0, 0, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(blobs->BeginRange(sha, data.size(), kBlock, 5 * kBlock, kBlock).status().code(),
            StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(blobs->BeginRange(sha, uint64_t{1} << 40, 1, 0, 1).status().code(),
            StatusCode::kInvalidArgument);  // a trillion blocks: refused before any is tracked
  EXPECT_EQ(blobs->BeginRange("nope", data.size(), kBlock, 0, kBlock).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(BlobRanges, ASequentialUploadOrGcReplacesAnIdleRangedOne) {
  bool complete = false;
  ASSERT_TRUE(Send(*blobs, 1, &complete).ok());
  ASSERT_EQ(Held(*blobs), (std::vector<uint64_t>{1}));
  EXPECT_EQ(blobs->StatBlob(sha)->size, 0u);  // a sequential client starts from 0
  {
    auto up = blobs->BeginUpload(sha, data.size(), 0).value();
    EXPECT_FALSE(std::filesystem::exists(blobs->PartialDir() + "/" + sha + ".ranges"));
    ASSERT_TRUE(up->Write(data.substr(0, 100)).ok());
  }
  EXPECT_EQ(blobs->StatBlob(sha)->size, 100u);
  EXPECT_TRUE(Held(*blobs).empty());

  // Blocks of another size replace the sequential bytes; gc then removes the ranged upload whole.
  auto up = blobs->BeginRange(sha, data.size(), 2 * kBlock, 0, 2 * kBlock).value();
  ASSERT_TRUE(up->Write(data.substr(0, 2 * kBlock)).ok());
  ASSERT_TRUE(up->Finish(&complete).ok());
  up.reset();
  EXPECT_EQ(Held(*blobs), (std::vector<uint64_t>{0}));
  ASSERT_TRUE(blobs->RemoveIfUnused(sha, /*partial=*/true, INT64_MAX).ok());
  EXPECT_FALSE(std::filesystem::exists(blobs->PartialDir() + "/" + sha));
  EXPECT_FALSE(std::filesystem::exists(blobs->PartialDir() + "/" + sha + ".ranges"));
  EXPECT_TRUE(Held(*blobs).empty());
}

// A block, once complete, is immutable: a resend of the same bytes (a client whose answer was lost
// sends the block again) is verified and answered OK, one with other bytes is refused without writing,
// so the stored blob is always the bytes its sha256 names. (Before, the resend overwrote the block
// after it was hashed, and the blob was stored with bytes that no longer hash to its name.)
TEST_F(BlobRanges, ACompletedBlockIsNeverWrittenAgain) {
  bool complete = false;
  for (size_t b : {0, 1, 2, 3}) ASSERT_TRUE(Send(*blobs, b, &complete).ok()) << b;
  const std::string good = data;
  data[kBlock + 10] ^= 1;  // block 1, already hashed, now sent with other bytes
  EXPECT_THAT(Send(*blobs, 1, &complete),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("block 1 of blob " + sha + " is already held with other bytes")));
  data = good;
  ASSERT_TRUE(Send(*blobs, 2, &complete).ok());  // the same bytes again: verified, nothing changes
  EXPECT_FALSE(complete);
  EXPECT_EQ(Held(*blobs), (std::vector<uint64_t>{0, 1, 2, 3}));

  blobs = std::make_unique<BlobStore>(dir.path() + "/blobs", state.get());  // the agent restarts
  ASSERT_TRUE(blobs->Init().ok());
  data[3 * kBlock] ^= 1;
  EXPECT_THAT(Send(*blobs, 3, &complete),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("other bytes")));
  data = good;
  ASSERT_TRUE(Send(*blobs, 4, &complete).ok());
  EXPECT_TRUE(complete);
  const std::string stored = ReadWholeFile(blobs->BlobPath(sha));
  EXPECT_EQ(Sha256Hex(stored), sha);
  EXPECT_EQ(stored, data);
}

// A block is written as its chunks arrive and read back for hashing 1 MiB at a time: a stream's memory
// does not grow with the block size the client chose. (Before, the block was read back whole.)
TEST_F(BlobRanges, ALargeBlockIsHashedInChunksNotReadWhole) {
  const auto peak_rss_kb = [] {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<int64_t>(ru.ru_maxrss);
  };
  constexpr uint64_t kBig = 48ull << 20, kChunk = 1 << 20;
  std::string chunk(kChunk, '\0');
  Sha256 whole;
  for (uint64_t i = 0; i < kBig / kChunk; ++i) {
    for (size_t j = 0; j < chunk.size(); j += 4096) chunk[j] = static_cast<char>(i + j / 4096);
    whole.Update(chunk);
  }
  const std::string big_sha = whole.HexDigest();
  const int64_t before = peak_rss_kb();
  auto up = blobs->BeginRange(big_sha, kBig, kBig, 0, kBig);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  for (uint64_t i = 0; i < kBig / kChunk; ++i) {
    for (size_t j = 0; j < chunk.size(); j += 4096) chunk[j] = static_cast<char>(i + j / 4096);
    ASSERT_TRUE((*up)->Write(chunk).ok());
  }
  bool complete = false;
  ASSERT_TRUE((*up)->Finish(&complete).ok());
  EXPECT_TRUE(complete);
  EXPECT_LT(peak_rss_kb() - before, 16 << 10) << "KiB more at the peak, for a 48 MiB block";
}

// Ranged uploads that clients start and abandon hold no descriptor of the agent's: only a stream that
// is writing a block does. (Counted in /proc/self/fd; 50 abandoned uploads would hold 100 before.)
TEST_F(BlobRanges, AbandonedRangedUploadsHoldNoDescriptors) {
  const auto open_fds = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {});
  };
  const auto before = open_fds();
  for (int i = 0; i < 50; ++i) {
    const std::string blob = data + std::to_string(i), blob_sha = Sha256Hex(blob);
    auto up = blobs->BeginRange(blob_sha, blob.size(), kBlock, kBlock, kBlock);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    EXPECT_EQ(open_fds(), before + 1) << "a stream writing a block holds one descriptor";
    bool complete = false;
    ASSERT_TRUE((*up)->Write(blob.substr(kBlock, kBlock)).ok());
    ASSERT_TRUE((*up)->Finish(&complete).ok());
  }
  EXPECT_EQ(open_fds(), before);
  // They are still known: their held blocks are answered, and the missing blocks complete one of them.
  const std::string blob = data + "7";
  const std::string blob_sha = Sha256Hex(blob);
  auto held = blobs->StatBlob(blob_sha);
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->blocks_held, (std::vector<uint64_t>{1}));
  for (size_t b : {0, 2, 3, 4}) {
    const uint64_t off = b * kBlock, len = std::min<uint64_t>(kBlock, blob.size() - off);
    auto up = blobs->BeginRange(blob_sha, blob.size(), kBlock, off, len);
    ASSERT_TRUE(up.ok()) << up.status().ToString();
    ASSERT_TRUE((*up)->Write(blob.substr(off, len)).ok());
    bool complete = false;
    ASSERT_TRUE((*up)->Finish(&complete).ok());
    EXPECT_EQ(complete, b == 4);
  }
  EXPECT_TRUE(blobs->StatBlob(blob_sha)->complete);
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace sftctl::agent
