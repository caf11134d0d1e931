// The client's side of a Slurm job: `submit --slurm`'s flags over the spec's `slurm:` section
// (client/remote_spec.h), read back by the agent (agent/slurm/slurm_runner.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agent/slurm/slurm_runner.h"
#include "client/remote_spec.h"
#include "tests/util/status_matchers.h"

namespace sftctl::agent::slurm {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::HasSubstr;

// `submit --slurm`'s flags over the spec's `slurm:` section (client/remote_spec.h).
TEST(ApplySlurmFlags, FlagsOverrideTheSpecSection) {
  client::RemoteSpec spec;
  spec.spec.model.path = "/models/tiny";
  spec.spec.data.train = {"/data/train.jsonl"};
  spec.spec.slurm = SlurmSpec();
  spec.spec.slurm->partition = "gpu";
  spec.spec.slurm->extra_args = {"--exclusive"};
  spec.json = ToJson(spec.spec);
  client::SlurmFlags flags;
  flags.nodes = 2;
  flags.account = "mylab";
  flags.extra_args = {"--mem=0"};
  flags.no_requeue = true;
  ASSERT_TRUE(client::ApplySlurmFlags(flags, &spec).ok());
  EXPECT_EQ(spec.json["slurm"]["nodes"], 2);
  EXPECT_EQ(spec.json["slurm"]["partition"], "gpu");  // kept from the spec
  EXPECT_EQ(spec.json["slurm"]["account"], "mylab");
  EXPECT_EQ(spec.json["slurm"]["extra_args"], nlohmann::json({"--exclusive", "--mem=0"}));
  EXPECT_EQ(spec.json["slurm"]["requeue"], false);
  // What the agent reads back from the submitted JSON.
  auto o = SlurmOptionsFromSpecJson(spec.json);
  ASSERT_TRUE(o.ok() && o->has_value()) << o.status().ToString();
  EXPECT_EQ((*o)->world_size(), 2u);
  EXPECT_FALSE((*o)->requeue);

  client::RemoteSpec plain;
  plain.spec.model.path = "/models/tiny";
  plain.json = ToJson(plain.spec);
  client::SlurmFlags nodes_only;
  nodes_only.nodes = 2;
  EXPECT_THAT(client::ApplySlurmFlags(nodes_only, &plain),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("need --slurm")));
  EXPECT_TRUE(client::ApplySlurmFlags(client::SlurmFlags(), &plain).ok());
  EXPECT_FALSE(plain.json.contains("slurm"));
}

}  // namespace
}  // namespace sftctl::agent::slurm
