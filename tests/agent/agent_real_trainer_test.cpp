// The real sftd running the real sftctl-trainer: the contract between agent and trainer
// (spec.json with rewritten output_dir and data blobs, --events-fd 3, checkpoint folders).
#include <gtest/gtest.h>

#include "common/sha256.h"
#include "common/spec.h"
#include "tests/agent/agent_test_util.h"

namespace sftctl::agent::testing {
namespace {

TEST(AgentRealTrainer, TrainsATinyJobFromAnUploadedBlobAndServesItsCheckpoint) {
  TempDir dir;
  Agent a(dir.path());
  ASSERT_TRUE(a.Start({"--trainer", BinDir() + "/sftctl-trainer"}));

  // Training data travels as a content-addressed blob.
  std::string data;
  for (int i = 0; i < 24; ++i) {
    data += "{\"prompt\": \"What is " + std::to_string(i) + "+1?\\n\", \"completion\": \"" +
            std::to_string(i + 1) + "\"}\n";
  }
  const std::string sha = Sha256Hex(data);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + a.token());
    v1::BlobStatus resp;
    auto writer = a.stub()->UploadBlob(&ctx, &resp);
    v1::UploadBlobRequest first;
    first.set_sha256(sha);
    first.set_size(data.size());
    ASSERT_TRUE(writer->Write(first));
    v1::UploadBlobRequest chunk;
    chunk.set_data(data);
    ASSERT_TRUE(writer->Write(chunk));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    ASSERT_TRUE(resp.complete());
  }

  // The canonical spec the client would send (the agent rewrites output_dir and the blob path).
  JobSpec spec;
  spec.name = "tiny";
  spec.output_dir = "/nonexistent/rewritten-by-the-agent";
  spec.tokenizer = "byte";
  spec.precision = "fp32";
  spec.model.config = {{"hidden_size", 32},
                       {"intermediate_size", 64},
                       {"num_hidden_layers", 1},
                       {"num_attention_heads", 4},
                       {"max_position_embeddings", 32}};
  spec.data.train = {"placeholder.jsonl"};
  spec.train.batch_size = 4;
  spec.train.max_steps = 3;
  v1::SubmitJobRequest req;
  req.set_spec_json(ToJson(spec).dump());
  req.set_cpu_ranks(1);
  auto* ref = req.add_blobs();
  ref->set_json_pointer("/data/train/0");
  ref->set_sha256(sha);
  v1::Job job;
  grpc::Status s = a.stub()->SubmitJob(a.Ctx().get(), req, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();

  v1::Job done = a.WaitState(job.id(), v1::SUCCEEDED);
  ASSERT_EQ(done.state(), v1::SUCCEEDED) << done.reason();
  EXPECT_EQ(done.last_step(), 3);
  int steps = 0;
  bool saw_done = false;
  for (const auto& e : a.Events(job.id(), 0, /*follow=*/false)) {
    if (e.kind() != v1::Event::METRIC) continue;
    auto rec = nlohmann::json::parse(e.text());
    steps += rec["event"] == "step";
    saw_done |= rec["event"] == "done";
  }
  EXPECT_EQ(steps, 3);
  EXPECT_TRUE(saw_done);

  v1::ListArtifactsRequest lreq;
  lreq.set_job_id(job.id());
  v1::ListArtifactsResponse list;
  ASSERT_TRUE(a.stub()->ListArtifacts(a.Ctx().get(), lreq, &list).ok());
  bool has_weights = false, has_done = false;
  for (const auto& art : list.artifacts()) {
    has_weights |= art.path().find("checkpoint-000003/model.safetensors") != std::string::npos;
    has_done |= art.path().find("checkpoint-000003/DONE") != std::string::npos;
  }
  EXPECT_TRUE(has_weights && has_done) << list.DebugString();
}

}  // namespace
}  // namespace sftctl::agent::testing
