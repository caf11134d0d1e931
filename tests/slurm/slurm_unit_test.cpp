// The Slurm engine without a cluster: option checks, the rendered sbatch script, the parsers on
// outputs recorded from Slurm 22.05 (tests/slurm/slurm_cluster.sh), and SlurmCli's choice of
// sources over a CommandRunner that answers with recorded outputs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "agent/slurm/sbatch_script.h"
#include "agent/slurm/slurm_cli.h"
#include "agent/slurm/slurm_job.h"
#include "agent/slurm/slurm_options.h"
#include "agent/slurm/slurm_runner.h"
#include "agent/slurm/slurm_state.h"
#include "tests/util/file_util.h"
#include "tests/util/status_matchers.h"
#include "tests/util/temp_dir.h"

namespace sftctl::agent::slurm {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// Recorded from Slurm 22.05.8 (Debian 12).
constexpr const char* kScontrolPending =
    "JobId=5 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED NodeList= NumNodes=2-2 "
    "NumCPUs=2 NumTasks=2 WorkDir=/tmp/h5c/w StdOut=/tmp/h5c/w/out-5 Power= \n";
constexpr const char* kScontrolFailed =
    "JobId=5 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 "
    "Restarts=1 BatchFlag=1 Reboot=0 ExitCode=143:0 RunTime=00:00:01 TimeLimit=UNLIMITED "
    "NodeList=n[1-2] BatchHost=n1 NumNodes=2 NumCPUs=2 NumTasks=2 Power= \n";
constexpr const char* kBatchOutFailed =
    "srun: error: n2: task 1: Exited with exit code 3\n"
    "srun: launch/slurm: _step_signal: Terminating StepId=5.0\n"
    "srun: error: n1: task 0: Terminated\n"
    "srun: Force Terminated StepId=5.0\n";
constexpr const char* kPartitions =
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL Default=YES QoS=N/A "
    "Nodes=n[1-2] State=UP TotalCPUs=2 TotalNodes=2\n"
    "PartitionName=gpu AllowGroups=ALL Nodes=g[1-4] State=UP\n";

TEST(SlurmOptions, AcceptsTheUsualValues) {
  SlurmOptions o;
  o.nodes = 2;
  o.gpus_per_node = 8;
  o.partition = "gpu,debug";
  o.account = "lab-a";
  o.qos = "normal";
  o.time = "1-12:00:00";
  o.constraint = "a100&ib";
  o.extra_args = {"--exclusive", "--mem=0"};
  EXPECT_TRUE(ValidateSlurmOptions(o).ok());
  for (const char* t : {"30", "30:00", "4:00:00", "2-0", "2-12:30", "1-00:00:00", "UNLIMITED"})
    EXPECT_TRUE(IsSlurmTime(t)) << t;
}

TEST(SlurmOptions, RefusesWhatCannotGoIntoAnSbatchLine) {
  for (const char* t : {"", "1:2:3:4", "a", "1-", "-1", "1-1:2:3:4", "1:x"})
    EXPECT_FALSE(IsSlurmTime(t)) << t;
  SlurmOptions o;
  o.time = "tomorrow";
  EXPECT_THAT(ValidateSlurmOptions(o, "job.yaml"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job.yaml: slurm: field 'time': 'tomorrow'")));
  o = SlurmOptions();
  o.partition = "gpu; rm -rf ~";
  EXPECT_THAT(ValidateSlurmOptions(o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'partition'")));
  o = SlurmOptions();
  o.extra_args = {"--comment=a b"};
  EXPECT_THAT(ValidateSlurmOptions(o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'slurm_args'")));
  o.extra_args = {"-N3"};
  EXPECT_THAT(ValidateSlurmOptions(o), StatusIs(StatusCode::kInvalidArgument, HasSubstr("'-N3'")));
  o = SlurmOptions();
  o.nodes = 0;
  EXPECT_THAT(ValidateSlurmOptions(o), StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'nodes'")));
  o = SlurmOptions();
  o.gpus_per_node = 65;
  EXPECT_THAT(ValidateSlurmOptions(o),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'gpus_per_node'")));
  // The job's environment is the agent's choice (the rank allowlist), not an extra option's.
  for (const char* arg : {"--export=ALL", "--export", "--export-file=/tmp/env", "--get-user-env"}) {
    o = SlurmOptions();
    o.extra_args = {arg};
    EXPECT_THAT(ValidateSlurmOptions(o),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'slurm_args': '" + std::string(arg) +
                                                                 "' would change the job's environment")));
  }
  o.extra_args = {"--exclusive"};
  EXPECT_TRUE(ValidateSlurmOptions(o).ok());
}

SbatchJob Job() {
  return SbatchJob{"sftctl-job-7", "/shared/u/sftd/jobs/job-7", "/home/u/.local/bin/sftctl-trainer", {}};
}

TEST(SbatchScript, GpuJobHeaderAndOneRankPerGpu) {
  SlurmOptions o;
  o.nodes = 2;
  o.gpus_per_node = 8;
  o.partition = "gpu";
  o.account = "lab";
  o.qos = "high";
  o.time = "4:00:00";
  o.constraint = "a100";
  o.extra_args = {"--exclusive"};
  auto script = RenderSbatchScript(o, Job());
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  for (const char* line :
       {"#!/bin/bash\n",
        "#SBATCH --job-name=sftctl-job-7\n",
        "#SBATCH --nodes=2\n",
        "#SBATCH --ntasks-per-node=8\n",
        "#SBATCH --gpus-per-node=8\n",
        "#SBATCH --partition=gpu\n",
        "#SBATCH --account=lab\n",
        "#SBATCH --qos=high\n",
        "#SBATCH --time=4:00:00\n",
        "#SBATCH --constraint=a100\n",
        "#SBATCH --requeue\n",
        "#SBATCH --chdir=/shared/u/sftd/jobs/job-7\n",
        "#SBATCH --output=/shared/u/sftd/jobs/job-7/slurm/batch.out\n",
        "#SBATCH --open-mode=append\n",
        "#SBATCH --export=NONE\n",
        "#SBATCH --exclusive\n",
        "umask 077\n",
        "srun --export=ALL --kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=8 bash -c ",
        "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID LOCAL_WORLD_SIZE=8;",
        "exec \"$0\" train --spec spec.json --events-fd 3 >>\"logs/rank-$RANK.stdout\" "
        "2>>\"logs/rank-$RANK.stderr\" 3>>\"logs/rank-$RANK.events\"",
        " '/home/u/.local/bin/sftctl-trainer'\n",
        "scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1",
        "if [ \"${SLURMD_NODENAME:-}\" = \"$first\" ] && [ -r /proc/net/tcp ]; then\n",
        "    p=$((20000 + RANDOM % 10000))\n",
        "export MASTER_PORT=${MASTER_PORT:-$((20000 + (SLURM_JOB_ID + 7919 * restart) % 10000))}\n",
        "echo \"job=$SLURM_JOB_ID restart=$restart rc=$rc\" >>slurm/runs\n",
        "exit $rc\n"})
    EXPECT_THAT(*script, HasSubstr(line));
  // Every #SBATCH line comes before the first command (sbatch stops reading them there).
  EXPECT_LT(script->rfind("#SBATCH"), script->find("set -u"));
  // Nothing of sbatch's environment reaches the job (--export=NONE): the ranks' environment comes
  // from the job folder, sourced in it before the first command that needs PATH.
  const size_t cd = script->find("cd '/shared/u/sftd/jobs/job-7' || exit 1\n");
  const size_t sourced = script->find(". ./slurm/rank.env || exit 1\n");
  ASSERT_NE(sourced, std::string::npos) << *script;
  EXPECT_LT(cd, sourced);
  EXPECT_LT(sourced, script->find("mkdir -p logs slurm"));
  EXPECT_LT(sourced, script->find("scontrol"));
  // What the node adds (a login environment) is narrowed to Slurm's own and the rank allowlist, in
  // the batch script before the sourcing and again in each rank.
  const std::string narrow = "for v in $(compgen -e); do case $v in SLURM_*|SLURMD_NODENAME|";
  const size_t batch = script->find(narrow);
  EXPECT_LT(cd, batch);
  EXPECT_LT(batch, sourced);
  const size_t rank = script->find(narrow, sourced);
  ASSERT_NE(rank, std::string::npos);
  EXPECT_LT(script->find("srun --export=ALL"), rank);
  EXPECT_LT(rank, script->find("export RANK=$SLURM_PROCID"));
  EXPECT_THAT(script->substr(rank), HasSubstr("|PATH|HOME|"));
  EXPECT_THAT(script->substr(rank), HasSubstr("|NCCL_*|"));
  EXPECT_THAT(script->substr(rank),
              HasSubstr("|MASTER_ADDR|MASTER_PORT) ;; *) unset \"$v\" 2>/dev/null ;; esac; done"));
  EXPECT_THAT(*script, Not(HasSubstr("AWS_")));
  EXPECT_THAT(*script, Not(HasSubstr("LAMBDA_")));
}

TEST(SbatchScript, RankEnvHoldsTheAllowlistedEnvironmentQuotedWithoutWhatTheScriptSets) {
  EXPECT_EQ(RankEnvPath("/shared/jobs/job-7"), "/shared/jobs/job-7/slurm/rank.env");
  const std::string text = RenderRankEnv({"PATH=/usr/bin:/bin", "NCCL_DEBUG=it's info", "LC_ALL=C.UTF-8",
                                          "RANK=5", "MASTER_PORT=1", "CUDA_VISIBLE_DEVICES=0,1",
                                          "CUDA_HOME=/usr/local/cuda", "1BAD=x", "A.B=y", "NOVALUE"});
  EXPECT_THAT(text, HasSubstr("\nexport PATH='/usr/bin:/bin'\n"));
  EXPECT_THAT(text, HasSubstr("\nexport NCCL_DEBUG='it'\\''s info'\n"));
  EXPECT_THAT(text, HasSubstr("\nexport LC_ALL='C.UTF-8'\n"));
  EXPECT_THAT(text, HasSubstr("\nexport CUDA_HOME='/usr/local/cuda'\n"));
  for (const char* absent : {"RANK=", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "1BAD", "A.B", "NOVALUE"})
    EXPECT_THAT(text, Not(HasSubstr(absent))) << text;
  // A shell reads back exactly the values.
  ::sftctl::testing::TempDir dir;
  ::sftctl::testing::WriteWholeFile(dir.path() + "/rank.env", text);
  const std::string cmd =
      "env -i /bin/sh -c '. " + dir.path() + "/rank.env && printf %s \"$NCCL_DEBUG|$LC_ALL\"'";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, p);
  EXPECT_EQ(::pclose(p), 0);
  EXPECT_EQ(std::string(buf, n), "it's info|C.UTF-8");
}

TEST(SbatchScript, CpuJobHasNoGpuRequestAndOptionalLinesOnlyWhenGiven) {
  SlurmOptions o;
  o.nodes = 2;
  o.cpu_ranks_per_node = 2;
  o.requeue = false;
  auto script = RenderSbatchScript(o, Job());
  ASSERT_TRUE(script.ok());
  EXPECT_THAT(*script, HasSubstr("#SBATCH --ntasks-per-node=2\n"));
  EXPECT_THAT(*script, HasSubstr("#SBATCH --no-requeue\n"));
  EXPECT_THAT(*script, HasSubstr("LOCAL_WORLD_SIZE=2;"));
  for (const char* absent :
       {"--gpus-per-node", "--partition", "--account", "--qos", "--time", "--constraint"})
    EXPECT_THAT(*script, Not(HasSubstr(absent)));
}

TEST(SbatchScript, RefusesPathsAndNamesThatNeedQuoting) {
  SbatchJob job = Job();
  job.job_dir = "/shared/my jobs/job-7";
  EXPECT_THAT(RenderSbatchScript(SlurmOptions(), job),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job folder '/shared/my jobs/job-7'")));
  job = Job();
  job.job_dir = "/shared/%j";
  EXPECT_THAT(RenderSbatchScript(SlurmOptions(), job),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job folder")));
  job = Job();
  job.trainer = "sftctl-trainer";
  EXPECT_THAT(RenderSbatchScript(SlurmOptions(), job),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("is not an absolute path")));
  job = Job();
  job.job_name = "job 7";
  EXPECT_THAT(RenderSbatchScript(SlurmOptions(), job),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job name")));
  SlurmOptions bad;
  bad.qos = "a b";
  EXPECT_THAT(RenderSbatchScript(bad, Job()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("field 'qos'")));
}

TEST(SbatchScript, ShellQuoteAndExitRecords) {
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuote(""), "''");
  const std::string runs =
      "job=12 restart=0 rc=143\ngarbage\njob=9 restart=0 rc=0\njob=12 restart=1 rc=0\njob=12 x\n";
  auto rec = LastExitRecord(runs, "12");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->restart, 1);
  EXPECT_EQ(rec->exit_code, 0);
  EXPECT_EQ(LastExitRecord(runs, "9")->exit_code, 0);
  EXPECT_FALSE(LastExitRecord(runs, "1").has_value());
  EXPECT_FALSE(LastExitRecord("job=1 restart=0 rc=12345\n", "1").has_value());
}

TEST(SlurmParse, StatesInLongAndShortForm) {
  EXPECT_EQ(ParseSlurmState("PENDING"), SlurmState::kPending);
  EXPECT_EQ(ParseSlurmState("PD"), SlurmState::kPending);
  EXPECT_EQ(ParseSlurmState("CANCELLED by 1000"), SlurmState::kCancelled);
  EXPECT_EQ(ParseSlurmState("NODE_FAIL"), SlurmState::kNodeFail);
  EXPECT_EQ(ParseSlurmState("OUT_OF_MEMORY"), SlurmState::kOutOfMemory);
  EXPECT_EQ(ParseSlurmState("REQUEUE_HOLD"), SlurmState::kRequeued);
  EXPECT_EQ(ParseSlurmState("SPECIAL_EXIT"), SlurmState::kOther);
  EXPECT_TRUE(IsTerminal(SlurmState::kNodeFail));
  EXPECT_TRUE(IsTerminal(SlurmState::kTimeout));
  EXPECT_FALSE(IsTerminal(SlurmState::kRequeued));
  EXPECT_FALSE(IsTerminal(SlurmState::kCompleting));
  EXPECT_FALSE(IsTerminal(SlurmState::kOther));
}

TEST(SlurmParse, SbatchParsableSkipsWarnings) {
  EXPECT_EQ(*ParseSbatchParsable("42\n"), "42");
  EXPECT_EQ(*ParseSbatchParsable("sbatch: warning: can't honor --ntasks-per-node\n77;cluster2\n"), "77");
  EXPECT_THAT(ParseSbatchParsable("sbatch: error: Batch job submission failed\n"),
              StatusIs(StatusCode::kInternal, HasSubstr("printed no job id")));
}

TEST(SlurmParse, SqueueLines) {
  auto running = ParseSqueue("1|RUNNING|None|n[1-2]\n", "1");
  ASSERT_TRUE(running.has_value());
  EXPECT_EQ(running->state, SlurmState::kRunning);
  EXPECT_EQ(running->Describe(), "RUNNING on n[1-2]");
  EXPECT_EQ(running->source, "squeue");
  auto pending = ParseSqueue("5|PENDING|Resources|\n", "5");
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->Describe(), "PENDING (Resources)");
  EXPECT_FALSE(ParseSqueue("slurm_load_jobs error: Invalid job id specified\n", "5").has_value());
  EXPECT_FALSE(ParseSqueue("15|RUNNING|None|n1\n", "5").has_value());
}

TEST(SlurmParse, SacctTakesTheNewestRecordOfTheJob) {
  const std::string out = "8|NODE_FAIL|0:0|n[1-2]\n8|CANCELLED by 0|0:15|n[1-2]\n9|COMPLETED|0:0|n1\n";
  auto info = ParseSacct(out, "8");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, SlurmState::kCancelled);
  EXPECT_EQ(info->state_name, "CANCELLED");
  EXPECT_EQ(info->exit_signal, 15);
  EXPECT_EQ(info->source, "sacct");
  auto failed = ParseSacct("8|FAILED|2:0|n[1-2]\n", "8");
  EXPECT_EQ(failed->Describe(), "FAILED with exit code 2");
  EXPECT_FALSE(ParseSacct("Slurm accounting storage is disabled\n", "8").has_value());
}

TEST(SlurmParse, ScontrolOneLineRecord) {
  auto pending = ParseScontrolJob(kScontrolPending, "5");
  ASSERT_TRUE(pending.has_value());
  EXPECT_EQ(pending->Describe(), "PENDING (Resources)");
  EXPECT_EQ(pending->nodes, "");
  auto failed = ParseScontrolJob(kScontrolFailed, "5");
  ASSERT_TRUE(failed.has_value());
  EXPECT_EQ(failed->state, SlurmState::kFailed);
  EXPECT_EQ(failed->exit_code, 143);
  EXPECT_EQ(failed->restarts, 1);
  EXPECT_EQ(failed->nodes, "n[1-2]");
  EXPECT_EQ(failed->Describe(), "FAILED with exit code 143");
  EXPECT_FALSE(ParseScontrolJob(kScontrolFailed, "50").has_value());
  EXPECT_FALSE(ParseScontrolJob("slurm_load_jobs error: Invalid job id specified\n", "5").has_value());
}

TEST(SlurmParse, ExitCodesAndTaskFailures) {
  EXPECT_EQ(ParseExitCode("143:0"), std::make_pair(143, 0));
  EXPECT_EQ(ParseExitCode("0:15"), std::make_pair(0, 15));
  EXPECT_FALSE(ParseExitCode("143").has_value());
  EXPECT_FALSE(ParseExitCode("a:b").has_value());
  auto failures = ParseTaskFailures(kBatchOutFailed);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].node, "n2");
  EXPECT_EQ(failures[0].task, 1);
  EXPECT_EQ(failures[0].exit_code, 3);
}

// Answers each command with the outcome of the first rule whose key it contains; records them all.
class RecordedRunner : public CommandRunner {
 public:
  void On(const std::string& key, int exit_code, const std::string& output) {
    rules_.push_back({key, {exit_code, 0, false, 0, output}});
  }
  StatusOr<CommandOutcome> Run(const std::string& command, std::chrono::seconds) override {
    commands.push_back(command);
    for (const auto& [key, outcome] : rules_)
      if (command.find(key) != std::string::npos) return outcome;
    return CommandOutcome{127, 0, false, 0, "sh: 1: not recorded: " + command};
  }
  std::vector<std::string> commands;

 private:
  std::vector<std::pair<std::string, CommandOutcome>> rules_;
};

TEST(SlurmCli, RunsCommandsWithItsEnvironmentAndQuotedArguments) {
  RecordedRunner runner;
  runner.On("sbatch", 0, "12\n");
  SlurmCli cli(&runner, {"SLURM_CONF=/etc/my slurm.conf"});
  EXPECT_EQ(*cli.Submit("/shared/job-1/slurm/job.sbatch"), "12");
  ASSERT_EQ(runner.commands.size(), 1u);
  EXPECT_EQ(runner.commands[0],
            "env 'SLURM_CONF=/etc/my slurm.conf' 'sbatch' '--parsable' '/shared/job-1/slurm/job.sbatch'");
}

TEST(SlurmCli, PassesOnlySlurmConfFromTheAgentsEnvironment) {
  ::setenv("SLURM_CONF", "/etc/slurm/test.conf", 1);
  ::setenv("SQUEUE_FORMAT", "%i", 1);  // a user's default must not change what is parsed
  EXPECT_EQ(SlurmCli::EnvFromProcess(), std::vector<std::string>{"SLURM_CONF=/etc/slurm/test.conf"});
  ::unsetenv("SLURM_CONF");
  ::unsetenv("SQUEUE_FORMAT");
  EXPECT_TRUE(SlurmCli::EnvFromProcess().empty());
}

TEST(SlurmCli, SubmitRefusedQuotesSbatch) {
  RecordedRunner runner;
  runner.On("sbatch", 1,
            "sbatch: error: Batch job submission failed: Invalid account or account/partition combination "
            "specified\n");
  SlurmCli cli(&runner, {});
  EXPECT_THAT(cli.Submit("/j/job.sbatch"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("sbatch refused the job (exit code 1): 'sbatch: error: "
                                 "Batch job submission failed: Invalid account")));
}

TEST(SlurmCli, CheckReadyNamesTheMissingCommandAndTheUnknownPartition) {
  RecordedRunner no_slurm;
  SlurmCli cli(&no_slurm, {});
  EXPECT_THAT(cli.CheckReady(SlurmOptions()),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("this login node has no sbatch")));

  RecordedRunner runner;
  runner.On("command -v", 0, "/usr/bin/x\n");
  runner.On("'ping'", 0, "Slurmctld(primary) at vm is UP\n");
  runner.On("'partition' 'debug'", 0, kPartitions);
  runner.On("'partition' 'gpu'", 0, "PartitionName=gpu AllowGroups=ALL Nodes=g[1-4] State=UP\n");
  runner.On("'partition' 'a100'", 1, "Partition a100 not found\n");
  runner.On("'sinfo' '-h' '-o' '%R'", 0, "gpu\ndebug\ngpu\n");
  SlurmCli ok(&runner, {});
  SlurmOptions o;
  o.partition = "gpu";
  EXPECT_TRUE(ok.CheckReady(o).ok());
  o.partition = "debug";
  EXPECT_TRUE(ok.CheckReady(o).ok());
  o.partition = "gpu,a100";
  EXPECT_THAT(
      ok.CheckReady(o),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("field 'partition': unknown partition 'a100'; this cluster has: debug, gpu")));

  RecordedRunner down;
  down.On("command -v", 0, "/usr/bin/x\n");
  down.On("'ping'", 1, "Slurmctld(primary) at vm is DOWN\n");
  SlurmCli cli_down(&down, {});
  EXPECT_THAT(cli_down.CheckReady(SlurmOptions()), StatusIs(StatusCode::kUnavailable, HasSubstr("is DOWN")));
}

TEST(SlurmCli, LiveJobComesFromSqueueAlone) {
  RecordedRunner runner;
  runner.On("squeue", 0, "5|PENDING|Resources|\n");
  SlurmCli cli(&runner, {});
  auto info = cli.Query("5", "");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->Describe(), "PENDING (Resources)");
  EXPECT_EQ(info->note, "");
  EXPECT_EQ(runner.commands.size(), 1u);
  EXPECT_THAT(runner.commands[0], HasSubstr("'squeue' '-h' '-t' 'all' '-j' '5' '-o' '%A|%T|%r|%N'"));
}

TEST(SlurmCli, FinishedJobComesFromSacct) {
  RecordedRunner runner;
  runner.On("squeue", 1, "slurm_load_jobs error: Invalid job id specified\n");
  runner.On("sacct", 0, "5|TIMEOUT|0:0|n[1-2]\n");
  SlurmCli cli(&runner, {});
  auto info = cli.Query("5", "");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, SlurmState::kTimeout);
  EXPECT_EQ(info->source, "sacct");
  EXPECT_THAT(runner.commands[1],
              HasSubstr("'sacct' '-n' '-P' '-X' '-j' '5' '-o' 'JobIDRaw,State,ExitCode,NodeList'"));
}

TEST(SlurmCli, WithoutAccountingFallsBackToScontrolAndSaysSo) {
  ::sftctl::testing::TempDir dir;
  ::sftctl::testing::WriteWholeFile(dir.path() + "/slurm/batch.out", kBatchOutFailed);
  RecordedRunner runner;
  runner.On("squeue", 0, "5|FAILED|NonZeroExitCode|n[1-2]\n");
  runner.On("sacct", 1, "Slurm accounting storage is disabled\n");
  runner.On("scontrol", 0, kScontrolFailed);
  SlurmCli cli(&runner, {});
  auto info = cli.Query("5", dir.path());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->source, "scontrol");
  EXPECT_THAT(info->note, HasSubstr("no accounting storage"));
  EXPECT_THAT(info->note, HasSubstr("state from scontrol show job"));
  EXPECT_EQ(info->Describe(), "FAILED with exit code 3 (rank 1 on n2)");
}

TEST(SlurmCli, ForgottenJobComesFromTheJobFolder) {
  ::sftctl::testing::TempDir dir;
  ::sftctl::testing::WriteWholeFile(dir.path() + "/slurm/runs",
                                    "job=5 restart=0 rc=143\njob=5 restart=1 rc=0\n");
  RecordedRunner runner;
  runner.On("squeue", 1, "slurm_load_jobs error: Invalid job id specified\n");
  runner.On("sacct", 1, "Slurm accounting storage is disabled\n");
  runner.On("scontrol", 1, "slurm_load_jobs error: Invalid job id specified\n");
  SlurmCli cli(&runner, {});
  auto info = cli.Query("5", dir.path());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->Describe(), "COMPLETED");
  EXPECT_EQ(info->restarts, 1);
  EXPECT_EQ(info->source, "job folder");
  EXPECT_THAT(info->note, HasSubstr("state from the job folder's slurm/runs"));
  EXPECT_THAT(cli.Query("6", dir.path()), StatusIs(StatusCode::kNotFound, HasSubstr("Slurm knows no job 6")));
}

TEST(SlurmCli, UnreachableControllerIsUnavailable) {
  RecordedRunner runner;
  runner.On("squeue", 1, "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n");
  SlurmCli cli(&runner, {});
  EXPECT_THAT(cli.Query("5", ""),
              StatusIs(StatusCode::kUnavailable, HasSubstr("Unable to contact slurm controller")));
}

TEST(SlurmCli, CancelAcceptsAFinishedJob) {
  RecordedRunner runner;
  runner.On("'scancel' '5'", 0, "");
  runner.On("'scancel' '6'", 1,
            "scancel: error: Kill job error on job id 6: Job/step already completing or completed\n");
  runner.On("'scancel' '7'", 1, "scancel: error: Kill job error on job id 7: Access/permission denied\n");
  SlurmCli cli(&runner, {});
  EXPECT_TRUE(cli.Cancel("5").ok());
  EXPECT_TRUE(cli.Cancel("6").ok());
  EXPECT_THAT(cli.Cancel("7"), StatusIs(StatusCode::kInternal, HasSubstr("permission denied")));
}

TEST(SlurmJob, PhasesOfTheAgent) {
  EXPECT_EQ(PhaseOf(SlurmState::kPending), SlurmPhase::kWaiting);
  EXPECT_EQ(PhaseOf(SlurmState::kRequeued), SlurmPhase::kWaiting);
  EXPECT_EQ(PhaseOf(SlurmState::kOther), SlurmPhase::kWaiting);
  EXPECT_EQ(PhaseOf(SlurmState::kCompleting), SlurmPhase::kRunning);
  EXPECT_EQ(PhaseOf(SlurmState::kCompleted), SlurmPhase::kSucceeded);
  EXPECT_EQ(PhaseOf(SlurmState::kNodeFail), SlurmPhase::kFailed);
  EXPECT_EQ(PhaseOf(SlurmState::kTimeout), SlurmPhase::kFailed);
  EXPECT_EQ(PhaseOf(SlurmState::kCancelled), SlurmPhase::kCancelled);
}

TEST(SlurmJob, SubmitWritesTheScriptChecksFirstAndRecordsTheId) {
  ::sftctl::testing::TempDir dir;
  RecordedRunner runner;
  runner.On("command -v", 0, "/usr/bin/x\n");
  runner.On("'ping'", 0, "Slurmctld(primary) at vm is UP\n");
  runner.On("--test-only", 0,
            "sbatch: Job 3 to start at 2026-11-26T07:50:02 using 2 processors on nodes n[1-2]\n");
  runner.On("--parsable", 0, "31\n");
  SlurmCli cli(&runner, {});
  SlurmOptions o;
  o.nodes = 2;
  // Links planted where the agent writes: written around, never through.
  const std::string victim = dir.path() + "/victim";
  ::sftctl::testing::WriteWholeFile(victim, "victim\n");
  std::filesystem::create_directories(dir.path() + "/slurm");
  std::filesystem::create_symlink(victim, ScriptPath(dir.path()));
  std::filesystem::create_symlink(victim, ScriptPath(dir.path()) + ".tmp");
  std::filesystem::create_symlink(victim, RankEnvPath(dir.path()));
  auto id = SubmitJobFolder(
      cli, o, SbatchJob{"sftctl-job-1", dir.path(), "/usr/bin/sftctl-trainer", {"NCCL_DEBUG=INFO"}});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "31");
  EXPECT_EQ(*RecordedJobId(dir.path()), "31");
  EXPECT_THAT(::sftctl::testing::ReadWholeFile(ScriptPath(dir.path())), HasSubstr("#SBATCH --nodes=2\n"));
  EXPECT_THAT(::sftctl::testing::ReadWholeFile(RankEnvPath(dir.path())),
              HasSubstr("export NCCL_DEBUG='INFO'\n"));
  EXPECT_EQ(::sftctl::testing::ReadWholeFile(victim), "victim\n");
  for (const std::string& f :
       {ScriptPath(dir.path()), RankEnvPath(dir.path()), dir.path() + "/slurm/job_id"}) {
    EXPECT_FALSE(std::filesystem::is_symlink(f)) << f;
    EXPECT_EQ(std::filesystem::status(f).permissions(),
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
        << f;
  }
  for (const char* sub : {"/slurm", "/logs"})
    EXPECT_EQ(std::filesystem::status(dir.path() + sub).permissions(), std::filesystem::perms::owner_all)
        << sub;
  ASSERT_GE(runner.commands.size(), 2u);
  EXPECT_THAT(runner.commands[runner.commands.size() - 2], HasSubstr("'sbatch' '--test-only'"));
  EXPECT_THAT(runner.commands.back(), HasSubstr("'sbatch' '--parsable' '" + ScriptPath(dir.path()) + "'"));
}

TEST(SlurmJob, RefusedTestSubmitQueuesNothing) {
  ::sftctl::testing::TempDir dir;
  RecordedRunner runner;
  runner.On("command -v", 0, "/usr/bin/x\n");
  runner.On("'ping'", 0, "Slurmctld(primary) at vm is UP\n");
  runner.On("--test-only", 1, "allocation failure: Invalid qos specification\n");
  runner.On("--parsable", 0, "32\n");
  SlurmCli cli(&runner, {});
  EXPECT_THAT(SubmitJobFolder(cli, SlurmOptions(), SbatchJob{"j", dir.path(), "/t", {}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Invalid qos specification")));
  for (const std::string& c : runner.commands) EXPECT_THAT(c, Not(HasSubstr("--parsable")));
  EXPECT_THAT(RecordedJobId(dir.path()), StatusIs(StatusCode::kNotFound, HasSubstr("no Slurm job id")));
  ::sftctl::testing::WriteWholeFile(dir.path() + "/slurm/job_id", "12;x\n");
  EXPECT_THAT(RecordedJobId(dir.path()),
              StatusIs(StatusCode::kDataLoss, HasSubstr("does not hold a Slurm job id")));
}

// The spec's `slurm:` section becomes the engine's options in one place, checked there.
TEST(SlurmOptionsFromSpec, CopiesEveryFieldAndNamesTheBadOne) {
  SlurmSpec spec;
  spec.nodes = 2;
  spec.gpus_per_node = 8;
  spec.partition = "gpu";
  spec.account = "mylab";
  spec.qos = "high";
  spec.time = "12:00:00";
  spec.constraint = "a100&ib";
  spec.extra_args = {"--exclusive"};
  spec.requeue = false;
  auto o = SlurmOptionsFromSpec(spec);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->nodes, 2u);
  EXPECT_EQ(o->world_size(), 16u);
  EXPECT_EQ(o->partition, "gpu");
  EXPECT_EQ(o->account, "mylab");
  EXPECT_EQ(o->qos, "high");
  EXPECT_EQ(o->time, "12:00:00");
  EXPECT_EQ(o->constraint, "a100&ib");
  EXPECT_EQ(o->extra_args, std::vector<std::string>{"--exclusive"});
  EXPECT_FALSE(o->requeue);

  spec.nodes = -1;
  EXPECT_THAT(SlurmOptionsFromSpec(spec),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("slurm: field 'nodes': must be a small positive count")));
  spec.nodes = 2;
  spec.time = "soon";
  EXPECT_THAT(SlurmOptionsFromSpec(spec),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("slurm: field 'time'")));
}

TEST(SlurmOptionsFromSpec, ReadsTheSectionOfACanonicalSpec) {
  JobSpec spec;
  spec.model.path = "/models/tiny";
  spec.data.train = {"/data/train.jsonl"};
  auto none = SlurmOptionsFromSpecJson(ToJson(spec));
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  spec.slurm = SlurmSpec();
  spec.slurm->nodes = 3;
  spec.slurm->cpu_ranks_per_node = 2;
  auto some = SlurmOptionsFromSpecJson(ToJson(spec));
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  ASSERT_TRUE(some->has_value());
  EXPECT_EQ((*some)->world_size(), 6u);

  nlohmann::json bad = ToJson(spec);
  bad["slurm"]["partition"] = "a b";
  EXPECT_THAT(SlurmOptionsFromSpecJson(bad),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("slurm: field 'partition'")));
}

// Uploaded files live in the agent's own data dir: a Slurm job gets them inside its job folder.
TEST(MoveInputsIntoJobFolder, LinksFilesAndReplacesSymlinksWithCopies) {
  sftctl::testing::TempDir tmp;
  const std::string blob = tmp.path() + "/blobs/abc";
  sftctl::testing::WriteWholeFile(blob, "train data\n");
  const std::string job_dir = tmp.path() + "/shared/job-1";
  std::filesystem::create_directories(job_dir + "/inputs/0");
  std::filesystem::create_symlink(blob, job_dir + "/inputs/0/config.json");
  JobSpec spec;
  spec.data.train = {blob};
  spec.model.path = job_dir + "/inputs/0";

  std::filesystem::permissions(blob, std::filesystem::perms(0644));  // as the blob store makes them
  ASSERT_TRUE(MoveInputsIntoJobFolder(job_dir, {"/data/train/0"}, &spec).ok());
  const std::string moved = spec.data.train[0];
  EXPECT_EQ(moved, job_dir + "/inputs/files/0-abc");
  EXPECT_EQ(sftctl::testing::ReadWholeFile(moved), "train data\n");
  // Only the agent's user reads the data, by either name (a hard link shares the blob's inode).
  const auto owner_rw = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  EXPECT_EQ(std::filesystem::status(moved).permissions(), owner_rw);
  EXPECT_EQ(std::filesystem::status(blob).permissions(), owner_rw);
  EXPECT_EQ(std::filesystem::status(job_dir + "/inputs/0/config.json").permissions(), owner_rw);
  EXPECT_FALSE(std::filesystem::is_symlink(job_dir + "/inputs/0/config.json"));
  EXPECT_EQ(sftctl::testing::ReadWholeFile(job_dir + "/inputs/0/config.json"), "train data\n");
  EXPECT_EQ(spec.model.path, job_dir + "/inputs/0");

  std::filesystem::remove(blob);  // a blob gone from the store
  std::filesystem::create_symlink(blob, job_dir + "/inputs/0/gone.json");
  EXPECT_THAT(MoveInputsIntoJobFolder(job_dir, {}, &spec),
              StatusIs(StatusCode::kInternal, HasSubstr("cannot copy " + blob)));
}

// sftd --shared-dir: a folder of this user that nobody else may write, with a private jobs/.
TEST(PrepareSharedDir, CreatesPrivateFoldersAndRefusesOneOthersMayWriteOrOwn) {
  namespace fs = std::filesystem;
  sftctl::testing::TempDir tmp;
  const std::string fresh = tmp.path() + "/new/shared";
  auto made = PrepareSharedDir(fresh);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_EQ(*made, fs::canonical(fresh).string());
  EXPECT_EQ(fs::status(fresh).permissions(), fs::perms::owner_all);
  EXPECT_EQ(fs::status(fresh + "/jobs").permissions(), fs::perms::owner_all);

  const std::string open = tmp.path() + "/group-writable";
  fs::create_directories(open);
  fs::permissions(open, fs::perms(0775));
  EXPECT_THAT(PrepareSharedDir(open), StatusIs(StatusCode::kPermissionDenied,
                                               HasSubstr("--shared-dir " + fs::canonical(open).string() +
                                                         " is writable by group or others (mode 0775)")));
  EXPECT_FALSE(fs::exists(open + "/jobs"));  // nothing made in it

  const std::string foreign = tmp.path() + "/foreign";
  fs::create_directories(foreign);
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
  } else {  // (a folder of root's)
    fs::create_directory_symlink("/usr/share", foreign + "-root");
  }
  const std::string canonical = fs::canonical(::geteuid() == 0 ? foreign : foreign + "-root").string();
  EXPECT_THAT(
      PrepareSharedDir(::geteuid() == 0 ? foreign : foreign + "-root"),
      StatusIs(StatusCode::kPermissionDenied, HasSubstr("--shared-dir " + canonical + " belongs to uid ")));
}

// Two agents on one shared dir never share a job folder: each has its own folder of job folders.
TEST(AgentJobsDir, IsPrivateAndPerAgent) {
  sftctl::testing::TempDir tmp;
  auto shared = PrepareSharedDir(tmp.path() + "/shared");
  ASSERT_TRUE(shared.ok());
  const std::string a = NewAgentId(), b = NewAgentId();
  EXPECT_EQ(a.size(), 12u);
  EXPECT_NE(a, b);
  auto dir = AgentJobsDir(*shared, a);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(*dir, *shared + "/jobs/" + a);
  EXPECT_EQ(std::filesystem::status(*dir).permissions(), std::filesystem::perms::owner_all);
  EXPECT_EQ(*AgentJobsDir(*shared, a), *dir);  // the same agent again
  EXPECT_NE(*AgentJobsDir(*shared, b), *dir);
  EXPECT_THAT(AgentJobsDir(*shared, "../../etc/x"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("is not 12 hex digits")));
}

}  // namespace
}  // namespace sftctl::agent::slurm
