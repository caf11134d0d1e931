// ParseEventLine / ReadEventLine (common/event_line.h): the one reader of the trainer's event lines.
// Lines of every kind as trainer/training/metrics.cpp and trainer/tools/trainer_cli.cpp write them, kinds it
// does not know, and every way a line from outside can be wrong, each with its message.
#include "common/event_line.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "tests/util/status_matchers.h"

namespace sftctl {
namespace {

using ::sftctl::testing::StatusIs;
using ::testing::StartsWith;

TEST(EventLine, ReadsAStartRecord) {
  auto ev = ParseEventLine(
      R"({"event":"start","step":100,"total_steps":400,"parameters":494032768,"trainable_parameters":4399104,)"
      R"("device":"cuda:0","precision":"bf16","threads":8,"train_samples":9000,"eval_samples":1000,)"
      R"("resumed_from":"/runs/a/checkpoint-000100","rank":0,"world_size":2,"buckets":4,"shard":"none",)"
      R"("flops_per_token":3.49e9,"time":1764400000.25})");
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(ev->kind, "start");
  EXPECT_EQ(ev->type, EventKind::kStart);
  EXPECT_EQ(ev->step, 100);
  EXPECT_EQ(ev->total_steps, 400);
  EXPECT_EQ(ev->parameters, 494032768);
  EXPECT_EQ(ev->trainable_parameters, 4399104);
  EXPECT_EQ(ev->device, "cuda:0");
  EXPECT_EQ(ev->precision, "bf16");
  EXPECT_EQ(ev->resumed_from, "/runs/a/checkpoint-000100");
  EXPECT_EQ(ev->rank, 0);
  EXPECT_EQ(ev->world_size, 2);
  EXPECT_EQ(ev->time, 1764400000.25);
  EXPECT_EQ(ev->json["shard"], "none");  // keys beyond the typed ones stay in json
  EXPECT_EQ(ev->json["flops_per_token"], 3.49e9);
  EXPECT_FALSE(ev->loss.has_value());
}

TEST(EventLine, ReadsAStepRecordAndKeepsItsExtraKeys) {
  auto ev = ParseEventLine(
      R"({"event":"step","step":12,"epoch":0.25,"loss":1.5,"lr":2e-4,"grad_norm":0.8,"tokens":4096,)"
      R"("tokens_per_s":5400.5,"step_s":0.75,"elapsed_s":9.5,"loss_scale":65536.0,"allreduce_s":0.01,)"
      R"("rss_mb":1024.0,"mfu":0.41,"forward_ms":210.5,"backward_ms":400.25,"time":1.5})");
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(ev->type, EventKind::kStep);
  EXPECT_EQ(ev->step, 12);
  EXPECT_EQ(ev->epoch, 0.25);
  EXPECT_EQ(ev->loss, 1.5);
  EXPECT_EQ(ev->lr, 2e-4);
  EXPECT_EQ(ev->grad_norm, 0.8);
  EXPECT_EQ(ev->tokens, 4096);
  EXPECT_EQ(ev->tokens_per_s, 5400.5);
  EXPECT_EQ(ev->step_s, 0.75);
  EXPECT_EQ(ev->elapsed_s, 9.5);
  EXPECT_EQ(ev->loss_scale, 65536.0);
  EXPECT_EQ(ev->allreduce_s, 0.01);
  EXPECT_EQ(ev->time, 1.5);
  // Resource figures and per-phase times are not typed fields: a reader takes them from json.
  EXPECT_EQ(ev->json["forward_ms"], 210.5);
  EXPECT_EQ(ev->json["backward_ms"], 400.25);
  EXPECT_EQ(ev->json["mfu"], 0.41);
  EXPECT_EQ(ev->json.size(), 17u);
}

TEST(EventLine, ReadsEvalCheckpointSkippedDoneStoppedAndErrorRecords) {
  auto eval =
      ParseEventLine(R"({"event":"eval","step":200,"eval_loss":0.5,"eval_targets":1800,"exact_match":0.75,)"
                     R"("exact_correct":750,"exact_total":1000,"eval_s":3.25,"time":2.0})");
  ASSERT_TRUE(eval.ok()) << eval.status().message();
  EXPECT_EQ(eval->type, EventKind::kEval);
  EXPECT_EQ(eval->eval_loss, 0.5);
  EXPECT_EQ(eval->eval_targets, 1800);
  EXPECT_EQ(eval->exact_match, 0.75);
  EXPECT_EQ(eval->exact_correct, 750);
  EXPECT_EQ(eval->exact_total, 1000);
  EXPECT_EQ(eval->eval_s, 3.25);

  auto checkpoint = ParseEventLine(R"({"event":"checkpoint","step":200,"path":"/runs/a/checkpoint-000200"})");
  ASSERT_TRUE(checkpoint.ok());
  EXPECT_EQ(checkpoint->type, EventKind::kCheckpoint);
  EXPECT_EQ(checkpoint->path, "/runs/a/checkpoint-000200");

  // A non-finite loss is written as null: absent.
  auto bad_step =
      ParseEventLine(R"({"event":"skipped","step":7,"loss":null,"grad_norm":null,"bad_steps":2})");
  ASSERT_TRUE(bad_step.ok()) << bad_step.status().message();
  EXPECT_EQ(bad_step->type, EventKind::kSkipped);
  EXPECT_FALSE(bad_step->loss.has_value());
  EXPECT_EQ(bad_step->bad_steps, 2);
  auto overflow = ParseEventLine(
      R"({"event":"skipped","reason":"overflow","step":7,"grad_norm":1e30,"loss_scale":32768.0})");
  ASSERT_TRUE(overflow.ok());
  EXPECT_EQ(overflow->reason, "overflow");
  EXPECT_EQ(overflow->loss_scale, 32768.0);

  for (const char* kind : {"done", "stopped"}) {
    auto end = ParseEventLine(
        std::string(R"({"event":")") + kind +
        R"(","step":400,"elapsed_s":60.5,"checkpoint":"/runs/a/checkpoint-000400",)"
        R"("dropped_samples":0,"truncated_samples":3,"loss":0.25,"eval_loss":0.5,"exact_match":1})");
    ASSERT_TRUE(end.ok()) << end.status().message();
    EXPECT_EQ(end->type, kind == std::string("done") ? EventKind::kDone : EventKind::kStopped);
    EXPECT_EQ(end->checkpoint, "/runs/a/checkpoint-000400");
    EXPECT_EQ(end->exact_match, 1.0);  // an integer where a number is meant: converted
    EXPECT_EQ(end->json["truncated_samples"], 3);
  }

  // main.cpp's error event: no step, no time.
  auto error =
      ParseEventLine(R"({"event":"error","code":"RESOURCE_EXHAUSTED","message":"CUDA out of memory"})");
  ASSERT_TRUE(error.ok());
  EXPECT_EQ(error->type, EventKind::kError);
  EXPECT_EQ(error->code, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(error->message, "CUDA out of memory");
  EXPECT_FALSE(error->step.has_value());
  EXPECT_FALSE(error->time.has_value());
}

TEST(EventLine, KeepsKindsItDoesNotKnow) {
  auto ev = ParseEventLine(R"({"event":"profile","step":3,"trace":"/runs/a/trace.json"})");
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_EQ(ev->type, EventKind::kOther);
  EXPECT_EQ(ev->kind, "profile");
  EXPECT_EQ(ev->step, 3);
  EXPECT_EQ(ev->json["trace"], "/runs/a/trace.json");
  // Fields a kind does not carry are still checked by name: one key, one type.
  EXPECT_THAT(
      ParseEventLine(R"({"event":"profile","step":"3"})"),
      StatusIs(StatusCode::kInvalidArgument, "event line: field 'step': expected an integer, got string"));
}

TEST(EventLine, ARecordBuiltAsTheWriterWouldReadsBack) {
  EventLine step;
  step.kind = "step";
  step.step = 3;
  step.loss = 0.5;
  step.lr = 1e-4;
  step.tokens = 2048;
  step.json = {{"forward_ms", 12.5}};  // a key beyond the typed fields
  const nlohmann::json record = EventLineToJson(step);
  EXPECT_EQ(record, nlohmann::json({{"event", "step"},
                                    {"step", 3},
                                    {"loss", 0.5},
                                    {"lr", 1e-4},
                                    {"tokens", 2048},
                                    {"forward_ms", 12.5}}));
  auto back = ParseEventLine(record.dump());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->type, EventKind::kStep);
  EXPECT_EQ(back->step, 3);
  EXPECT_EQ(back->loss, 0.5);
  EXPECT_EQ(back->tokens, 2048);
  EXPECT_EQ(back->json, record);
  // A line read gives back its own record (null stays null; an integer read as a number compares equal).
  auto read =
      ParseEventLine(R"({"event":"done","step":4,"loss":null,"exact_match":1,"checkpoint":"c","x":[1]})");
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(EventLineToJson(*read), read->json);
}

TEST(EventLine, KindNamesRoundTrip) {
  for (EventKind k : {EventKind::kStart, EventKind::kStep, EventKind::kEval, EventKind::kCheckpoint,
                      EventKind::kSkipped, EventKind::kDone, EventKind::kStopped, EventKind::kError}) {
    EXPECT_EQ(EventKindOf(EventKindName(k)), k) << EventKindName(k);
  }
  EXPECT_EQ(EventKindName(EventKind::kOther), "");
  EXPECT_EQ(EventKindOf("Step"), EventKind::kOther);
  EXPECT_EQ(EventKindOf(""), EventKind::kOther);
}

TEST(EventLine, TruncatedOrNonJsonLinesNameWhere) {
  EXPECT_THAT(ParseEventLine(R"({"event":"step","step":1,"lo)", "rank 2 event"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("rank 2 event: invalid JSON: ")));
  EXPECT_THAT(ParseEventLine("step 3 of 10"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("event line: invalid JSON: ")));
  EXPECT_THAT(ParseEventLine(""),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("event line: invalid JSON: ")));
  EXPECT_THAT(ParseEventLine(R"({"event":"step","loss":1e400})", "metrics.jsonl:4"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("metrics.jsonl:4: ")));
  EXPECT_THAT(ParseEventLine("{\"event\":\"step\",\"x\":\"\xff\"}"),
              StatusIs(StatusCode::kInvalidArgument, StartsWith("event line: invalid JSON: ")));
  // A line's end as the journal and getline leave it, and a CRLF line, read as the line.
  EXPECT_TRUE(ParseEventLine("{\"event\":\"done\"}\n").ok());
  EXPECT_TRUE(ParseEventLine("{\"event\":\"done\"}\r").ok());
}

TEST(EventLine, ValuesThatAreNotObjectsAreRefused) {
  EXPECT_THAT(ParseEventLine("[1, 2]"),
              StatusIs(StatusCode::kInvalidArgument, "event line: expected a JSON object, got array"));
  EXPECT_THAT(ParseEventLine(R"("step")"),
              StatusIs(StatusCode::kInvalidArgument, "event line: expected a JSON object, got string"));
  EXPECT_THAT(ParseEventLine("null"),
              StatusIs(StatusCode::kInvalidArgument, "event line: expected a JSON object, got null"));
  EXPECT_THAT(ParseEventLine("7"),
              StatusIs(StatusCode::kInvalidArgument, "event line: expected a JSON object, got number"));
}

TEST(EventLine, TheEventNameIsAStringThatIsNotEmpty) {
  EXPECT_THAT(
      ParseEventLine(R"({"step":1})"),
      StatusIs(StatusCode::kInvalidArgument, "event line: field 'event': missing (expected a string)"));
  EXPECT_THAT(
      ParseEventLine(R"({"event":null,"step":1})"),
      StatusIs(StatusCode::kInvalidArgument, "event line: field 'event': missing (expected a string)"));
  EXPECT_THAT(
      ParseEventLine(R"({"event":7,"step":1})", "rank 2 event"),
      StatusIs(StatusCode::kInvalidArgument, "rank 2 event: field 'event': expected a string, got number 7"));
  EXPECT_THAT(
      ParseEventLine(R"({"event":["step"]})"),
      StatusIs(StatusCode::kInvalidArgument, "event line: field 'event': expected a string, got array"));
  EXPECT_THAT(ParseEventLine(R"({"event":""})"),
              StatusIs(StatusCode::kInvalidArgument, "event line: field 'event': empty"));
}

TEST(EventLine, TypedFieldsOfTheWrongTypeAreRefusedNamingTheField) {
  struct Case {
    const char* line;
    const char* message;
  } cases[] = {
      {R"({"event":"step","step":"one"})", "field 'step': expected an integer, got string"},
      {R"({"event":"step","step":1.5})", "field 'step': expected an integer, got number 1.5"},
      {R"({"event":"step","step":true})", "field 'step': expected an integer, got boolean"},
      {R"({"event":"step","step":-1})", "field 'step': expected an integer >= 0, got number -1"},
      {R"({"event":"step","step":9223372036854775808})",
       "field 'step': expected an integer, got number 9223372036854775808"},
      {R"({"event":"step","step":1,"loss":"nan"})", "field 'loss': expected a number, got string"},
      {R"({"event":"step","step":1,"lr":[0.1]})", "field 'lr': expected a number, got array"},
      {R"({"event":"step","step":1,"tokens":{"n":3}})", "field 'tokens': expected an integer, got object"},
      {R"({"event":"step","step":1,"time":"now"})", "field 'time': expected a number, got string"},
      {R"({"event":"eval","step":1,"exact_total":-5})",
       "field 'exact_total': expected an integer >= 0, got number -5"},
      {R"({"event":"start","step":0,"device":5})", "field 'device': expected a string, got number 5"},
      {R"({"event":"start","step":0,"rank":"0"})", "field 'rank': expected an integer, got string"},
      {R"({"event":"checkpoint","step":1,"path":false})", "field 'path': expected a string, got boolean"},
      {R"({"event":"error","message":3})", "field 'message': expected a string, got number 3"},
      {R"({"event":"error","code":{},"message":"x"})", "field 'code': expected a string, got object"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParseEventLine(c.line, "rank 1 event"),
                StatusIs(StatusCode::kInvalidArgument, std::string("rank 1 event: ") + c.message))
        << c.line;
  }
}

TEST(EventLine, LinesAreBoundedInSizeAndDepth) {
  const std::string line = R"({"event":"error","message":"x"})";
  const std::string at_limit = line + std::string(kMaxEventLineBytes - line.size(), ' ');
  EXPECT_TRUE(ParseEventLine(at_limit).ok());
  EXPECT_THAT(
      ParseEventLine(at_limit + " "),
      StatusIs(StatusCode::kInvalidArgument, "event line: line of 65537 bytes, over the limit of 65536"));
  const std::string long_message =
      R"({"event":"error","message":")" + std::string(kMaxEventLineBytes, 'm') + "\"}";
  EXPECT_THAT(
      ParseEventLine(long_message, "rank 0 event"),
      StatusIs(StatusCode::kInvalidArgument, "rank 0 event: line of " + std::to_string(long_message.size()) +
                                                 " bytes, over the limit of 65536"));

  // The record is the first level; extra keys may nest up to kMaxEventLineDepth levels in all.
  auto nested = [](int levels) {
    return R"({"event":"step","step":1,"x":)" + std::string(levels - 1, '[') + std::string(levels - 1, ']') +
           "}";
  };
  EXPECT_TRUE(ParseEventLine(nested(kMaxEventLineDepth)).ok());
  EXPECT_THAT(ParseEventLine(nested(kMaxEventLineDepth + 1)),
              StatusIs(StatusCode::kInvalidArgument, "event line: JSON nested more than 8 levels deep"));
}

TEST(EventLine, ReadEventLineChecksARecordBuiltInCpp) {
  // The trainer's own record, handed to the TensorBoard writer before it is text: a NaN loss stays.
  auto ev = ReadEventLine({{"event", "skipped"}, {"step", int64_t{5}}, {"loss", std::nan("")}});
  ASSERT_TRUE(ev.ok()) << ev.status().message();
  EXPECT_TRUE(std::isnan(*ev->loss));
  auto unsigned_step = ReadEventLine({{"event", "step"}, {"step", uint64_t{8}}});
  ASSERT_TRUE(unsigned_step.ok());
  EXPECT_EQ(unsigned_step->step, 8);
  EXPECT_THAT(ReadEventLine({{"event", "step"}, {"step", std::numeric_limits<uint64_t>::max()}}, "record"),
              StatusIs(StatusCode::kInvalidArgument,
                       "record: field 'step': expected an integer, got number 18446744073709551615"));
  EXPECT_THAT(ReadEventLine(nlohmann::json::array()),
              StatusIs(StatusCode::kInvalidArgument, "event line: expected a JSON object, got array"));
}

}  // namespace
}  // namespace sftctl
