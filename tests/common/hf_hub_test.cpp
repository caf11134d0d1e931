// common/hf_hub + common/http_client + common/hub_spec against a fake Hub on 127.0.0.1
// (tests/util/fake_hub.py): the cache layout, resume after a dropped connection, verification,
// gated repositories and where the token goes, 404s, and no content requests for a cached snapshot.
#include "common/hub/hf_hub.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "common/hub/hub_spec.h"
#include "common/os/file_lock.h"
#include "common/sha256.h"
#include "common/spec/spec.h"
#include "tests/util/fake_hub.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl {
namespace {

using ::sftctl::testing::FakeHub;
using ::sftctl::testing::ReadWholeFile;
using ::sftctl::testing::StatusIs;
using ::sftctl::testing::TempDir;
using ::sftctl::testing::WriteWholeFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

std::string Sha1Hex(const std::string& data) {
  unsigned char d[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(data.data()), data.size(), d);
  std::string hex;
  char buf[3];
  for (unsigned char c : d) {
    std::snprintf(buf, sizeof(buf), "%02x", c);
    hex += buf;
  }
  return hex;
}

// The git blob id the Hub sends as ETag of a non-LFS file.
std::string GitBlobSha1(const std::string& data) {
  return Sha1Hex("blob " + std::to_string(data.size()) + std::string(1, '\0') + data);
}

class HfHubTest : public ::testing::Test {
 protected:
  static constexpr size_t kWeights = 300000;
  static constexpr const char* kToken = "hf_test_secret_token";
  const std::string kConfig = R"({"model_type": "qwen2"})";
  const std::string kTokenizer = R"({"model": {}})";

  void SetUp() override {
    std::mt19937 rng(7);
    weights_.resize(kWeights);
    for (auto& c : weights_) c = static_cast<char>(rng());
    const std::string model = tmp_.path() + "/repo-model";
    WriteWholeFile(model + "/config.json", kConfig);
    WriteWholeFile(model + "/tokenizer.json", kTokenizer);
    WriteWholeFile(model + "/model.safetensors", weights_);
    WriteWholeFile(model + "/pytorch_model.bin", "other weights format");
    WriteWholeFile(model + "/README.md", "# tiny");
    WriteWholeFile(tmp_.path() + "/repo-data/sft/train.jsonl", "{\"text\": \"hi\"}\n");
    config_ = {{"token", kToken},
               {"repos",
                {{"org/tiny", {{"dir", model}}},
                 {"org/gated", {{"dir", model}, {"gated", true}}},
                 {"datasets/org/data", {{"dir", tmp_.path() + "/repo-data"}}}}}};
    cache_ = tmp_.path() + "/cache";
  }

  void StartHub() { ASSERT_TRUE(hub_.Start(tmp_.path(), config_)); }

  HubOptions Options(const std::string& token = "") {
    HubOptions o;
    o.endpoint = hub_.url();
    o.cache_dir = cache_;
    o.token = token;
    return o;
  }

  StatusOr<HubSnapshot> Download(const std::string& text, const std::string& token = "") {
    SFT_ASSIGN_OR_RETURN(HubRef ref, ParseHubRef(text));
    HubDownloader d(Options(token));
    return d.Download(ref);
  }

  TempDir tmp_{"hf-hub"};
  FakeHub hub_;
  nlohmann::json config_;
  std::string cache_;
  std::string weights_;
};

TEST(HubRefTest, ParsesModelsDatasetsRevisionsAndPaths) {
  auto m = ParseHubRef("hf://Qwen/Qwen2.5-1.5B-Instruct");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->dataset);
  EXPECT_EQ(m->repo_id, "Qwen/Qwen2.5-1.5B-Instruct");
  EXPECT_EQ(m->revision, "main");
  EXPECT_EQ(m->path, "");
  auto d = ParseHubRef("hf://datasets/org/name@v1.0/sub/train.jsonl");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->dataset);
  EXPECT_EQ(d->repo_id, "org/name");
  EXPECT_EQ(d->revision, "v1.0");
  EXPECT_EQ(d->path, "sub/train.jsonl");
  EXPECT_EQ(d->PageUrl("https://huggingface.co"), "https://huggingface.co/datasets/org/name");
}

TEST(HubRefTest, RefusesMalformedReferencesNamingThem) {
  EXPECT_THAT(ParseHubRef("hf://onlyname"),
              StatusIs(StatusCode::kInvalidArgument,
                       "Hub reference 'hf://onlyname': names no ORG/NAME "
                       "(expected hf://[datasets/]ORG/NAME[@REVISION][/PATH])"));
  EXPECT_THAT(ParseHubRef("hf://org/name@/x"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("empty revision after '@'")));
  EXPECT_THAT(
      ParseHubRef("hf://org/na me"),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("'na me' has a character the Hub does not allow")));
  EXPECT_THAT(ParseHubRef("hf://org/name/../../etc/passwd"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("hf://org/name/../../etc/passwd")));
}

TEST(HubRefTest, PatternsAndDefaultFileChoice) {
  EXPECT_TRUE(HubPatternMatch("*.json", "config.json"));
  EXPECT_TRUE(HubPatternMatch("model-0000?-of-*.safetensors", "model-00001-of-00002.safetensors"));
  EXPECT_FALSE(HubPatternMatch("*.json", "model.safetensors"));
  EXPECT_TRUE(HubFileWanted("model-00001-of-00002.safetensors"));
  EXPECT_TRUE(HubFileWanted("tokenizer_config.json"));
  EXPECT_FALSE(HubFileWanted("pytorch_model.bin"));
  EXPECT_FALSE(HubFileWanted("README.md"));
}

TEST_F(HfHubTest, ModelLandsInTheStandardCacheLayout) {
  StartHub();
  auto snap = Download("hf://org/tiny");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  const std::string commit = Sha1Hex("models/org/tiny");
  const std::string repo = cache_ + "/models--org--tiny";
  EXPECT_EQ(snap->commit, commit);
  EXPECT_EQ(snap->folder, repo + "/snapshots/" + commit);
  EXPECT_EQ(snap->path, snap->folder);
  EXPECT_THAT(snap->files, ElementsAre("config.json", "model.safetensors", "tokenizer.json"));
  EXPECT_EQ(snap->files_downloaded, 3);
  EXPECT_EQ(ReadWholeFile(repo + "/refs/main"), commit);

  const std::string weights_sha = Sha256Hex(weights_);
  const std::string config_etag = GitBlobSha1(kConfig);
  std::vector<std::string> blobs;
  for (const auto& e : fs::directory_iterator(repo + "/blobs")) blobs.push_back(e.path().filename().string());
  std::sort(blobs.begin(), blobs.end());
  std::vector<std::string> want = {weights_sha, config_etag, GitBlobSha1(kTokenizer)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(blobs, want);  // no .incomplete left, no other weight format
  EXPECT_EQ(fs::read_symlink(snap->folder + "/model.safetensors").string(), "../../blobs/" + weights_sha);
  EXPECT_EQ(fs::read_symlink(snap->folder + "/config.json").string(), "../../blobs/" + config_etag);
  EXPECT_EQ(ReadWholeFile(snap->folder + "/model.safetensors"), weights_);
  EXPECT_FALSE(fs::exists(snap->folder + "/pytorch_model.bin"));
  EXPECT_FALSE(fs::exists(snap->folder + "/README.md"));
}

TEST_F(HfHubTest, DroppedConnectionResumesWithRangeFetchingOnlyTheRest) {
  config_["drop_once"] = {{"model.safetensors", 100000}};
  StartHub();
  auto snap = Download("hf://org/tiny");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  std::vector<nlohmann::json> cdn;
  for (const auto& e : hub_.Log())
    if (e["port"] == "cdn") cdn.push_back(e);
  ASSERT_EQ(cdn.size(), 2u);
  EXPECT_TRUE(cdn[0]["range"].is_null());
  EXPECT_EQ(cdn[0]["bytes"], 100000);
  EXPECT_EQ(cdn[1]["range"], "bytes=100000-");
  EXPECT_EQ(cdn[1]["status"], 206);
  EXPECT_EQ(cdn[1]["bytes"], kWeights - 100000);
  EXPECT_EQ(hub_.CdnBytes(), kWeights);  // every byte once
  EXPECT_EQ(snap->bytes_downloaded, kWeights + kConfig.size() + kTokenizer.size());
  EXPECT_EQ(Sha256File(snap->folder + "/model.safetensors").value(), Sha256Hex(weights_));
}

// Another client (a second job, Python's huggingface_hub) holds the blob's lock in the HF cache:
// the download waits without touching the blob, then finds it whole and only links it.
TEST_F(HfHubTest, WaitsForAnotherDownloadersLockAndReusesItsBlob) {
  StartHub();
  const std::string weights_sha = Sha256Hex(weights_);
  const std::string repo = cache_ + "/models--org--tiny";
  fs::create_directories(cache_ + "/.locks/models--org--tiny");
  auto locked = FileLock::Acquire(cache_ + "/.locks/models--org--tiny/" + weights_sha + ".lock");
  ASSERT_TRUE(locked.ok()) << locked.status().ToString();
  std::optional<FileLock> other(std::move(*locked));
  std::vector<std::string> progress;  // read once the download's thread is joined
  std::promise<void> waiting;         // it reported waiting for the lock
  bool told = false;
  StatusOr<HubSnapshot> snap = InternalError("not run");
  std::thread t([&] {
    HubOptions o = Options();
    o.progress = [&](const std::string& file, uint64_t, uint64_t) {
      if (progress.empty() || progress.back() != file) progress.push_back(file);
      if (!told && file == "model.safetensors (waiting for another download)") {
        told = true;
        waiting.set_value();
      }
    };
    HubDownloader d(o);
    snap = d.Download(*ParseHubRef("hf://org/tiny"));
  });
  // Blocked on the lock (no timed sleep): nothing may have been written for the blob.
  EXPECT_EQ(waiting.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_FALSE(fs::exists(repo + "/blobs/" + weights_sha + ".incomplete"));  // it waits, writes nothing
  WriteWholeFile(repo + "/blobs/" + weights_sha, weights_);                  // the other client finishes
  other.reset();                                                             // and lets go
  t.join();
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(snap->files_downloaded, 2);  // config.json and tokenizer.json; the weights were linked
  EXPECT_EQ(hub_.CdnBytes(), 0u);        // no content request for the weights
  EXPECT_EQ(ReadWholeFile(snap->folder + "/model.safetensors"), weights_);
  EXPECT_THAT(progress, ::testing::Contains("model.safetensors (waiting for another download)"));
}

// Two downloaders of one repository at once: each blob is fetched once, both snapshots are whole.
TEST_F(HfHubTest, TwoConcurrentDownloadsFetchEachBlobOnce) {
  StartHub();
  StatusOr<HubSnapshot> a = InternalError("not run"), b = InternalError("not run");
  std::thread ta([&] { a = Download("hf://org/tiny"); });
  std::thread tb([&] { b = Download("hf://org/tiny"); });
  ta.join();
  tb.join();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->files_downloaded + b->files_downloaded, 3);
  EXPECT_EQ(hub_.CdnBytes(), kWeights);  // every byte of the weights once
  EXPECT_EQ(ReadWholeFile(b->folder + "/model.safetensors"), weights_);
}

TEST_F(HfHubTest, CorruptedContentIsRefusedAndNotKept) {
  config_["corrupt"] = {"model.safetensors"};
  StartHub();
  auto snap = Download("hf://org/tiny");
  std::string bad = weights_;
  bad[0] = static_cast<char>(bad[0] ^ 0xFF);
  EXPECT_THAT(
      snap, StatusIs(StatusCode::kDataLoss, "hf://org/tiny: 'model.safetensors' is corrupted: sha256 " +
                                                Sha256Hex(bad) + " but the Hub says " + Sha256Hex(weights_) +
                                                "; the partial download was deleted, run it again"));
  const std::string blobs = cache_ + "/models--org--tiny/blobs/";
  EXPECT_FALSE(fs::exists(blobs + Sha256Hex(weights_)));
  EXPECT_FALSE(fs::exists(blobs + Sha256Hex(weights_) + ".incomplete"));
}

TEST_F(HfHubTest, GatedRepositoryNeedsTheTokenWhichGoesOnlyToTheHub) {
  StartHub();
  EXPECT_THAT(
      Download("hf://org/gated"),
      StatusIs(StatusCode::kPermissionDenied,
               "hf://org/gated: model org/gated is gated and no token was sent: accept the licence at " +
                   hub_.url() + "/org/gated and set HF_TOKEN (or run `huggingface-cli login`)"));
  EXPECT_THAT(Download("hf://org/gated", "hf_wrong"),
              StatusIs(StatusCode::kPermissionDenied, HasSubstr("the token sent was refused")));
  const size_t before = hub_.Log().size();
  auto snap = Download("hf://org/gated", kToken);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  const auto log = hub_.Log();
  int hub_requests = 0, cdn_requests = 0;
  for (size_t i = before; i < log.size(); ++i) {
    if (log[i]["port"] == "hub") {
      ++hub_requests;
      EXPECT_EQ(log[i]["auth"], std::string("Bearer ") + kToken) << log[i].dump();
    } else {
      ++cdn_requests;
      EXPECT_TRUE(log[i]["auth"].is_null()) << "token sent to another origin: " << log[i].dump();
    }
  }
  EXPECT_EQ(hub_requests, 1 + 3 + 2);  // listing, 3 HEADs, GETs of the 2 non-LFS files
  EXPECT_EQ(cdn_requests, 1);
}

TEST_F(HfHubTest, SecondDownloadMakesNoContentRequests) {
  StartHub();
  ASSERT_TRUE(Download("hf://org/tiny").ok());
  const size_t before = hub_.Log().size();
  auto again = Download("hf://org/tiny");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->files_downloaded, 0);
  EXPECT_EQ(again->bytes_downloaded, 0u);
  const auto log = hub_.Log();
  for (size_t i = before; i < log.size(); ++i) {
    const std::string path = log[i]["path"];
    EXPECT_TRUE(log[i]["method"] == "HEAD" || path.rfind("/api/", 0) == 0) << log[i].dump();
  }
  EXPECT_EQ(log.size() - before, 4u);  // the listing and one HEAD per file
}

TEST_F(HfHubTest, NotFoundNamesRepositoryRevisionOrFile) {
  StartHub();
  EXPECT_THAT(Download("hf://org/missing"),
              StatusIs(StatusCode::kNotFound, HasSubstr("hf://org/missing: listing the repository: model "
                                                        "org/missing not found at " +
                                                        hub_.url() + "/org/missing")));
  EXPECT_THAT(Download("hf://org/tiny@v9"),
              StatusIs(StatusCode::kNotFound, "hf://org/tiny@v9: revision 'v9' not found in org/tiny"));
  EXPECT_THAT(Download("hf://datasets/org/data/sft/nope.jsonl"),
              StatusIs(StatusCode::kNotFound,
                       "hf://datasets/org/data/sft/nope.jsonl: no file 'sft/nope.jsonl' "
                       "in org/data at revision 'main'"));
}

// A spec as the table's parse reads it (no folder: paths as written).
JobSpec SpecFrom(const nlohmann::json& j) {
  auto spec = ParseSpec(j);
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return spec.ok() ? *spec : JobSpec();
}

TEST_F(HfHubTest, DatasetFileAndSpecFieldsResolveToCachedPaths) {
  StartHub();
  JobSpec spec =
      SpecFrom({{"model", {{"path", "hf://org/tiny"}}},
                {"data", {{"train", {"hf://datasets/org/data/sft/train.jsonl", "/local/eval.jsonl"}}}}});
  const auto paths = HubPaths(spec);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0].json_pointer, "/model/path");
  EXPECT_EQ(paths[1].json_pointer, "/data/train/0");
  HubDownloader d(Options());
  ASSERT_TRUE(ResolveHubSpec(&spec, &d).ok());
  EXPECT_TRUE(HubPaths(spec).empty());
  const std::string data_commit = Sha1Hex("datasets/org/data");
  EXPECT_EQ(spec.model.path, cache_ + "/models--org--tiny/snapshots/" + Sha1Hex("models/org/tiny"));
  EXPECT_EQ(spec.data.train[0],
            cache_ + "/datasets--org--data/snapshots/" + data_commit + "/sft/train.jsonl");
  EXPECT_EQ(spec.data.train[1], "/local/eval.jsonl");
  EXPECT_EQ(ReadWholeFile(spec.data.train[0]), "{\"text\": \"hi\"}\n");
  EXPECT_EQ(fs::read_symlink(cache_ + "/datasets--org--data/snapshots/" + data_commit + "/sft/train.jsonl")
                .string(),
            "../../../blobs/" + Sha256Hex("{\"text\": \"hi\"}\n"));
}

// `tokenizer: hf://...` takes only the tokenizer's files; so does model.path when the caller needs
// no weights (`inspect-data`).
TEST_F(HfHubTest, TokenizerReferencesTakeOnlyTheTokenizersFiles) {
  StartHub();
  JobSpec spec = SpecFrom({{"model", {{"path", "hf://org/tiny"}}},
                           {"tokenizer", "hf://org/tiny"},
                           {"data", {{"train", "t.jsonl"}}}});
  const auto paths = HubPaths(spec);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0].json_pointer, "/tokenizer");  // the table's order: tokenizer before the model section
  EXPECT_EQ(paths[0].field, "tokenizer");
  EXPECT_EQ(paths[0].what, SpecHub::kTokenizer);
  EXPECT_EQ(paths[1].what, SpecHub::kModel);
  HubDownloader d(Options());
  ASSERT_TRUE(ResolveHubSpec(&spec, &d, /*tokenizer_only=*/true).ok());
  const std::string snapshot = cache_ + "/models--org--tiny/snapshots/" + Sha1Hex("models/org/tiny");
  EXPECT_EQ(spec.tokenizer, snapshot);
  EXPECT_EQ(spec.model.path, snapshot);
  EXPECT_EQ(ReadWholeFile(snapshot + "/tokenizer.json"), kTokenizer);
  EXPECT_EQ(ReadWholeFile(snapshot + "/config.json"), kConfig);
  EXPECT_FALSE(fs::exists(snapshot + "/model.safetensors"));
  EXPECT_EQ(hub_.CdnBytes(), 0u);  // the weights (the only LFS file) were never fetched
}

// A full disk while the content is written: the file system's error, nothing linked.
class FullDisk : public ForwardingFileSystem {
 public:
  using ForwardingFileSystem::ForwardingFileSystem;
  StatusOr<std::unique_ptr<AppendableFile>> NewAppendableFile(const std::string& path) override {
    return ResourceExhaustedError("cannot write '" + path + "': No space left on device");
  }
};

TEST_F(HfHubTest, DiskErrorsNameThePathAndLinkNothing) {
  StartHub();
  FullDisk full(FileSystem::Default());
  HubOptions o = Options();
  o.fs = &full;
  HubDownloader d(o);
  auto snap = d.Download(ParseHubRef("hf://org/tiny").value());
  const std::string etag = GitBlobSha1(kConfig);
  EXPECT_THAT(snap, StatusIs(StatusCode::kResourceExhausted, "hf://org/tiny: 'config.json': cannot write '" +
                                                                 cache_ + "/models--org--tiny/blobs/" + etag +
                                                                 ".incomplete': No space left on device"));
  EXPECT_FALSE(fs::exists(cache_ + "/models--org--tiny/snapshots"));
}

// A CDN that sends more than the X-Linked-Size the Hub declared: the download stops at the declared
// size (nothing past it is written, however long the answer) and keeps nothing.
TEST_F(HfHubTest, ContentPastTheDeclaredSizeIsNeverWritten) {
  config_["oversize"] = {{"model.safetensors", 4 << 20}};
  StartHub();
  uint64_t most = 0;
  HubOptions o = Options();
  o.progress = [&](const std::string& file, uint64_t done, uint64_t) {
    if (file == "model.safetensors") most = std::max(most, done);
  };
  HubDownloader d(o);
  auto snap = d.Download(*ParseHubRef("hf://org/tiny"));
  EXPECT_THAT(snap, StatusIs(StatusCode::kDataLoss,
                             HasSubstr("hf://org/tiny: 'model.safetensors': the content runs past the 300000 "
                                       "bytes the Hub declared for it")));
  EXPECT_LE(most, kWeights);
  const std::string blobs = cache_ + "/models--org--tiny/blobs/";
  EXPECT_FALSE(fs::exists(blobs + Sha256Hex(weights_)));
  EXPECT_FALSE(fs::exists(blobs + Sha256Hex(weights_) + ".incomplete"));
}

// A chunked body overrides Content-Length for libcurl; the client still stops at the declared length.
TEST_F(HfHubTest, HttpBodyStopsAtItsContentLengthEvenWhenChunked) {
  config_["chunked_oversize"] = {{"model.safetensors", 8 << 20}};
  StartHub();
  HttpRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(hub_.cdn_port()) + "/cdn/" + Sha256Hex(weights_);
  uint64_t received = 0;
  auto r = CurlHttpClient()->Send(req, [&](std::string_view data) {
    received += data.size();
    return true;
  });
  EXPECT_THAT(
      r, StatusIs(StatusCode::kDataLoss, HasSubstr("the body runs past 300000 bytes (its Content-Length)")));
  EXPECT_EQ(received, kWeights);
}

// A collected body (no sink) stops at max_body_bytes; DATA_LOSS, and nothing past it is kept.
TEST_F(HfHubTest, CollectedBodyStopsAtTheRequestsLimit) {
  StartHub();
  HttpRequest req;
  req.url = "http://127.0.0.1:" + std::to_string(hub_.cdn_port()) + "/cdn/" + Sha256Hex(weights_);
  req.max_body_bytes = 1000;
  auto r = CurlHttpClient()->Send(req);
  EXPECT_THAT(r, StatusIs(StatusCode::kDataLoss,
                          HasSubstr("the body runs past 1000 bytes (the most this request accepts)")));
  req.max_body_bytes = 0;
  auto whole = CurlHttpClient()->Send(req);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->body, weights_);
}

// A redirect may only lead to http or https: not to a local file, whatever the Hub or CDN says.
TEST_F(HfHubTest, RedirectsToOtherSchemesAreRefused) {
  const std::string secret = tmp_.path() + "/secret.txt";
  WriteWholeFile(secret, "the laptop's private file");
  StartHub();
  for (const std::string& to :
       {"file://localhost" + secret, "FILE://localhost" + secret, std::string("ftp://127.0.0.1:9/x")}) {
    HttpRequest req;
    req.url = hub_.url() + "/bounce?to=" + UrlEncode(to, false);
    auto r = CurlHttpClient()->Send(req);
    EXPECT_THAT(r,
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("only http:// and https:// are followed")))
        << to;
    if (r.ok()) {
      EXPECT_EQ(r->body.find("private"), std::string::npos);
    }
  }
  HttpRequest direct;
  direct.url = "file://localhost" + secret;
  EXPECT_THAT(CurlHttpClient()->Send(direct),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("not an http:// or https:// URL")));
}

// An error response's body goes to HttpResponse::body, not the sink, when the request says so
// (S3 explains its errors there), and only then.
TEST_F(HfHubTest, AnErrorBodyIsCollectedInsteadOfSunkWhenAsked) {
  StartHub();
  HttpRequest req;
  req.url = hub_.url() + "/api/models/org/no-such-model";
  std::string sunk;
  const HttpSink sink = [&](std::string_view data) {
    sunk.append(data);
    return true;
  };
  auto plain = CurlHttpClient()->Send(req, sink);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->status, 404);
  EXPECT_THAT(sunk, HasSubstr("RepoNotFound"));
  sunk.clear();
  req.collect_error_body = true;
  auto collected = CurlHttpClient()->Send(req, sink);
  ASSERT_TRUE(collected.ok()) << collected.status().ToString();
  EXPECT_EQ(collected->status, 404);
  EXPECT_EQ(sunk, "");
  EXPECT_THAT(collected->body, HasSubstr("RepoNotFound"));
}

// A SigV4-signed request carries libcurl's AWS4 Authorization header (the key id, never the
// secret), only to its own origin: a redirect to another one goes unsigned. DELETE is sent as such.
TEST_F(HfHubTest, SignedRequestsAreSignedOnlyForTheirOrigin) {
  StartHub();
  const std::string secret = "wJalrXUtnFEMI-secret";
  HttpRequest req;
  req.url =
      hub_.url() + "/bounce?to=" +
      UrlEncode("http://127.0.0.1:" + std::to_string(hub_.cdn_port()) + "/cdn/" + Sha256Hex(weights_), false);
  req.aws_sigv4 = AwsSigV4{"aws:amz:us-east-1:s3", "AKIDEXAMPLE", secret};
  req.headers = {{"x-amz-content-sha256", "UNSIGNED-PAYLOAD"}};
  const size_t before = hub_.Log().size();
  auto r = CurlHttpClient()->Send(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->body, weights_);
  const auto log = hub_.Log();
  ASSERT_EQ(log.size(), before + 2);
  const std::string auth = log[before]["auth"].is_string() ? log[before]["auth"].get<std::string>() : "";
  EXPECT_THAT(auth, HasSubstr("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"));
  EXPECT_THAT(auth, Not(HasSubstr(secret)));
  EXPECT_TRUE(log[before + 1]["auth"].is_null()) << "signed for another origin: " << log[before + 1].dump();
  HttpRequest del;
  del.method = "DELETE";
  del.url = hub_.url() + "/api/models/org/tiny";
  auto d = CurlHttpClient()->Send(del);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->status, 501) << "the fake answers DELETE as a method it does not implement";
}

// The Hub's answer for a file points at a local file: refused, and nothing of it reaches the cache.
TEST_F(HfHubTest, AContentLocationOutsideHttpIsRefused) {
  const std::string secret = tmp_.path() + "/secret.txt";
  WriteWholeFile(secret, "the laptop's private file");
  config_["redirect"] = {{"config.json", "file://localhost" + secret}};
  StartHub();
  EXPECT_THAT(Download("hf://org/tiny"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("hf://org/tiny: 'config.json': not an http:// or https:// URL")));
  EXPECT_FALSE(fs::exists(cache_ + "/models--org--tiny/snapshots"));
  for (const auto& e : fs::recursive_directory_iterator(cache_)) {
    if (e.is_regular_file()) {
      EXPECT_NE(ReadWholeFile(e.path().string()), "the laptop's private file") << e.path();
    }
  }
}

TEST(HubOptionsTest, EnvironmentNamesEndpointCacheAndToken) {
  TempDir tmp("hf-env");
  WriteWholeFile(tmp.path() + "/home/token", "hf_from_file\n");
  ::setenv("HF_HOME", (tmp.path() + "/home").c_str(), 1);
  ::setenv("HF_ENDPOINT", "http://127.0.0.1:9/", 1);
  ::unsetenv("HF_HUB_CACHE");
  ::unsetenv("HF_TOKEN");
  ::unsetenv("HF_TOKEN_PATH");
  HubOptions o = HubOptionsFromEnvironment();
  EXPECT_EQ(o.endpoint, "http://127.0.0.1:9");
  EXPECT_EQ(o.cache_dir, tmp.path() + "/home/hub");
  EXPECT_EQ(o.token, "hf_from_file");
  ::setenv("HF_TOKEN", "hf_from_env", 1);
  ::setenv("HF_HUB_CACHE", "/elsewhere", 1);
  o = HubOptionsFromEnvironment();
  EXPECT_EQ(o.token, "hf_from_env");
  EXPECT_EQ(o.cache_dir, "/elsewhere");
  for (const char* v : {"HF_HOME", "HF_ENDPOINT", "HF_TOKEN", "HF_HUB_CACHE"}) ::unsetenv(v);
}

TEST(HttpClientTest, UrlHelpers) {
  EXPECT_EQ(UrlOrigin("HTTP://Example.com:8080/a/b?c"), "http://example.com:8080");
  EXPECT_EQ(UrlOrigin("/relative"), "");
  EXPECT_EQ(ResolveUrl("http://h:1/a/b/c?x", "/cdn/z"), "http://h:1/cdn/z");
  EXPECT_EQ(ResolveUrl("http://h:1/a/b/c", "d"), "http://h:1/a/b/d");
  EXPECT_EQ(ResolveUrl("http://h:1/a", "https://cdn/x"), "https://cdn/x");
  EXPECT_EQ(UrlEncode("refs/pr 1", false), "refs%2Fpr%201");
  EXPECT_EQ(UrlEncode("a b/c.json", true), "a%20b/c.json");
}

}  // namespace
}  // namespace sftctl
