// Range pulls (client/transfer/range_pull.h) against an in-process fake agent (real gRPC, one in-process
// channel per connection) that serves byte ranges and misbehaves on purpose: a stream dropped in the
// middle of a range, a file that changes between ranges, an agent that predates ranges, a run that
// stops half way and is resumed by the next one.
#include "client/transfer/range_pull.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/statvfs.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>

#include "client/remote/agent_session.h"
#include "client/transfer/puller.h"
#include "common/sha256.h"
#include "tests/remote/remote_test_util.h"
#include "tests/util/in_process_agent.h"
#include "tests/util/status_matchers.h"

namespace sftctl::remotetest {
namespace {

namespace v1 = ::sftctl::v1;
using client::AgentSession;
using client::Reconnector;
using ::sftctl::testing::InProcessAgent;
using ::sftctl::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 64 << 10;

class RangeAgent final : public v1::Agent::Service {
 public:
  std::string file;     // what PullArtifact serves
  std::string changed;  // when set: served to ranges starting at or after change_at
  uint64_t change_at = 0;
  uint64_t drop_at = std::numeric_limits<uint64_t>::max();      // the first stream through it fails there
  uint64_t refuse_from = std::numeric_limits<uint64_t>::max();  // ranges from here: FAILED_PRECONDITION
  bool honor_length = true;     // false: an agent from before ranges streams to the end
  uint64_t overrun = 0;         // a stream to the end goes on this many bytes past it (a hostile agent)
  uint64_t declared_total = 0;  // > 0: the total size the first chunk declares instead of the file's
  int hold_until_active = 0;    // > 0: a stream waits (up to 10 s) until this many are being served

  std::condition_variable cv;
  int active = 0, max_active = 0;

  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> requests;  // (offset, length)
  std::atomic<bool> dropped{false};

  grpc::Status PullArtifact(grpc::ServerContext*, const v1::PullArtifactRequest* req,
                            grpc::ServerWriter<v1::ArtifactChunk>* w) override {
    {
      std::lock_guard<std::mutex> l(mu);
      requests.emplace_back(req->offset(), req->length());
    }
    if (req->offset() >= refuse_from) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "refused");
    std::unique_lock<std::mutex> l(mu);
    max_active = std::max(max_active, ++active);
    cv.notify_all();
    if (hold_until_active > 0) {
      cv.wait_for(l, std::chrono::seconds(10), [&] { return active >= hold_until_active; });
      hold_until_active = 0;  // only the first streams wait
    }
    l.unlock();
    struct Leave {
      RangeAgent* a;
      ~Leave() {
        std::lock_guard<std::mutex> g(a->mu);
        --a->active;
      }
    } leave{this};
    const std::string& base = !changed.empty() && req->offset() >= change_at ? changed : file;
    const std::string f = overrun > 0 ? base + std::string(overrun, 'z') : base;
    uint64_t end = f.size();
    if (honor_length && req->length() > 0) end = std::min<uint64_t>(end, req->offset() + req->length());
    uint64_t off = req->offset();
    bool first = true;
    while (off < end) {
      v1::ArtifactChunk c;
      c.set_offset(off);
      if (first) {
        c.set_total_size(declared_total > 0 ? declared_total : base.size());
        c.set_sha256(Sha256Hex(base));
        first = false;
      }
      const uint64_t n = std::min<uint64_t>(4096, end - off);
      c.set_data(f.substr(off, n));
      off += n;
      if (!w->Write(c)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
      if (req->offset() <= drop_at && drop_at < end && off >= drop_at && !dropped.exchange(true)) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "tunnel dropped");
      }
    }
    return grpc::Status::OK;
  }

  int MaxActive() {
    std::lock_guard<std::mutex> l(mu);
    return max_active;
  }
  std::vector<std::pair<uint64_t, uint64_t>> Requests() {
    std::lock_guard<std::mutex> l(mu);
    return requests;
  }
};

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed);
  for (auto& c : s) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
  return s;
}

class RangePull : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(server_.Start(&agent_));
    agent_.file = Pattern(1000000, 1);  // 15.3 blocks of 64 KiB
    sha_ = Sha256Hex(agent_.file);
    part_ = tmp_.path() + "/model.bin.part";
  }
  // Each session is a new in-process channel: one "connection" per worker.
  std::unique_ptr<Reconnector> MakeReconnector() { return server_.NewReconnector(3); }

  Status Pull(int streams, client::RangePullResult* r) {
    auto rc = MakeReconnector();
    client::RangePullOptions o;
    o.max_streams = streams;
    o.block_bytes = kBlock;
    return client::PullRanges(rc.get(), "job-1", "run/model.bin", agent_.file.size(), sha_, part_, o, nullptr,
                              r);
  }

  RangeAgent agent_;
  InProcessAgent server_;  // (after agent_: it shuts down first)
  TempDir tmp_;
  std::string sha_, part_;
};

TEST_F(RangePull, BlocksArriveOverSeveralConnectionsAndTheWholeVerifies) {
  client::RangePullResult r;
  Status s = Pull(3, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_FALSE(std::filesystem::exists(part_ + ".ranges"));
  EXPECT_EQ(r.streams, 3);
  EXPECT_EQ(server_.connects(), 3);
  EXPECT_EQ(r.bytes_fetched, agent_.file.size());
  EXPECT_FALSE(r.resumed);
  // Every block asked for once, as its own range; the last one is short.
  std::set<uint64_t> offsets;
  for (auto [offset, length] : agent_.Requests()) {
    EXPECT_EQ(offset % kBlock, 0u);
    EXPECT_EQ(length, std::min<uint64_t>(kBlock, agent_.file.size() - offset));
    EXPECT_TRUE(offsets.insert(offset).second) << "block at " << offset << " asked for twice";
  }
  EXPECT_EQ(offsets.size(), 16u);
}

TEST_F(RangePull, OneConnectionStreamsSeveralRangesAtOnce) {
  // gRPC grants each stream its own window: a connection streams kLanesPerConnection ranges at once.
  agent_.hold_until_active = client::kLanesPerConnection;
  client::RangePullResult r;
  Status s = Pull(1, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_EQ(server_.connects(), 1);
  // (More may overlap for a moment: a finished range's handler can still be returning when the lane's
  // next range starts.)
  EXPECT_GE(agent_.MaxActive(), client::kLanesPerConnection);
}

TEST_F(RangePull, AStreamDroppedMidRangeResumesFromTheByteItReached) {
  agent_.drop_at = 5 * kBlock + 3 * 4096;  // inside block 5
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_TRUE(agent_.dropped.load());
  // No byte fetched twice: the retry asked for the rest of the range only.
  EXPECT_EQ(r.bytes_fetched, agent_.file.size());
  bool resumed_mid_range = false;
  for (auto [offset, length] : agent_.Requests()) {
    if (offset % kBlock != 0) {
      resumed_mid_range = true;
      EXPECT_GT(offset, 5 * kBlock);
      EXPECT_LT(offset, 6 * kBlock);
      EXPECT_EQ(offset + length, 6 * kBlock);
    }
  }
  EXPECT_TRUE(resumed_mid_range);
}

TEST_F(RangePull, AFileThatChangedOnTheHostBetweenRangesIsRefused) {
  agent_.changed = Pattern(agent_.file.size(), 2);  // same size, other bytes: another sha256
  agent_.change_at = 8 * kBlock;
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_THAT(s, StatusIs(StatusCode::kDataLoss, HasSubstr("changed on fake while it was pulled")));
  EXPECT_NE(ReadWholeFile(part_), agent_.file);  // never presented as complete
}

TEST_F(RangePull, AnAgentFromBeforeRangesIsReadOnlyToTheRangeEnd) {
  agent_.honor_length = false;
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_EQ(r.bytes_fetched, agent_.file.size());
}

TEST_F(RangePull, AnInterruptedRunLeavesItsBlocksForTheNextOne) {
  agent_.refuse_from = 10 * kBlock;  // a non-transient failure: blocks 0..9 arrive, then the run fails
  client::RangePullResult first;
  Status s = Pull(1, &first);
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.message();
  ASSERT_TRUE(std::filesystem::exists(part_ + ".ranges"));

  agent_.refuse_from = std::numeric_limits<uint64_t>::max();
  const size_t asked_before = agent_.Requests().size();
  client::RangePullResult second;
  s = Pull(1, &second);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_TRUE(second.resumed);
  EXPECT_EQ(second.bytes_fetched, agent_.file.size() - 10 * kBlock);
  auto req = agent_.Requests();
  ASSERT_GT(req.size(), asked_before);
  uint64_t lowest = UINT64_MAX;
  for (size_t i = asked_before; i < req.size(); ++i) lowest = std::min(lowest, req[i].first);
  EXPECT_EQ(lowest, 10 * kBlock);  // nothing before the first block it lacked
  EXPECT_FALSE(std::filesystem::exists(part_ + ".ranges"));
}

TEST_F(RangePull, APartFromAOneStreamPullCountsAsItsCompleteBlocks) {
  WriteWholeFile(part_, agent_.file.substr(0, 3 * kBlock + 100));
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_EQ(r.bytes_fetched, agent_.file.size() - 3 * kBlock);
  for (auto [offset, length] : agent_.Requests()) EXPECT_GE(offset, 3 * kBlock);
}

TEST_F(RangePull, RangesOfAnotherFileAreDiscarded) {
  WriteWholeFile(part_, std::string(5 * kBlock, 'x'));
  WriteWholeFile(part_ + ".ranges", "sftctl-ranges 1 999 deadbeef 65536\n0\n1\n2\n");
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadWholeFile(part_), agent_.file);
  EXPECT_FALSE(r.resumed);
  EXPECT_EQ(r.bytes_fetched, agent_.file.size());
}

TEST_F(RangePull, ADamagedResumedBlockFailsVerificationAndRemovesThePart) {
  // The .ranges claims blocks whose bytes are wrong (a crash before they reached the disk): the
  // whole does not verify, and nothing partial is left to be trusted later.
  std::string damaged = agent_.file;
  damaged[2 * kBlock + 7] ^= 1;
  WriteWholeFile(part_, damaged.substr(0, 4 * kBlock));
  WriteWholeFile(part_ + ".ranges", "sftctl-ranges 1 " + std::to_string(agent_.file.size()) + " " + sha_ +
                                        " 65536\n0\n1\n2\n3\n");
  client::RangePullResult r;
  Status s = Pull(2, &r);
  ASSERT_EQ(s.code(), StatusCode::kDataLoss) << s.message();
  EXPECT_TRUE(r.resumed);
  EXPECT_TRUE(r.digest_mismatch);
  EXPECT_FALSE(std::filesystem::exists(part_));
  EXPECT_FALSE(std::filesystem::exists(part_ + ".ranges"));
}

// A listing of an absurd size (2^60 bytes) is refused before anything is allocated for its blocks or
// written, with an error naming the file; so is one larger than the destination's free space.
TEST_F(RangePull, ASizeBeyondTheCapOrTheFreeSpaceIsRefusedFirst) {
  client::RangePullResult r;
  auto rc = MakeReconnector();
  Status s = client::PullRanges(rc.get(), "job-1", "run/model.bin", 1ull << 60, sha_, part_, {}, nullptr, &r);
  EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted,
                          HasSubstr("'run/model.bin' is listed at 1152921504606846976 bytes, more than "
                                    "sftctl pulls (4 TiB); nothing was fetched")));
  struct statvfs vfs;
  ASSERT_EQ(::statvfs(tmp_.path().c_str(), &vfs), 0);
  const uint64_t free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free + (1ull << 30) <= client::kMaxPullBytes) {
    s = client::PullRanges(rc.get(), "job-1", "run/model.bin", free + (1ull << 30), sha_, part_, {}, nullptr,
                           &r);
    EXPECT_THAT(s, StatusIs(StatusCode::kResourceExhausted, AllOf(HasSubstr("'run/model.bin' needs"),
                                                                  HasSubstr("are free in " + tmp_.path()))));
  }
  // The one-stream path checks the listing too (a file listed without a sha256).
  client::PullStats stats;
  client::PullItem item{"run/metrics.jsonl", tmp_.path() + "/metrics.jsonl", 1ull << 60, ""};
  EXPECT_THAT(client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("'run/metrics.jsonl' is listed at")));
  EXPECT_TRUE(agent_.Requests().empty());
  EXPECT_TRUE(std::filesystem::is_empty(tmp_.path()));
}

// An agent that streams past the size it listed (or declared in the stream) is stopped there: DATA_LOSS,
// nothing past it written, and nothing of the stream kept.
TEST_F(RangePull, AStreamPastTheDeclaredSizeIsCutThere) {
  agent_.overrun = 8 << 20;
  for (const std::string& sha : {sha_, std::string()}) {  // verified listing; a growing file (--follow)
    client::PullStats stats;
    client::PullItem item{"run/metrics.jsonl", tmp_.path() + "/metrics.jsonl", agent_.file.size(), sha};
    auto rc = MakeReconnector();
    EXPECT_THAT(
        client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats),
        StatusIs(StatusCode::kDataLoss,
                 HasSubstr("fake sent more of 'run/metrics.jsonl' than the 1000000 bytes it declared")))
        << "sha256 '" << sha << "'";
    EXPECT_LE(stats.bytes_fetched, agent_.file.size());
    EXPECT_TRUE(std::filesystem::is_empty(tmp_.path()));
  }
}

// A growing file (no listed sha256) whose stream declares 2^60 bytes: refused like such a listing.
TEST_F(RangePull, AStreamDeclaringAnAbsurdSizeIsRefused) {
  agent_.declared_total = 1ull << 60;
  client::PullStats stats;
  client::PullItem item{"run/metrics.jsonl", tmp_.path() + "/metrics.jsonl", agent_.file.size(), ""};
  auto rc = MakeReconnector();
  EXPECT_THAT(client::PullFile(rc.get(), "job-1", item, false, nullptr, &stats),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("'run/metrics.jsonl' is listed at")));
  EXPECT_EQ(stats.bytes_fetched, 0u);
  EXPECT_FALSE(std::filesystem::exists(item.local_path));
}

}  // namespace
}  // namespace sftctl::remotetest
