// The remote commands over SSH, against a real OpenSSH sshd on 127.0.0.1 (tests/ssh/sshd_fixture.h)
// and the real sftd/sftctl-trainer behind it: with port forwarding, through `sftd bridge` when the
// server refuses forwarding, and across dropped tunnels (pull resumes, logs -f has no gap or repeat).
#include <gtest/gtest.h>

#include <algorithm>

#include "tests/remote/remote_test_util.h"
#include "tests/ssh/sshd_fixture.h"
#include "tests/util/fake_hub.h"

namespace sftctl::remotetest {
namespace {

using sshtest::SshdFixture;
using sshtest::SshdOptions;

class RemoteSsh : public ::testing::Test {
 protected:
  void StartSshd(SshdOptions opts = {}) {
    auto s = SshdFixture::Start(opts);
    ASSERT_TRUE(s.ok()) << s.status().message();
    sshd_ = std::move(*s);
    sftctl_ = std::make_unique<Sftctl>(sshd_->home());
    work_ = tmp_.path() + "/work";
  }
  // Host options for every command.
  std::vector<std::string> Host() const {
    return {"--host",           sshd_->host(),          "-i", sshd_->user_key(), "--sftd", Sftd(),
            "--agent-data-dir", sshd_->agent_data_dir()};
  }
  // sftd on the host; with LogSftdCalls, a wrapper that appends each command's verb to sftd_calls_
  // ("status --with-token" when it asks for the token too). `refuse_with_token` makes it an sftd
  // older than that flag: it refuses it as CLI11 does an unknown option.
  std::string Sftd() const { return sftd_wrapper_.empty() ? sshd_->sftd_path() : sftd_wrapper_; }
  void LogSftdCalls(bool refuse_with_token = false) {
    sftd_wrapper_ = tmp_.path() + "/sftd-logged";
    sftd_calls_ = tmp_.path() + "/sftd-calls";
    const std::string refuse =
        refuse_with_token
            ? "[ -n \"$t\" ] && { echo 'The following argument was not expected: --with-token' >&2; "
              "exit 109; }\n"
            : "";
    WriteWholeFile(sftd_wrapper_,
                   "#!/bin/sh\nt=\ncase \" $* \" in *' --with-token '*) t=' --with-token';; esac\n"
                   "echo \"$1$t\" >> '" +
                       sftd_calls_ + "'\n" + refuse + "exec '" + sshd_->sftd_path() + "' \"$@\"\n");
    std::filesystem::permissions(sftd_wrapper_, std::filesystem::perms::owner_all);
  }
  std::vector<std::string> With(std::vector<std::string> args, const std::vector<std::string>& more) const {
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }
  std::string AgentRunFile(const std::string& job, const std::string& rel) const {
    return sshd_->agent_data_dir() + "/jobs/" + job + "/run/" + rel;
  }
  // submit (JSON) -> job id.
  std::string Submit(const std::string& spec, const std::vector<std::string>& extra = {}) {
    Result r = sftctl_->Run(With(With({"submit", spec, "--json", "--cpu-ranks", "1"}, Host()), extra));
    EXPECT_EQ(r.exit_code, 0) << r.All();
    return r.Json().value("job", "");
  }
  // pull into `out`; every pulled file equals the agent's copy.
  void PullAndCompare(const std::string& job, const std::string& out) {
    Result r = sftctl_->Run({"pull", job, "-o", out, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.All();
    const auto files = ListFiles(out);
    ASSERT_GE(files.size(), 4u);
    for (const auto& f : files) EXPECT_EQ(Sha(out + "/" + f), Sha(AgentRunFile(job, f))) << f;
    EXPECT_TRUE(std::filesystem::exists(
        out + "/" + r.Json()["checkpoint"].get<std::string>().substr(out.size() + 1) + "/model.safetensors"))
        << r.All();
  }

  TempDir tmp_;
  std::unique_ptr<SshdFixture> sshd_;
  std::unique_ptr<Sftctl> sftctl_;
  std::string work_;
  std::string sftd_wrapper_, sftd_calls_;
};

TEST_F(RemoteSsh, SubmitLogsPullWithForwardingAndResumeAPullAfterTheTunnelDrops) {
  StartSshd();
  LogSftdCalls();
  const std::string spec = WriteTinyJob(work_, 3);
  const std::string job = Submit(spec, {"--transport", "forward"});
  ASSERT_FALSE(job.empty());
  // The registry keeps the host options: no --host from here on.
  Result r = sftctl_->Run({"logs", "-f", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  std::string why;
  EXPECT_GT(CheckSeqs(r.JsonLines(), &why), 0) << why;
  const std::string out = tmp_.path() + "/pulled";
  PullAndCompare(job, out);

  // A big top-level file of the run, pulled as byte ranges over three SSH connections while the
  // tunnels are dropped under them: each range resumes from the byte it reached.
  std::string big(96 << 20, '\0');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>(i / 4096);
  WriteWholeFile(AgentRunFile(job, "big.bin"), big);
  const std::string part = out + "/big.bin.part";
  pid_t pid = sftctl_->Spawn({"pull", job, "-o", out, "--json", "--streams", "3"}, tmp_.path() + "/p1.out",
                             tmp_.path() + "/p1.err");
  // Drop once a block is complete (its index is in the .ranges sidecar after the header line), so
  // that a run which gives up leaves something for the rerun to keep, however slow the machine.
  bool done_at_drop = false;
  ASSERT_TRUE(WaitFor([&] {
    std::error_code ec;
    done_at_drop = std::filesystem::exists(out + "/big.bin", ec);
    const std::string ranges =
        std::filesystem::exists(part + ".ranges", ec) ? ReadWholeFile(part + ".ranges") : "";
    return std::count(ranges.begin(), ranges.end(), '\n') >= 2 || done_at_drop;
  })) << ReadWholeFile(tmp_.path() + "/p1.err");
  ASSERT_TRUE(sshd_->DropSessions().ok());
  const int first = Sftctl::Wait(pid);
  const std::string err1 = ReadWholeFile(tmp_.path() + "/p1.err");
  // It either resumed by itself (reconnect) or gave up with "cannot reach" (exit 4), keeping the .part.
  EXPECT_TRUE(first == 0 || first == 4) << first << "\n" << err1;
  r = sftctl_->Run({"pull", job, "-o", out, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(Sha(out + "/big.bin"), Sha256Hex(big));
  EXPECT_FALSE(std::filesystem::exists(part));
  if (first == 4) {
    // The rerun fetched only what the first run had not.
    EXPECT_LT(r.Json()["bytes_fetched"].get<uint64_t>(), big.size()) << r.All();
  } else {
    // The first run resumed by itself: nothing left to fetch.
    EXPECT_EQ(r.Json()["files_fetched"], 0) << r.All();
    if (!done_at_drop) {
      EXPECT_NE(err1.find("note: resumed after "), std::string::npos) << err1;
    }
    const nlohmann::json j1 = nlohmann::json::parse(ReadWholeFile(tmp_.path() + "/p1.out"), nullptr, false);
    EXPECT_LE(j1.value("bytes_fetched", uint64_t{0}), big.size() + 4096) << "restarted from zero?\n" << err1;
  }
  // Undisturbed, into a fresh folder: three connections, one verified copy. The host runs `sftd status`
  // once: the other two connections reuse what the first learned of the agent.
  const size_t calls_before = ReadWholeFile(sftd_calls_).size();
  r = sftctl_->Run({"pull", job, "-o", tmp_.path() + "/again", "--json", "--streams", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["streams"], 3) << r.All();
  EXPECT_EQ(Sha(tmp_.path() + "/again/big.bin"), Sha256Hex(big));
  // One remote command found the agent and its token.
  EXPECT_EQ(ReadWholeFile(sftd_calls_).substr(calls_before), "status --with-token\n");
}

// pull --follow over SSH across an agent restart: the follower's next connection finds the agent
// gone from the address it remembered, asks the host again (`sftd status`, which starts the agent
// anew on another port) and carries on. The job runs until it is cancelled, so the restart always
// lands while the follower is following.
TEST_F(RemoteSsh, PullFollowCarriesOnAcrossAnAgentRestart) {
  StartSshd();
  LogSftdCalls();
  const std::string spec = WriteTinyJob(work_, /*steps=*/10000000, /*checkpoint_interval=*/100);
  const std::string job = Submit(spec);
  ASSERT_FALSE(job.empty());
  const std::string dir = tmp_.path() + "/synced", out = tmp_.path() + "/follow.out",
                    err = tmp_.path() + "/follow.err";
  const pid_t pid =
      sftctl_->Spawn({"pull", job, "--follow", "--interval", "0.2", "-o", dir, "--json"}, out, err);
  auto pulls = [&] { return Result{0, ReadWholeFile(out), ""}.JsonLines().size(); };
  ASSERT_TRUE(WaitFor([&] { return pulls() >= 1; })) << ReadWholeFile(err);
  const size_t calls_before = ReadWholeFile(sftd_calls_).size();
  const CommandResult stop = RunCommand({sshd_->sftd_path(), "stop", "--data-dir", sshd_->agent_data_dir()});
  ASSERT_EQ(stop.exit_code, 0) << stop.output;
  const size_t before_restart = pulls();
  // It pulls newer checkpoints again: through a new connection to the restarted agent.
  EXPECT_TRUE(WaitFor([&] { return pulls() > before_restart + 1; })) << ReadWholeFile(err);
  Result r = sftctl_->Run({"cancel", job});
  EXPECT_EQ(r.exit_code, 0) << r.All();
  const Result follow = Sftctl::Finish(pid, out, err);
  EXPECT_EQ(follow.exit_code, 3) << follow.All();  // the job's state: CANCELLED
  EXPECT_NE(follow.err.find("reconnect"), std::string::npos) << follow.All();
  // The host was asked again, and the agent started again there.
  const std::string after = ReadWholeFile(sftd_calls_).substr(calls_before);
  EXPECT_NE(after.find("status --with-token\n"), std::string::npos) << after << follow.All();
  EXPECT_NE(after.find("start\n"), std::string::npos) << after << follow.All();
}

// The laptop's Hugging Face token goes to a host only when the user asks (--forward-hf-token), and
// stderr says which host gets it. Without the flag a gated hf:// download fails on the host with an
// error that names the flag, and the Hub the host uses (here a fake one, as a hostile host could set
// HF_ENDPOINT) never sees the token.
TEST_F(RemoteSsh, TheHfTokenGoesToAHostOnlyWithForwardHfToken) {
  StartSshd();
  const std::string token = "hf_laptop_token_93ad";
  WriteWholeFile(tmp_.path() + "/repo-data/train.jsonl", AdditionJsonl(48));
  ::sftctl::testing::FakeHub hub;
  ASSERT_TRUE(hub.Start(
      tmp_.path(),
      {{"token", token},
       {"repos", {{"datasets/org/data", {{"dir", tmp_.path() + "/repo-data"}, {"gated", true}}}}}}));
  // The host's agent downloads from the fake Hub.
  sftd_wrapper_ = tmp_.path() + "/sftd-hub";
  WriteWholeFile(sftd_wrapper_, "#!/bin/sh\nexport HF_ENDPOINT='" + hub.url() + "' HF_HOME='" + tmp_.path() +
                                    "/host-hf'\nexec '" + sshd_->sftd_path() + "' \"$@\"\n");
  std::filesystem::permissions(sftd_wrapper_, std::filesystem::perms::owner_all);
  sshtest::ScopedEnv laptop_token("HF_TOKEN", token.c_str());
  std::string spec = WriteTinyJob(work_, 2);
  std::string yaml = ReadWholeFile(spec);
  const std::string local_train = "train: data/train.jsonl";
  ASSERT_NE(yaml.find(local_train), std::string::npos) << yaml;
  WriteWholeFile(spec, yaml.replace(yaml.find(local_train), local_train.size(),
                                    "train: hf://datasets/org/data/train.jsonl"));
  auto token_seen = [&] {
    for (const auto& r : hub.Log()) {
      if (r.contains("auth") && r["auth"].is_string() &&
          r["auth"].get<std::string>().find(token) != std::string::npos)
        return true;
    }
    return false;
  };

  Result r = sftctl_->Run(With({"submit", spec, "--json", "--cpu-ranks", "1"}, Host()));
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.err.find("your Hugging Face token stays here"), std::string::npos) << r.All();
  const std::string job = r.Json().value("job", "");
  nlohmann::json st;
  ASSERT_TRUE(WaitFor([&] {
    st = sftctl_->Run({"status", job, "--json"}).Json();
    return st.value("state", "") == "FAILED";
  })) << st.dump();
  const std::string reason = st["nodes"][0].value("reason", "");
  EXPECT_NE(reason.find("is gated and no token was sent"), std::string::npos) << st.dump();
  EXPECT_NE(reason.find("sftctl submit --forward-hf-token"), std::string::npos) << st.dump();
  EXPECT_FALSE(hub.Log().empty());  // the host did ask the Hub
  EXPECT_FALSE(token_seen());

  r = sftctl_->Run(With({"submit", spec, "--json", "--cpu-ranks", "1", "--forward-hf-token"}, Host()));
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.err.find("sending your Hugging Face token to " + sshd_->host()), std::string::npos) << r.All();
  EXPECT_TRUE(WaitFor(token_seen)) << r.All();
  sftctl_->Run({"cancel", r.Json().value("job", "")});
}

// An sftd older than `status --with-token` (it refuses the flag) is asked again without it, and its
// token read with `cat`: submit, logs and list work as before.
TEST_F(RemoteSsh, AnSftdOlderThanWithTokenIsAskedAgainWithoutIt) {
  StartSshd();
  LogSftdCalls(/*refuse_with_token=*/true);
  const std::string job = Submit(WriteTinyJob(work_, 3));
  ASSERT_FALSE(job.empty());
  Result r = sftctl_->Run({"logs", "-f", job, "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.All();
  r = sftctl_->Run(With({"list", "--json"}, Host()));
  EXPECT_EQ(r.exit_code, 0) << r.All();
  EXPECT_NE(r.out.find(job), std::string::npos) << r.All();
  const std::string calls = ReadWholeFile(sftd_calls_);
  EXPECT_EQ(calls.rfind("status --with-token\nstatus\n", 0), 0u) << calls;
}

TEST_F(RemoteSsh, SubmitFollowAndPullThroughTheBridgeWhenForwardingIsRefused) {
  SshdOptions no_forwarding;
  no_forwarding.allow_tcp_forwarding = false;
  StartSshd(no_forwarding);
  const std::string spec = WriteTinyJob(work_, 3);
  // forward only: refused, and reported as unreachable.
  Result r = sftctl_->Run(With({"submit", spec, "--transport", "forward"}, Host()));
  EXPECT_EQ(r.exit_code, 4) << r.All();
  // auto falls back to `sftd bridge`; --follow streams until the job ends.
  r = sftctl_->Run(With({"submit", spec, "--json", "--cpu-ranks", "1", "--follow"}, Host()));
  ASSERT_EQ(r.exit_code, 0) << r.All();
  const auto lines = r.JsonLines();
  ASSERT_FALSE(lines.empty());
  const std::string job = lines.front()["job"];
  EXPECT_EQ(lines.back()["state"], "SUCCEEDED") << r.All();
  PullAndCompare(job, tmp_.path() + "/pulled");
  r = sftctl_->Run({"status", job, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.All();
  EXPECT_EQ(r.Json()["state"], "SUCCEEDED");
}

TEST_F(RemoteSsh, LogsFollowResumesAfterTheTunnelDropsWithNoGapOrDuplicate) {
  StartSshd();
  // Long enough (a few seconds on an idle machine) that the drop always lands mid-stream.
  const std::string spec = WriteTinyJob(work_, 6000);
  const std::string job = Submit(spec);
  ASSERT_FALSE(job.empty());
  const std::string out = tmp_.path() + "/logs.out", err = tmp_.path() + "/logs.err";
  pid_t pid = sftctl_->Spawn({"logs", "-f", job, "--json"}, out, err);
  // Drop the tunnel once steps are streaming.
  ASSERT_TRUE(WaitFor([&] { return ReadWholeFile(out).find("\"event\":\"step\"") != std::string::npos; }))
      << ReadWholeFile(err);
  ASSERT_TRUE(sshd_->DropSessions().ok());
  const int code = Sftctl::Wait(pid);
  Result r;
  r.exit_code = code;
  r.out = ReadWholeFile(out);
  r.err = ReadWholeFile(err);
  ASSERT_EQ(code, 0) << r.All();
  std::string why;
  const int64_t n = CheckSeqs(r.JsonLines(), &why);
  ASSERT_GT(n, 0) << why << "\n" << r.All();
  Result st = sftctl_->Run({"status", job, "--json"});
  ASSERT_EQ(st.exit_code, 0) << st.All();
  EXPECT_EQ(st.Json()["nodes"][0]["last_seq"].get<int64_t>(), n);
  EXPECT_EQ(r.JsonLines().back()["state"], "SUCCEEDED");
  EXPECT_NE(r.err.find("reconnect"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace sftctl::remotetest
