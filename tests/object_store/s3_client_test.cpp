// The S3 client (common/object_store/) against a real S3-compatible server: moto_server on
// 127.0.0.1 in strict mode (every SigV4 signature checked), cross-checked with Debian's awscli; a
// relay in front of it drops the link mid-download (tests/util/tcp_relay.h).
#include "common/object_store/s3_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "common/object_store/aws_credentials.h"
#include "common/object_store/s3_location.h"
#include "common/object_store/s3_transfer.h"
#include "common/object_store/s3_xml.h"
#include "common/os/process_util.h"
#include "common/range_log.h"
#include "common/sha256.h"
#include "tests/object_store/s3_server.h"
#include "tests/util/command.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/tcp_relay.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(S3LocationTest, ParsesBucketAndPrefix) {
  auto loc = ParseS3Url("s3://my-bucket/runs/a/");
  ASSERT_TRUE(loc.ok()) << loc.status().ToString();
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->prefix, "runs/a");
  EXPECT_EQ(loc->Key("checkpoint-4/MANIFEST.json"), "runs/a/checkpoint-4/MANIFEST.json");
  EXPECT_EQ(loc->Url(), "s3://my-bucket/runs/a");
  auto bare = ParseS3Url("s3://bkt");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->prefix, "");
  EXPECT_EQ(bare->Key("x"), "x");
  EXPECT_THAT(ParseS3Url("gs://b/p"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("s3://")));
  EXPECT_THAT(ParseS3Url("s3://"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("bucket name")));
  EXPECT_THAT(ParseS3Url("s3://ab/x"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("bucket name 'ab'")));
  EXPECT_THAT(ParseS3Url("s3://bkt/a//b"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("segment")));
  EXPECT_THAT(ParseS3Url("s3://bkt/a/../b"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("'..'")));
}

TEST(S3LocationTest, RequestUrlsAreCanonical) {
  EXPECT_EQ(CanonicalQuery({{"prefix", "dir/a b"}, {"list-type", "2"}, {"uploads", ""}}),
            "list-type=2&prefix=dir%2Fa%20b&uploads=");
  S3Endpoint local{"http://127.0.0.1:9000", ""};
  EXPECT_EQ(*S3RequestUrl(local, "bkt", "a/b c.txt", "uploads="),
            "http://127.0.0.1:9000/bkt/a/b%20c.txt?uploads=");
  EXPECT_EQ(*S3RequestUrl(local, "bkt", ""), "http://127.0.0.1:9000/bkt");
  S3Endpoint aws{"", "eu-west-1"};
  EXPECT_EQ(*S3RequestUrl(aws, "bkt", "k"), "https://bkt.s3.eu-west-1.amazonaws.com/k");
  EXPECT_THAT(S3RequestUrl(S3Endpoint{"ftp://x", ""}, "bkt", "k"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("endpoint_url 'ftp://x'")));
}

TEST(S3XmlTest, ReadsElementsAndEntities) {
  const std::string xml =
      "<R><Contents><Key>a&amp;b&#x41;&#66;</Key><Size>3</Size></Contents><Contents><Key>c</Key></Contents>"
      "<KeyCount>2</KeyCount><Empty/></R>";
  const auto contents = XmlElements(xml, "Contents");
  ASSERT_EQ(contents.size(), 2u);
  EXPECT_EQ(XmlText(contents[0], "Key"), "a&bAB");
  EXPECT_EQ(XmlText(xml, "KeyCount"), "2");  // not confused with <Key>
  EXPECT_EQ(XmlElements(xml, "Empty").size(), 1u);
  EXPECT_EQ(XmlText("<A>unterminated", "A"), "");
  EXPECT_EQ(XmlEscape("<a&'\">"), "&lt;a&amp;&apos;&quot;&gt;");
}

TEST(AwsCredentialsTest, EnvironmentFirst) {
  auto c = LoadAwsCredentials(FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"},
                                       {"AWS_SECRET_ACCESS_KEY", "SK"},
                                       {"AWS_SESSION_TOKEN", "TOK"},
                                       {"AWS_PROFILE", "nope"}}));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->access_key_id, "AK");
  EXPECT_EQ(c->secret_access_key, "SK");
  EXPECT_EQ(c->session_token, "TOK");
  EXPECT_THAT(LoadAwsCredentials(FakeEnv({{"AWS_ACCESS_KEY_ID", "AK"}})),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("AWS_SECRET_ACCESS_KEY")));
  EXPECT_EQ(RegionFromEnv(FakeEnv({{"AWS_DEFAULT_REGION", "eu-west-1"}})), "eu-west-1");
  EXPECT_EQ(RegionFromEnv(FakeEnv({{"AWS_REGION", "ap-south-1"}, {"AWS_DEFAULT_REGION", "x"}})),
            "ap-south-1");
}

TEST(AwsCredentialsTest, ProfilesOfTheSharedFile) {
  testing::TempDir dir("awscred");
  const std::string file = dir.path() + "/credentials";
  testing::WriteWholeFile(
      file,
      "# comment\n[default]\naws_access_key_id = DEFKEY\naws_secret_access_key = defsecret\n\n"
      "[work]\naws_access_key_id=WORKKEY\naws_secret_access_key=worksecret\n"
      "aws_session_token = worktoken\n[half]\naws_access_key_id = HALF\n[broken]\nnot a pair\n");
  auto def = LoadAwsCredentials(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}}));
  ASSERT_TRUE(def.ok()) << def.status().ToString();
  EXPECT_EQ(def->access_key_id, "DEFKEY");
  EXPECT_EQ(def->secret_access_key, "defsecret");
  auto work = LoadAwsCredentials(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "work"}}));
  ASSERT_TRUE(work.ok()) << work.status().ToString();
  EXPECT_EQ(work->secret_access_key, "worksecret");
  EXPECT_EQ(work->session_token, "worktoken");
  // The home folder's file when no file is named.
  std::filesystem::create_directories(dir.path() + "/home/.aws");
  testing::WriteWholeFile(dir.path() + "/home/.aws/credentials",
                          "[default]\naws_access_key_id=H\naws_secret_access_key=h\n");
  auto home = LoadAwsCredentials(FakeEnv({{"HOME", dir.path() + "/home"}}));
  ASSERT_TRUE(home.ok()) << home.status().ToString();
  EXPECT_EQ(home->access_key_id, "H");

  EXPECT_THAT(LoadAwsCredentials(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "other"}})),
              StatusIs(StatusCode::kNotFound, HasSubstr("no profile [other]")));
  EXPECT_THAT(LoadAwsCredentials(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "half"}})),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("must both be set")));
  EXPECT_THAT(LoadAwsCredentials(FakeEnv({{"AWS_SHARED_CREDENTIALS_FILE", file}, {"AWS_PROFILE", "broken"}})),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr(file + ":13: expected")));
  EXPECT_THAT(LoadAwsCredentials(FakeEnv({{"HOME", dir.path() + "/nohome"}})),
              StatusIs(StatusCode::kNotFound, HasSubstr("AWS_ACCESS_KEY_ID")));
}

// One strict moto server for the suite (each test uses its own bucket).
class S3ServerTest : public testing::S3SuiteTest<S3ServerTest> {
 protected:
  void SetUp() override {
    S3SuiteTest::SetUp();
    if (HasFatalFailure()) return;
    client_ = NewClient("us-east-1");
  }
  S3Client& s3() { return *client_; }

  std::unique_ptr<S3Client> client_;
};

TEST_F(S3ServerTest, ObjectsRangesListingsAndDeletes) {
  ASSERT_TRUE(s3().CreateBucket("objects").ok());
  ASSERT_TRUE(s3().CreateBucket("objects").ok());  // ours already: fine
  ASSERT_TRUE(s3().PutObject("objects", "dir/hello.txt", "hello world 0123456789").ok());
  auto head = s3().HeadObject("objects", "dir/hello.txt");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->size, 22u);
  EXPECT_EQ(head->etag, Md5Hex("hello world 0123456789"));
  EXPECT_EQ(*s3().GetObject("objects", "dir/hello.txt"), "hello world 0123456789");
  std::string part;
  ASSERT_TRUE(s3().GetRange("objects", "dir/hello.txt", 6, 5,
                            [&](std::string_view d) {
                              part.append(d);
                              return true;
                            })
                  .ok());
  EXPECT_EQ(part, "world");
  EXPECT_THAT(s3().GetObject("objects", "dir/hello.txt", 4),
              StatusIs(StatusCode::kOutOfRange, HasSubstr("larger")));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(s3().PutObject("objects", "many/" + std::to_string(i), "x").ok());
  auto listed = s3().ListObjects("objects", "many/", /*page_size=*/2);  // three pages
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 5u);
  EXPECT_EQ((*listed)[0].key, "many/0");
  EXPECT_EQ((*listed)[4].key, "many/4");
  EXPECT_EQ((*listed)[4].size, 1u);
  ASSERT_TRUE(s3().DeleteObject("objects", "many/3").ok());
  ASSERT_TRUE(s3().DeleteObject("objects", "many/3").ok());  // idempotent
  EXPECT_EQ(s3().ListObjects("objects", "many/")->size(), 4u);
  EXPECT_THAT(s3().HeadObject("objects", "many/3"),
              StatusIs(StatusCode::kNotFound, HasSubstr("s3://objects/many/3")));
  EXPECT_THAT(s3().GetObject("objects", "nothing"),
              StatusIs(StatusCode::kNotFound, HasSubstr("s3://objects/nothing: GET: HTTP 404 NoSuchKey")));
}

TEST_F(S3ServerTest, ClearErrors) {
  EXPECT_THAT(
      s3().PutObject("no-such-bucket", "k", "x"),
      StatusIs(StatusCode::kNotFound, HasSubstr("s3://no-such-bucket/k: PUT: HTTP 404 NoSuchBucket")));
  EXPECT_THAT(s3().ListObjects("no-such-bucket", ""),
              StatusIs(StatusCode::kNotFound, HasSubstr("NoSuchBucket")));
  const std::string secret = "wrong-secret-7f3a9c";
  S3Client wrong(S3Endpoint{server_->endpoint(), ""},
                 AwsCredentials{server_->access_key(), secret, "", "test"});
  const Status denied = wrong.PutObject("objects", "k", "x");
  EXPECT_THAT(denied, StatusIs(StatusCode::kPermissionDenied, HasSubstr("SignatureDoesNotMatch")));
  EXPECT_THAT(denied.message(), Not(HasSubstr(secret)));
  S3Client unknown(S3Endpoint{server_->endpoint(), ""},
                   AwsCredentials{"AKIANOSUCHKEY0000000", secret, "", "t"});
  EXPECT_THAT(unknown.HeadObject("objects", "dir/hello.txt"),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("HTTP 403")));
  // Nothing listens on the port: a refused connection, after the retries.
  S3Client down(S3Endpoint{"http://127.0.0.1:" + std::to_string(FreeTcpPort()), ""},
                AwsCredentials{"AK", secret, "", "test"});
  const Status refused = down.PutObject("objects", "k", "x");
  EXPECT_THAT(refused, StatusIs(StatusCode::kUnavailable, HasSubstr("s3://objects/k: PUT")));
  EXPECT_THAT(refused.message(), Not(HasSubstr(secret)));
}

TEST_F(S3ServerTest, MultipartUploadInParallelIsVerifiedAndReadableByAwsCli) {
  ASSERT_TRUE(s3().CreateBucket("multi").ok());
  testing::TempDir dir("s3multi");
  const std::string data = RandomBytes((12u << 20) + 12345, 7), src = dir.path() + "/big.bin";
  testing::WriteWholeFile(src, data);
  TransferOptions opt;
  opt.part_size = 5u << 20;
  opt.parallel = 3;
  TransferStats stats;
  ASSERT_TRUE(UploadFile(s3(), "multi", "run/big.bin", src, opt, &stats).ok());
  EXPECT_EQ(stats.parts, 3);
  EXPECT_EQ(stats.bytes_sent, data.size());
  auto head = s3().HeadObject("multi", "run/big.bin");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->size, data.size());
  EXPECT_THAT(head->etag, ::testing::EndsWith("-3"));  // a multipart object of three parts
  // A real S3 client sees the same bytes.
  auto env = server_->ClientEnv();
  auto ls = testing::RunCommand(
      {"/usr/bin/aws", "--endpoint-url", server_->endpoint(), "s3", "ls", "--recursive", "s3://multi/"}, env);
  ASSERT_EQ(ls.exit_code, 0) << ls.output;
  EXPECT_THAT(ls.output, HasSubstr(std::to_string(data.size()) + " run/big.bin"));
  auto cp = testing::RunCommand({"/usr/bin/aws", "--endpoint-url", server_->endpoint(), "s3", "cp",
                                 "s3://multi/run/big.bin", dir.path() + "/aws.bin", "--only-show-errors"},
                                env);
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_EQ(testing::ReadWholeFile(dir.path() + "/aws.bin"), data);
  // So does s3cmd.
  testing::WriteWholeFile(dir.path() + "/s3cfg", "");
  const std::string host = server_->endpoint().substr(std::string("http://").size());
  auto get = testing::RunCommand(
      {"/usr/bin/s3cmd", "-c", dir.path() + "/s3cfg", "--host=" + host, "--host-bucket=" + host, "--no-ssl",
       "--access_key=" + server_->access_key(), "--secret_key=" + server_->secret_key(), "--region=us-east-1",
       "get", "--force", "s3://multi/run/big.bin", dir.path() + "/s3cmd.bin"});
  ASSERT_EQ(get.exit_code, 0) << get.output;
  EXPECT_EQ(testing::ReadWholeFile(dir.path() + "/s3cmd.bin"), data);
  // And ours reads what awscli wrote.
  testing::WriteWholeFile(dir.path() + "/small.txt", "from aws\n");
  cp = testing::RunCommand({"/usr/bin/aws", "--endpoint-url", server_->endpoint(), "s3", "cp",
                            dir.path() + "/small.txt", "s3://multi/from-aws.txt", "--only-show-errors"},
                           env);
  ASSERT_EQ(cp.exit_code, 0) << cp.output;
  EXPECT_EQ(*s3().GetObject("multi", "from-aws.txt"), "from aws\n");
}

TEST_F(S3ServerTest, InterruptedMultipartUploadIsInvisibleAndResumed) {
  ASSERT_TRUE(s3().CreateBucket("resume-up").ok());
  testing::TempDir dir("s3resume");
  const std::string data = RandomBytes((11u << 20), 9), src = dir.path() + "/w.bin";
  testing::WriteWholeFile(src, data);
  // An earlier upload that stopped after its first part.
  auto id = s3().CreateMultipartUpload("resume-up", "w.bin");
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(s3().UploadPart("resume-up", "w.bin", *id, 1, std::string_view(data).substr(0, 5u << 20)).ok());
  EXPECT_THAT(s3().HeadObject("resume-up", "w.bin"), StatusIs(StatusCode::kNotFound, HasSubstr("w.bin")));
  EXPECT_TRUE(s3().ListObjects("resume-up", "")->empty());
  TransferOptions opt;
  opt.part_size = 5u << 20;
  TransferStats stats;
  ASSERT_TRUE(UploadFile(s3(), "resume-up", "w.bin", src, opt, &stats).ok());
  EXPECT_EQ(stats.bytes_resumed, 5u << 20);
  EXPECT_EQ(stats.bytes_sent, data.size() - (5u << 20));
  EXPECT_EQ(*s3().GetObject("resume-up", "w.bin"), data);
  EXPECT_TRUE(s3().ListMultipartUploads("resume-up", "")->empty());
}

TEST_F(S3ServerTest, RangedDownloadIsVerifiedAndResumed) {
  ASSERT_TRUE(s3().CreateBucket("down").ok());
  testing::TempDir dir("s3down");
  const std::string data = RandomBytes((13u << 20) + 7, 11), src = dir.path() + "/src.bin";
  testing::WriteWholeFile(src, data);
  TransferOptions opt;
  opt.part_size = 5u << 20;
  opt.parallel = 3;
  ASSERT_TRUE(UploadFile(s3(), "down", "m.bin", src, opt).ok());
  const std::string sha = Sha256Hex(data), dest = dir.path() + "/out.bin";
  // An earlier download that got its first block.
  testing::WriteWholeFile(dest + ".part", data.substr(0, 5u << 20));
  RangeLog log(dest + ".part.ranges", data.size(), sha, 5u << 20);
  ASSERT_TRUE(log.Start().ok());
  ASSERT_TRUE(log.Append(0).ok());
  log.Close();
  TransferStats stats;
  ASSERT_TRUE(DownloadFile(s3(), "down", "m.bin", data.size(), sha, dest, opt, &stats).ok());
  EXPECT_EQ(stats.bytes_resumed, 5u << 20);
  EXPECT_EQ(stats.bytes_sent, data.size() - (5u << 20));
  EXPECT_EQ(testing::ReadWholeFile(dest), data);
  EXPECT_FALSE(std::filesystem::exists(dest + ".part"));
  EXPECT_FALSE(std::filesystem::exists(dest + ".part.ranges"));
  // A manifest that does not match the object: nothing is left behind.
  const std::string other = dir.path() + "/other.bin";
  EXPECT_THAT(DownloadFile(s3(), "down", "m.bin", data.size(), std::string(64, 'a'), other, opt),
              StatusIs(StatusCode::kDataLoss, HasSubstr("sha256")));
  EXPECT_THAT(DownloadFile(s3(), "down", "m.bin", 5, sha, other, opt),
              StatusIs(StatusCode::kDataLoss, HasSubstr("the manifest says 5")));
  EXPECT_FALSE(std::filesystem::exists(other));
  EXPECT_FALSE(std::filesystem::exists(other + ".part"));
}

// The link drops in the middle of a download (a relay in front of the server closes the connection
// after 7 MiB, and every connection after it): the error names the object, the request and the
// cause; the completed 5 MiB range is kept, and the next download fetches only the rest.
TEST_F(S3ServerTest, DroppedConnectionMidDownloadIsClearAndTheNextDownloadResumes) {
  ASSERT_TRUE(s3().CreateBucket("drop").ok());
  testing::TempDir dir("s3drop");
  const std::string data = RandomBytes((13u << 20) + 5, 12), src = dir.path() + "/src.bin";
  testing::WriteWholeFile(src, data);
  TransferOptions opt;
  opt.part_size = 5u << 20;
  opt.parallel = 1;  // ranges in order: the first is whole before the link drops
  ASSERT_TRUE(UploadFile(s3(), "drop", "m.bin", src, opt).ok());
  const std::string& ep = server_->endpoint();
  testing::TcpRelay relay(std::stoi(ep.substr(ep.rfind(':') + 1)), 7u << 20);
  ASSERT_GT(relay.port(), 0);
  S3Client cut(S3Endpoint{"http://127.0.0.1:" + std::to_string(relay.port()), "us-east-1"},
               AwsCredentials{server_->access_key(), server_->secret_key(), "", "test"});
  const std::string sha = Sha256Hex(data), dest = dir.path() + "/out.bin";
  EXPECT_THAT(DownloadFile(cut, "drop", "m.bin", data.size(), sha, dest, opt),
              StatusIs(StatusCode::kUnavailable, HasSubstr("s3://drop/m.bin: GET http://127.0.0.1:")));
  EXPECT_EQ(relay.down(), 7u << 20);
  EXPECT_FALSE(std::filesystem::exists(dest));
  TransferStats stats;
  ASSERT_TRUE(DownloadFile(s3(), "drop", "m.bin", data.size(), sha, dest, opt, &stats).ok());
  EXPECT_EQ(stats.bytes_resumed, 5u << 20);
  EXPECT_EQ(stats.bytes_sent, data.size() - (5u << 20));
  EXPECT_EQ(testing::ReadWholeFile(dest), data);
}

}  // namespace
}  // namespace sftctl
