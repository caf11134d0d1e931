// The client's side of a Slurm job: `submit --slurm`'s flags over the spec's `slurm:` section
// (client/commands/spec_flags.h), read back by the agent (agent/slurm/slurm_runner.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent/slurm/slurm_runner.h"
#include "client/commands/spec_flags.h"
#include "common/spec/spec_fields.h"
#include "common/spec/spec_yaml.h"

namespace sftctl::agent::slurm {
namespace {

// The spec after `submit`'s flags (client/commands/spec_flags.h), as `submit` loads it.
StatusOr<nlohmann::json> Submitted(const JobSpec& spec, const client::SpecFlags& flags) {
  SFT_ASSIGN_OR_RETURN(std::vector<std::string> overrides,
                       client::SpecOverrides(client::SpecCommand::kSubmit, flags));
  SFT_ASSIGN_OR_RETURN(JobSpec out, OverrideSpec(spec, overrides));
  return ToJson(out);
}

// `submit --slurm`'s flags over the spec's `slurm:` section.
TEST(SlurmFlags, FlagsOverrideTheSpecSection) {
  JobSpec spec;
  spec.model.path = "/models/tiny";
  spec.data.train = {"/data/train.jsonl"};
  spec.slurm = SlurmSpec();
  spec.slurm->partition = "gpu";
  spec.slurm->extra_args = {"--exclusive"};
  client::SpecFlags flags;
  flags.slurm.slurm = true;
  flags.slurm.nodes = 2;
  flags.slurm.account = "mylab";
  flags.slurm.extra_args = {"--mem=0", "--comment=a:b#c"};
  flags.slurm.no_requeue = true;
  auto json = Submitted(spec, flags);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_EQ((*json)["slurm"]["nodes"], 2);
  EXPECT_EQ((*json)["slurm"]["partition"], "gpu");  // kept from the spec
  EXPECT_EQ((*json)["slurm"]["account"], "mylab");
  EXPECT_EQ((*json)["slurm"]["extra_args"], nlohmann::json({"--exclusive", "--mem=0", "--comment=a:b#c"}));
  EXPECT_EQ((*json)["slurm"]["requeue"], false);
  // What the agent reads back from the submitted JSON.
  auto o = SlurmOptionsFromSpecJson(*json);
  ASSERT_TRUE(o.ok() && o->has_value()) << o.status().ToString();
  EXPECT_EQ((*o)->world_size(), 2u);
  EXPECT_FALSE((*o)->requeue);

  JobSpec plain;
  plain.model.path = "/models/tiny";
  plain.data.train = {"/data/train.jsonl"};
  json = Submitted(plain, client::SpecFlags());
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  EXPECT_FALSE(json->contains("slurm"));
  client::SpecFlags on;  // --slurm alone: the section's defaults
  on.slurm.slurm = true;
  json = Submitted(plain, on);
  ASSERT_TRUE(json.ok()) << json.status().ToString();
  ASSERT_TRUE(json->contains("slurm"));
  EXPECT_EQ((*json)["slurm"], ToJson(SpecDefaults())["slurm"]);
}

}  // namespace
}  // namespace sftctl::agent::slurm
