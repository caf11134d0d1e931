// `sftctl pull s3://` and the bucket readers against a hostile bucket (issue 37, items 7 and 8):
//   - a listing that names keys outside the prefix asked for: a fake endpoint on 127.0.0.1 (moto lists
//     only what it holds), through the library and the real `sftctl pull`;
//   - symbolic links planted in the destination (FILE.part, metrics.jsonl, spec.json): moto, strict.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "common/object_store/checkpoint_store.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

namespace fs = std::filesystem;
using ::sftctl::testing::Bin;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::RunCommand;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
using ::testing::HasSubstr;

// An S3 endpoint on 127.0.0.1 that answers every ListObjectsV2 with `keys` and anything else with 404
// and `error_message` (XML text, entities allowed). Pages: one, unless `truncated`, when every page says
// it is truncated and hands out a continuation token, always the same one when `same_token`.
// Thread safety: construct and destroy on one thread; it serves on its own thread.
struct FakeListingOptions {
  bool truncated = false;
  bool same_token = false;
  std::string error_message = "none";
  std::string object_body;  // non-empty: every other GET is answered 200 with it, whatever its Range
};
class FakeListing {
 public:
  explicit FakeListing(std::vector<std::string> keys, FakeListingOptions o = {})
      : keys_(std::move(keys)), o_(std::move(o)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeListing() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::read(c, buf, sizeof(buf));
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      const bool list = req.find("list-type=2") != std::string::npos;
      std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
      if (list) {
        body += "<ListBucketResult><Name>hostile</Name><IsTruncated>" +
                std::string(o_.truncated ? "true" : "false") + "</IsTruncated>";
        if (o_.truncated)
          body += "<NextContinuationToken>t" + std::to_string(o_.same_token ? 0 : ++pages_) +
                  "</NextContinuationToken>";
        for (const std::string& k : keys_)
          body += "<Contents><Key>" + k + "</Key><Size>10</Size><ETag>\"e\"</ETag></Contents>";
        body += "</ListBucketResult>";
      } else if (!o_.object_body.empty()) {
        body = o_.object_body;
      } else {
        body += "<Error><Code>NoSuchKey</Code><Message>" + o_.error_message + "</Message></Error>";
      }
      const bool ok = list || !o_.object_body.empty();
      const std::string resp =
          std::string(ok ? "HTTP/1.1 200 OK" : "HTTP/1.1 404 Not Found") +
          "\r\nContent-Type: application/xml\r\nContent-Length: " + std::to_string(body.size()) +
          "\r\nConnection: close\r\n\r\n" + body;
      for (size_t off = 0; off < resp.size();) {
        const ssize_t n = ::write(c, resp.data() + off, resp.size() - off);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
      }
      ::close(c);
    }
  }

  std::vector<std::string> keys_;
  FakeListingOptions o_;
  int pages_ = 0;  // (the serving thread's)
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::vector<std::string> FakeEnv(const std::string& endpoint) {
  return {"AWS_ACCESS_KEY_ID=AKIDEXAMPLE",         "AWS_SECRET_ACCESS_KEY=secret",
          "AWS_DEFAULT_REGION=us-east-1",          "AWS_CONFIG_FILE=/dev/null",
          "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "AWS_EC2_METADATA_DISABLED=true",
          "AWS_ENDPOINT_URL=" + endpoint};
}

// Issue 37, item 7: `o.key.substr(base.size())` threw std::out_of_range on a listed key shorter than
// the prefix (`sftctl pull` exited 134; the agent aborted in its resume download, on every restart), and
// a longer key outside it was taken for a folder under the prefix (pruning would have deleted it).
TEST(HostileListing, AKeyOutsideThePrefixIsDataLossNamingIt) {
  for (const std::string& stranger :
       {std::string("x"), std::string("other/checkpoint-000009/MANIFEST.json")}) {
    FakeListing fake({"run/checkpoint-000001/MANIFEST.json", stranger});
    S3Client s3(S3Endpoint{fake.endpoint(), "us-east-1"},
                AwsCredentials{"AKIDEXAMPLE", "secret", "", "test"});
    const auto expected =
        StatusIs(StatusCode::kDataLoss, "s3://hostile/run/: ListObjectsV2 listed the key '" + stranger +
                                            "', which is outside the prefix");
    EXPECT_THAT(NewestBucketCheckpoint(s3, S3Location{"hostile", "run"}), expected);
    EXPECT_THAT(PruneBucketCheckpoints(s3, S3Location{"hostile", "run"}, 1), expected);

    TempDir dest("h37-pull");
    auto r = RunCommand({Bin("sftctl"), "pull", "s3://hostile/run", dest.path()}, FakeEnv(fake.endpoint()));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("which is outside the prefix")) << r.output;
  }
}

// Issue 37 (lower items): an endpoint that answers "truncated" forever, or with the token it was given,
// cannot grow a listing without end; its error text reaches a message escaped, never as raw controls.
TEST(HostileListing, EndlessOrLoopingPagesStop) {
  const AwsCredentials creds{"AKIDEXAMPLE", "secret", "", "test"};
  FakeListing endless({"run/a", "run/b"}, FakeListingOptions{true, false, "none", ""});
  S3Client s3(S3Endpoint{endless.endpoint(), "us-east-1"}, creds);
  EXPECT_THAT(s3.ListObjects("hostile", "run/", 1000, 6),
              StatusIs(StatusCode::kDataLoss, HasSubstr("ListObjectsV2: 6 objects and still truncated")));
  FakeListing looping({"run/a"}, FakeListingOptions{true, true, "none", ""});
  S3Client s3b(S3Endpoint{looping.endpoint(), "us-east-1"}, creds);
  EXPECT_THAT(s3b.ListObjects("hostile", "run/"),
              StatusIs(StatusCode::kDataLoss, HasSubstr("the same continuation token twice (page 2)")));
}

TEST(HostileListing, ErrorTextFromTheEndpointIsEscaped) {
  FakeListing fake({}, FakeListingOptions{false, false, "gone&#27;]0;pwned&#7;&#x9b;2J", ""});
  S3Client s3(S3Endpoint{fake.endpoint(), "us-east-1"}, AwsCredentials{"AKIDEXAMPLE", "secret", "", "test"});
  auto got = s3.GetObject("hostile", "run/spec.json");
  ASSERT_FALSE(got.ok());
  const std::string m = got.status().message();
  EXPECT_THAT(m, HasSubstr("NoSuchKey: gone\\x1b]0;pwned\\x07\\u009b2J")) << m;
  for (char c : m) EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 && c != '\n') << m;
}

// GetRange wrote what the endpoint sent into the sink, then checked the length: a whole object sent
// for a range landed past the range in the .part file first.
TEST(HostileRange, BytesPastTheRangeNeverReachTheSink) {
  FakeListingOptions o;
  o.object_body = std::string(4096, 'z');
  FakeListing fake({}, o);
  S3Client s3(S3Endpoint{fake.endpoint(), "us-east-1"}, AwsCredentials{"AKIDEXAMPLE", "secret", "", "test"});
  uint64_t written = 0;
  Status st = s3.GetRange("hostile", "run/model.bin", 0, 16, [&](std::string_view d) {
    written += d.size();
    return true;
  });
  EXPECT_THAT(st, StatusIs(StatusCode::kDataLoss, HasSubstr("more than the 16 bytes asked for")));
  EXPECT_LE(written, 16u);
}

TEST(S3Region, ARegionThatIsNotANameNeverReachesAHostName) {
  for (const std::string& region :
       std::vector<std::string>{"evil.example.com/x", "us-east-1#", "-x", std::string(40, 'a')}) {
    EXPECT_THAT(S3RequestUrl(S3Endpoint{"", region}, "bucket", "key", ""),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'checkpoint.region'")))
        << region;
  }
  auto url = S3RequestUrl(S3Endpoint{"", "eu-west-1"}, "bucket", "k", "");
  ASSERT_TRUE(url.ok()) << url.status().ToString();
  EXPECT_EQ(*url, "https://bucket.s3.eu-west-1.amazonaws.com/k");
}

// Issue 37, item 8: `pull s3://` wrote through links planted in the destination (FILE.part opened
// without O_NOFOLLOW; metrics.jsonl and spec.json through a plain ofstream) and exited 0. Now each is
// refused with a non-zero exit and the links' targets keep their bytes.
class PullLinksTest : public testing::S3SuiteTest<PullLinksTest> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    s3_ = NewClient("");
    ASSERT_TRUE(s3_->CreateBucket("links").ok());
    const std::string ckpt = src_.path() + "/checkpoint-000001";
    ASSERT_TRUE(WriteWholeFile(ckpt + "/model.bin", std::string(4096, 'm')));
    ASSERT_TRUE(WriteWholeFile(ckpt + "/DONE", ""));
    TransferOptions opt;
    ASSERT_TRUE(UploadCheckpoint(*s3_, S3Location{"links", "run"}, ckpt, opt).ok());
    ASSERT_TRUE(s3_->PutObject("links", "run/metrics.jsonl", "{\"event\":\"step\",\"step\":1}\n").ok());
    ASSERT_TRUE(s3_->PutObject("links", "run/spec.json", "{\"model\":\"tiny\"}\n").ok());
  }
  // `sftctl pull s3://links/run DEST` with a link at DEST/<rel> to a victim file outside DEST: the
  // command's result; the victim must keep its bytes.
  testing::CommandResult PullWithLinkAt(const std::string& rel) {
    const std::string dest = dir_.path() + "/dest-" + std::to_string(n_++);
    const std::string victim = dir_.path() + "/victim-" + std::to_string(n_);
    EXPECT_TRUE(WriteWholeFile(victim, "precious"));
    fs::create_directories(fs::path(dest + "/" + rel).parent_path());
    fs::create_symlink(victim, dest + "/" + rel);
    auto env = server_->ClientEnv();
    env.push_back("AWS_ENDPOINT_URL=" + server_->endpoint());
    auto r = RunCommand({Bin("sftctl"), "pull", "s3://links/run", dest}, env);
    EXPECT_EQ(ReadWholeFile(victim), "precious") << "written through the link at " << rel << ": " << r.output;
    EXPECT_TRUE(fs::is_symlink(dest + "/" + rel)) << rel;
    return r;
  }

  std::unique_ptr<S3Client> s3_;
  TempDir src_{"h37-src"}, dir_{"h37-links"};
  int n_ = 0;
};

TEST_F(PullLinksTest, ALinkAtThePartFileIsRefused) {
  auto r = PullWithLinkAt("checkpoint-000001/model.bin.part");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model.bin.part': Too many levels of symbolic links")) << r.output;
}

TEST_F(PullLinksTest, ALinkAtTheRunsMetricsOrSpecIsRefused) {
  for (const char* name : {"metrics.jsonl", "spec.json"}) {
    auto r = PullWithLinkAt(name);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, HasSubstr("refusing to write through the symbolic link")) << r.output;
  }
}

// Without links the same pull writes the checkpoint and the run's files (the refusals above are not
// refusals of everything).
TEST_F(PullLinksTest, APullWithoutLinksWritesEverything) {
  const std::string dest = dir_.path() + "/clean";
  auto env = server_->ClientEnv();
  env.push_back("AWS_ENDPOINT_URL=" + server_->endpoint());
  auto r = RunCommand({Bin("sftctl"), "pull", "s3://links/run", dest}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadWholeFile(dest + "/checkpoint-000001/model.bin"), std::string(4096, 'm'));
  EXPECT_EQ(ReadWholeFile(dest + "/metrics.jsonl"), "{\"event\":\"step\",\"step\":1}\n");
  EXPECT_EQ(ReadWholeFile(dest + "/spec.json"), "{\"model\":\"tiny\"}\n");
}

}  // namespace
}  // namespace sftctl
