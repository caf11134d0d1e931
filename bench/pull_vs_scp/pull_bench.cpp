// pull_bench: the sftctl side of bench/pull_vs_scp/run.sh. Connects to sftd through ConnectOverSsh
// (the real SSH transport) and either
//   setup --mb N              submits a stub-trainer job whose checkpoint holds an N MiB model.bin and
//                             prints "JOB <id>" and "FILE <absolute path on the host>" once it is done;
//   pull --job ID --path REL --out FILE
//                             times ListArtifacts + PullArtifact of REL into FILE with sha256
//                             verification (what `sftctl pull` does), and prints one JSON line;
//   upload --file FILE        times what `sftctl submit` does to send a data file: sha256 of FILE, then
//                             StatBlob + UploadBlob through the client's UploadFile; prints one JSON line.
//                             (Run setup first or not: the blob store is the agent's, not a job's.)
// Common flags: --host user@127.0.0.1:port -i KEY --known-hosts FILE --sftd PATH --data-dir DIR
//               [--transport auto|forward|bridge]
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "client/remote/agent_session.h"
#include "client/remote/ssh/remote_agent.h"
#include "client/transfer/uploader.h"
#include "common/sha256.h"

namespace {

using SteadyClock = std::chrono::steady_clock;
namespace v1 = sftctl::v1;

double Seconds(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int Usage() {
  std::cerr
      << "usage: pull_bench --host H -i KEY --known-hosts F --sftd P --data-dir D [--transport T]\n"
         "                  (setup --mb N | pull --job ID --path REL --out FILE | upload --file FILE)\n";
  return 2;
}

int Fail(const std::string& what) {
  std::cerr << "pull_bench: " << what << "\n";
  return 1;
}

// What `sftctl submit` does for one data file: hash it, then make sure the agent holds its blob.
int Upload(const sftctl::client::ConnectOptions& o, const std::string& file) {
  auto t0 = SteadyClock::now();
  auto sha = sftctl::Sha256File(file);
  if (!sha.ok()) return Fail(sha.status().ToString());
  auto t_hashed = SteadyClock::now();
  auto conn = sftctl::client::ConnectOverSsh(o);
  if (!conn.ok()) return Fail(conn.status().ToString());
  auto t_connected = SteadyClock::now();
  const std::string via = (*conn)->description();
  sftctl::client::Reconnector rc(std::make_unique<sftctl::client::AgentSession>(std::move(*conn)),
                                 sftctl::client::MakeSessionFactory(o));
  struct stat st {};
  ::stat(file.c_str(), &st);
  const auto size = static_cast<uint64_t>(st.st_size);
  sftctl::client::UploadStats stats;
  sftctl::Status s = sftctl::client::UploadFile(&rc, file, size, *sha, nullptr, &stats);
  auto t_done = SteadyClock::now();
  if (!s.ok()) return Fail(s.ToString());
  if (stats.bytes_sent != size)
    return Fail("sent " + std::to_string(stats.bytes_sent) + " of " + std::to_string(size));
  double mib = static_cast<double>(size) / (1 << 20);
  nlohmann::json j = {{"bytes", size},
                      {"hash_s", Seconds(t0, t_hashed)},
                      {"connect_s", Seconds(t_hashed, t_connected)},
                      {"transfer_s", Seconds(t_connected, t_done)},
                      {"total_s", Seconds(t0, t_done)},
                      {"transfer_mib_s", mib / Seconds(t_connected, t_done)},
                      {"via", via}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sftctl::client::ConnectOptions o;
  std::string mode, job, path, out;
  long long mb = 1024;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--host")
      o.host = next();
    else if (a == "-i")
      o.identity_file = next();
    else if (a == "--known-hosts")
      o.known_hosts_file = next();
    else if (a == "--sftd")
      o.sftd = next();
    else if (a == "--data-dir")
      o.agent_data_dir = next();
    else if (a == "--transport") {
      std::string t = next();
      o.transport = t == "bridge"    ? sftctl::client::Transport::kBridge
                    : t == "forward" ? sftctl::client::Transport::kForward
                                     : sftctl::client::Transport::kAuto;
    } else if (a == "--mb")
      mb = std::atoll(next().c_str());
    else if (a == "--job")
      job = next();
    else if (a == "--path")
      path = next();
    else if (a == "--out")
      out = next();
    else if (a == "--file")
      path = next();
    else if (a == "setup" || a == "pull" || a == "upload")
      mode = a;
    else
      return Usage();
  }
  if (o.host.empty() || mode.empty()) return Usage();
  o.start_agent = false;  // run.sh starts it with the stub trainer
  o.ssh_config_file = "/dev/null";

  if (mode == "upload") return Upload(o, path);
  auto t0 = SteadyClock::now();
  auto conn = sftctl::client::ConnectOverSsh(o);
  if (!conn.ok()) return Fail(conn.status().ToString());
  auto t_connected = SteadyClock::now();
  auto stub = (*conn)->NewStub();
  auto ctx = [&] {
    auto c = std::make_unique<grpc::ClientContext>();
    (*conn)->Authorize(c.get());
    return c;
  };

  if (mode == "setup") {
    v1::SubmitJobRequest r;
    nlohmann::json spec = {{"output_dir", "x"}};  // a valid spec; the stub's requests in model.config.stub
    spec["model"]["config"]["stub"] = {{"steps", 1}, {"step_ms", 1}, {"model_bytes", mb << 20}};
    spec["data"]["train"] = nlohmann::json::array({"train.jsonl"});
    r.set_spec_json(spec.dump());
    v1::Job j;
    grpc::Status s = stub->SubmitJob(ctx().get(), r, &j);
    if (!s.ok()) return Fail("SubmitJob: " + s.error_message());
    auto deadline = SteadyClock::now() + std::chrono::minutes(5);
    for (;;) {
      v1::GetJobRequest g;
      g.set_job_id(j.id());
      s = stub->GetJob(ctx().get(), g, &j);
      if (!s.ok()) return Fail("GetJob: " + s.error_message());
      if (j.state() == v1::SUCCEEDED) break;
      if (j.state() == v1::FAILED || j.state() == v1::CANCELLED) return Fail("job failed: " + j.reason());
      if (SteadyClock::now() > deadline) return Fail("job did not finish");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    std::cout << "JOB " << j.id() << "\nFILE " << j.job_dir() << "/run/checkpoint-000001/model.bin\n";
    std::cout << "REL run/checkpoint-000001/model.bin\n";
    return 0;
  }

  // pull: list (the agent hashes the file once and caches it), then stream into `out`, verifying.
  v1::ListArtifactsRequest lr;
  lr.set_job_id(job);
  v1::ListArtifactsResponse list;
  grpc::Status s = stub->ListArtifacts(ctx().get(), lr, &list);
  if (!s.ok()) return Fail("ListArtifacts: " + s.error_message());
  auto t_listed = SteadyClock::now();
  int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Fail("cannot create " + out + ": " + std::strerror(errno));
  v1::PullArtifactRequest pr;
  pr.set_job_id(job);
  pr.set_path(path);
  auto c = ctx();
  auto reader = stub->PullArtifact(c.get(), pr);
  v1::ArtifactChunk chunk;
  sftctl::Sha256 h;
  std::string want;
  uint64_t bytes = 0, total = 0;
  while (reader->Read(&chunk)) {
    if (chunk.offset() == 0) {
      want = chunk.sha256();
      total = chunk.total_size();
    }
    const std::string& d = chunk.data();
    h.Update(d);
    for (size_t off = 0; off < d.size();) {
      ssize_t n = ::write(fd, d.data() + off, d.size() - off);
      if (n <= 0) return Fail("write " + out + ": " + std::strerror(errno));
      off += static_cast<size_t>(n);
    }
    bytes += d.size();
  }
  s = reader->Finish();
  ::close(fd);
  auto t_done = SteadyClock::now();
  if (!s.ok()) return Fail("PullArtifact: " + s.error_message());
  std::string got = h.HexDigest();
  if (bytes != total || got != want) return Fail("verification failed: sha256 " + got + " != " + want);
  double mib = static_cast<double>(bytes) / (1 << 20);
  nlohmann::json j = {{"bytes", bytes},
                      {"connect_s", Seconds(t0, t_connected)},
                      {"list_s", Seconds(t_connected, t_listed)},
                      {"transfer_s", Seconds(t_listed, t_done)},
                      {"total_s", Seconds(t0, t_done)},
                      {"transfer_mib_s", mib / Seconds(t_listed, t_done)},
                      {"total_mib_s", mib / Seconds(t0, t_done)},
                      {"via", (*conn)->description()},
                      {"sha256", got}};
  std::cout << j.dump() << "\n";
  return 0;
}
