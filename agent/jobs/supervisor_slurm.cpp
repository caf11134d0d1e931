// The Supervisor's side of Slurm jobs (declared in agent/jobs/supervisor.h): the hooks that hand a job
// with a `slurm:` section to the SlurmRunner (agent/slurm/slurm_runner.h) and apply what it reports.
// Kept here so that supervisor.cpp holds only the calls.
#include <spdlog/spdlog.h>

#include "agent/jobs/checkpoint_upload.h"
#include "agent/jobs/supervisor.h"
#include "agent/slurm/slurm_job.h"
#include "agent/slurm/slurm_runner.h"
#include "common/spec/spec.h"
#include "common/spec/spec_paths.h"

namespace sftctl::agent {

Status Supervisor::PrepareSlurmJobsDir() {
  constexpr char kAgentIdSetting[] = "slurm_agent_id";
  SFT_ASSIGN_OR_RETURN(std::optional<std::string> id, store_->GetSetting(kAgentIdSetting));
  if (!id) {
    id = slurm::NewAgentId();
    SFT_RETURN_IF_ERROR(store_->PutSetting(kAgentIdSetting, *id));
  }
  SFT_ASSIGN_OR_RETURN(slurm_jobs_dir_, slurm::AgentJobsDir(config_.shared_dir, *id));
  return OkStatus();
}

StatusOr<std::optional<slurm::SlurmOptions>> Supervisor::SlurmPreflight(const JobSpec& spec) {
  if (!spec.slurm) return std::optional<slurm::SlurmOptions>();
  SFT_ASSIGN_OR_RETURN(slurm::SlurmOptions options, slurm::SlurmOptionsFromSpec(*spec.slurm));
  if (!HubPaths(spec).empty())
    return InvalidArgumentError(
        "slurm: hf:// paths are not supported in a Slurm job yet; `sftctl download` them and submit the "
        "local folder");
  if (!CheckpointUploads::ResumeBucket(spec).empty())
    return InvalidArgumentError(
        "slurm: resume: s3:// is not supported in a Slurm job yet; `sftctl pull s3://...` the checkpoint and "
        "resume from the local folder");
  SFT_RETURN_IF_ERROR(slurm_->Preflight(options));
  return std::optional<slurm::SlurmOptions>(std::move(options));
}

Status Supervisor::SubmitSlurmJob(JobRecord* rec, const slurm::SlurmOptions& options,
                                  const std::shared_ptr<Journal>& journal) {
  StatusOr<std::string> id = slurm_->Submit(options, "sftctl-" + rec->id, rec->job_dir);
  if (!id.ok()) {
    Status failed = Transition(rec, journal.get(), JobState::FAILED, "slurm: " + id.status().message());
    if (!failed.ok()) spdlog::error("{}: {}", rec->id, failed.ToString());
    return id.status();
  }
  rec->slurm_job_id = *id;
  rec->slurm_state = "submitted";
  SFT_RETURN_IF_ERROR(Transition(rec, journal.get(), JobState::QUEUED, "Slurm job " + *id + " submitted"));
  slurm_->Follow(rec->id, *id, rec->job_dir, rec->world_size, options.requeue, journal);
  return OkStatus();  // PrepareSubmit starts its uploads, once the forwarded credentials are set
}

void Supervisor::FollowSlurmJob(JobRecord* rec) {
  auto journal = JournalFor(rec->id);
  if (!journal.ok()) {
    spdlog::error("{}: cannot follow its Slurm job: {}", rec->id, journal.status().ToString());
    return;
  }
  Status why;
  StatusOr<slurm::SlurmOptions> options = InternalError("the spec has no slurm section");
  if (rec->spec->slurm) options = slurm::SlurmOptionsFromSpec(*rec->spec->slurm);
  if (rec->slurm_job_id.empty()) {
    StatusOr<std::string> recorded = slurm::RecordedJobId(rec->job_dir);
    if (recorded.ok()) rec->slurm_job_id = *recorded;
    if (!recorded.ok()) why = recorded.status().WithContext("the agent stopped before sbatch answered");
  }
  if (why.ok() && !options.ok()) why = options.status();
  if (!why.ok()) {
    Status st = Transition(rec, journal->get(), JobState::FAILED, "agent-restart: " + why.message());
    if (!st.ok()) spdlog::error("{}: {}", rec->id, st.ToString());
    return;
  }
  slurm_->Follow(rec->id, rec->slurm_job_id, rec->job_dir, rec->world_size, options->requeue, *journal);
  if (rec->state == JobState::CANCELLING) slurm_->Cancel(rec->id);
  spdlog::info("{}: following Slurm job {} again after the agent's restart", rec->id, rec->slurm_job_id);
  StartUploads(*rec, journal->get());  // the login node's agent watches the run folder in the shared dir
}

void Supervisor::ApplySlurmUpdate(const slurm::SlurmUpdate& update) {
  StatusOr<JobRecord> rec = GetJob(update.job_id);
  auto journal = JournalFor(update.job_id);
  Status st = !rec.ok() ? rec.status() : journal.status();
  if (!st.ok() || IsFinal(rec->state)) {
    if (!st.ok()) spdlog::error("{}: {}", update.job_id, st.ToString());
    slurm_jobs_.erase(update.job_id);
    return;
  }
  if (update.last_step) rec->last_step = *update.last_step;
  if (update.last_loss) rec->last_loss = *update.last_loss;
  rec->slurm_state = update.slurm_state;
  // A cancelled job stays CANCELLING until Slurm says how it ended.
  const JobState target =
      rec->state == JobState::CANCELLING && !update.final ? JobState::CANCELLING : update.state;
  const std::string reason = "Slurm job " + rec->slurm_job_id + ": " + update.slurm_state;
  if (target != rec->state) {
    st = Transition(&*rec, journal->get(), target, reason);
  } else {
    if (target != JobState::CANCELLING) rec->reason = reason;
    st = store_->SaveJob(*rec, nullptr);
  }
  if (!st.ok()) spdlog::error("{}: {}", update.job_id, st.ToString());
  if (IsFinal(rec->state)) {
    slurm_jobs_.erase(rec->id);
    uploads_->FinishJob(*rec->spec);  // the last checkpoint still goes up
  } else {
    slurm_jobs_[rec->id] = rec->state;
  }
  Schedule();  // the stats
}

}  // namespace sftctl::agent
