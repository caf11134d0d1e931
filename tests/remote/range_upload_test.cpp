// Range uploads (client/transfer/range_upload.h) into the agent's real BlobStore, behind a small in-process
// service (real gRPC, one in-process channel per connection) that can drop a block's stream half way.
#include "client/transfer/range_upload.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>

#include "agent/state/blob_store.h"
#include "agent/state/state_store.h"
#include "common/sha256.h"
#include "tests/remote/remote_test_util.h"
#include "tests/util/in_process_agent.h"
#include "tests/util/offset_clock.h"
#include "tests/util/status_matchers.h"

namespace sftctl::remotetest {
namespace {

namespace v1 = ::sftctl::v1;
using ::sftctl::testing::InProcessAgent;
using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 64 << 10;

class BlobAgent final : public v1::Agent::Service {
 public:
  explicit BlobAgent(agent::BlobStore* store) : store_(store) {}
  int64_t drop_block = -1;  // the first stream of this block fails half way

  grpc::Status StatBlob(grpc::ServerContext*, const v1::StatBlobRequest* req, v1::BlobStatus* resp) override {
    auto st = store_->StatBlob(req->sha256());
    if (!st.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, st.status().message());
    resp->set_complete(st->complete);
    resp->set_size(st->size);
    resp->set_block(st->block);
    for (uint64_t b : st->blocks_held) resp->add_blocks_held(b);
    return grpc::Status::OK;
  }
  grpc::Status UploadBlob(grpc::ServerContext*, grpc::ServerReader<v1::UploadBlobRequest>* r,
                          v1::BlobStatus* resp) override {
    v1::UploadBlobRequest msg;
    if (!r->Read(&msg) || msg.length() == 0)
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no range");
    const size_t b = msg.offset() / msg.block();
    const int stream = Count(b);
    auto up = store_->BeginRange(msg.sha256(), msg.size(), msg.block(), msg.offset(), msg.length());
    if (!up.ok())
      return grpc::Status(static_cast<grpc::StatusCode>(up.status().code()), up.status().message());
    while (r->Read(&msg)) {
      if (!(*up)->Write(msg.data()).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "write");
      if (static_cast<int64_t>(b) == drop_block && stream == 0 && (*up)->written() >= kBlock / 2) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "tunnel dropped");
      }
    }
    bool complete = false;
    Status s = (*up)->Finish(&complete);
    if (!s.ok()) return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
    resp->set_complete(complete);
    return grpc::Status::OK;
  }
  // Streams per block so far.
  std::map<size_t, int> Streams() {
    std::lock_guard<std::mutex> l(mu_);
    return streams_;
  }

 private:
  int Count(size_t b) {
    std::lock_guard<std::mutex> l(mu_);
    return streams_[b]++;
  }
  agent::BlobStore* store_;
  std::mutex mu_;
  std::map<size_t, int> streams_;
};

constexpr int kConnections = 3;

class RangeUpload : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(blobs_.Init().ok());
    ASSERT_TRUE(server_.Start(&agent_));
    data_.resize(5 * kBlock + 1234);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<char>((i * 131) >> 3);
    sha_ = Sha256Hex(data_);
    file_ = tmp_.path() + "/train.jsonl";
    WriteWholeFile(file_, data_);
  }
  // With `connections` > 0 fixed, else chosen as the upload does (client/remote/connection_ramp.h).
  Status Upload(const std::string& sha, client::UploadStats* stats, int connections = kConnections,
                const Clock* clock = Clock::Real()) {
    auto rc = server_.NewReconnector(3);
    v1::BlobStatus held;
    auto st = blobs_.StatBlob(sha);
    if (st.ok()) {
      held.set_block(st->block);
      for (uint64_t b : st->blocks_held) held.add_blocks_held(b);
    }
    client::RangeUploadOptions o;
    o.block_bytes = kBlock;
    o.connections = connections;
    o.clock = clock;
    return client::UploadRanges(rc.get(), file_, data_.size(), sha, held, o, nullptr, stats);
  }
  std::string Stored() { return ReadWholeFile(blobs_.BlobPath(sha_)); }

  TempDir tmp_;
  std::unique_ptr<agent::StateStore> state_ = agent::StateStore::Open(tmp_.path() + "/agent.db").value();
  agent::BlobStore blobs_{tmp_.path() + "/blobs", state_.get()};
  BlobAgent agent_{&blobs_};
  InProcessAgent server_;  // (after agent_: it shuts down first)
  std::string data_, sha_, file_;
};

TEST_F(RangeUpload, BlocksGoOverSeveralConnectionsAndTheWholeVerifies) {
  client::UploadStats stats;
  Status s = Upload(sha_, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Stored(), data_);
  EXPECT_EQ(server_.connects(), kConnections);
  EXPECT_EQ(stats.bytes_sent, data_.size());
  EXPECT_EQ(stats.files_sent, 1);
  const auto streams = agent_.Streams();
  ASSERT_EQ(streams.size(), 6u);
  for (auto [block, n] : streams) EXPECT_EQ(n, 1) << "block " << block << " sent twice";
}

// Chosen from measured throughput, an upload starts with one connection, and adds none before a
// second has passed (on a clock that stands still here, however slowly the machine runs the test).
TEST_F(RangeUpload, UnfixedItStartsWithOneConnection) {
  client::UploadStats stats;
  ::sftctl::testing::ManualClock still;
  Status s = Upload(sha_, &stats, /*connections=*/0, &still);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Stored(), data_);
  EXPECT_EQ(server_.connects(), 1);
  EXPECT_EQ(agent_.Streams().size(), 6u);
}

TEST_F(RangeUpload, ADroppedBlockIsSentAgainWholeAfterAReconnect) {
  agent_.drop_block = 2;
  client::UploadStats stats;
  Status s = Upload(sha_, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Stored(), data_);
  EXPECT_EQ(agent_.Streams()[2], 2);
  EXPECT_EQ(agent_.Streams()[3], 1);
  EXPECT_GT(server_.connects(), kConnections);  // the dropped one reconnected
  EXPECT_GT(stats.bytes_sent, data_.size());    // the half block, then the whole one
  EXPECT_LT(stats.bytes_sent, data_.size() + kBlock + 1);
}

TEST_F(RangeUpload, BlocksTheAgentHoldsAreNotSentAgain) {
  for (uint64_t b : {0, 3}) {
    auto up = blobs_.BeginRange(sha_, data_.size(), kBlock, b * kBlock, kBlock).value();
    ASSERT_TRUE(up->Write(data_.substr(b * kBlock, kBlock)).ok());
    bool complete = false;
    ASSERT_TRUE(up->Finish(&complete).ok());
  }
  client::UploadStats stats;
  Status s = Upload(sha_, &stats);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(Stored(), data_);
  EXPECT_EQ(stats.bytes_sent, data_.size() - 2 * kBlock);
  EXPECT_EQ(agent_.Streams().count(0), 0u);
  EXPECT_EQ(agent_.Streams().count(3), 0u);
}

TEST_F(RangeUpload, AFileThatChangedWhileItWasReadIsRefusedAndNothingIsStored) {
  const std::string claimed = Sha256Hex(data_ + "x");  // what it hashed to before it changed
  client::UploadStats stats;
  Status s = Upload(claimed, &stats);
  ASSERT_THAT(s, StatusIs(StatusCode::kDataLoss, HasSubstr("nothing stored")));
  EXPECT_FALSE(std::filesystem::exists(blobs_.BlobPath(claimed)));
  EXPECT_FALSE(std::filesystem::exists(blobs_.PartialDir() + "/" + claimed));
}

}  // namespace
}  // namespace sftctl::remotetest
