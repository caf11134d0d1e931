#include "agent/state/state_store.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/json_parse.h"

namespace sftctl::agent {
namespace {

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& Bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, double v) {
    sqlite3_bind_double(s_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    sqlite3_bind_blob(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  // SQLITE_ROW, SQLITE_DONE or an error code.
  int Step() { return sqlite3_step(s_); }
  int64_t Int(int col) { return sqlite3_column_int64(s_, col); }
  double Double(int col) { return sqlite3_column_double(s_, col); }
  std::string Text(int col) {
    const unsigned char* p = sqlite3_column_text(s_, col);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, col)) : std::string();
  }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(s_, col);
    return p ? std::string(static_cast<const char*>(p), sqlite3_column_bytes(s_, col)) : std::string();
  }
  Status Error(const char* what) const {
    return InternalError(std::string("sqlite ") + what + ": " + sqlite3_errmsg(db_));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* s_ = nullptr;
  int rc_;
};

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(v[i]);
  }
  return out;
}

StatusOr<std::vector<int>> SplitInts(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int v = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || end != item.data() + item.size())
      return InvalidArgumentError("assigned_gpus: '" + item + "' is not a GPU index");
    out.push_back(v);
  }
  return out;
}

// The rendezvous as a JSON object ("" when the job is single-node).
std::string RendezvousToText(const ::sftctl::v1::Rendezvous& r) {
  if (r.num_nodes() <= 1) return "";
  nlohmann::json j = {{"num_nodes", r.num_nodes()},     {"node_rank", r.node_rank()},
                      {"world_size", r.world_size()},   {"rank_offset", r.rank_offset()},
                      {"master_addr", r.master_addr()}, {"master_port", r.master_port()},
                      {"group_id", r.group_id()}};
  return j.dump();
}

StatusOr<uint32_t> U32Field(const nlohmann::json& j, const char* key, const std::string& where) {
  SFT_ASSIGN_OR_RETURN(const uint64_t v, JsonFieldOr<uint64_t>(j, key, 0, where));
  if (v > UINT32_MAX) return FieldError(where, key, "expected a 32-bit count, got " + std::to_string(v));
  return static_cast<uint32_t>(v);
}

StatusOr<::sftctl::v1::Rendezvous> RendezvousFromText(const std::string& text) {
  ::sftctl::v1::Rendezvous r;
  if (text.empty()) return r;
  const std::string where = "rendezvous";
  SFT_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJson(text, where));
  SFT_RETURN_IF_ERROR(CheckJsonObject(j, where));
  SFT_ASSIGN_OR_RETURN(const uint32_t num_nodes, U32Field(j, "num_nodes", where));
  SFT_ASSIGN_OR_RETURN(const uint32_t node_rank, U32Field(j, "node_rank", where));
  SFT_ASSIGN_OR_RETURN(const uint32_t world_size, U32Field(j, "world_size", where));
  SFT_ASSIGN_OR_RETURN(const uint32_t rank_offset, U32Field(j, "rank_offset", where));
  SFT_ASSIGN_OR_RETURN(const uint32_t master_port, U32Field(j, "master_port", where));
  SFT_ASSIGN_OR_RETURN(std::string master_addr, JsonFieldOr<std::string>(j, "master_addr", "", where));
  SFT_ASSIGN_OR_RETURN(std::string group_id, JsonFieldOr<std::string>(j, "group_id", "", where));
  r.set_num_nodes(num_nodes);
  r.set_node_rank(node_rank);
  r.set_world_size(world_size);
  r.set_rank_offset(rank_offset);
  r.set_master_addr(std::move(master_addr));
  r.set_master_port(master_port);
  r.set_group_id(std::move(group_id));
  return r;
}

// A Slurm job's fields as a JSON object ("" for any other job).
std::string SlurmToText(const JobRecord& rec) {
  if (!rec.slurm) return "";
  return nlohmann::json{{"job_id", rec.slurm_job_id}, {"state", rec.slurm_state}}.dump();
}

Status SlurmFromText(const std::string& text, JobRecord* rec) {
  if (text.empty()) return OkStatus();  // not a Slurm job
  SFT_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJson(text, "slurm"));
  rec->slurm = j.is_object();
  if (!rec->slurm) return OkStatus();
  SFT_ASSIGN_OR_RETURN(rec->slurm_job_id, JsonFieldOr<std::string>(j, "job_id", "", "slurm"));
  SFT_ASSIGN_OR_RETURN(rec->slurm_state, JsonFieldOr<std::string>(j, "state", "", "slurm"));
  return OkStatus();
}

// The columns that are text with a structure, read back into `r`. A column that does not parse (a
// database edited or damaged on disk) is noted in r->corrupt, never thrown: the agent still starts
// and fails that one job (agent/jobs/supervisor.cpp, Recover).
void ReadStructuredColumns(const std::string& assigned_gpus, const std::string& rendezvous,
                           const std::string& slurm, JobRecord* r) {
  auto note = [r](const Status& st) {
    if (!st.ok() && r->corrupt.empty()) r->corrupt = st.message();
  };
  auto gpus = SplitInts(assigned_gpus);
  note(gpus.status());
  if (gpus.ok()) r->assigned_gpus = std::move(*gpus);
  auto rdv = RendezvousFromText(rendezvous);
  note(rdv.status());
  if (rdv.ok()) r->rendezvous = std::move(*rdv);
  note(SlurmFromText(slurm, r));
}

const char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  num INTEGER PRIMARY KEY,
  id TEXT UNIQUE NOT NULL,
  name TEXT NOT NULL DEFAULT '',
  client_request_id TEXT,
  state INTEGER NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  gpus INTEGER NOT NULL,
  world_size INTEGER NOT NULL,
  assigned_gpus TEXT NOT NULL DEFAULT '',
  restarts INTEGER NOT NULL DEFAULT 0,
  max_restarts INTEGER NOT NULL DEFAULT 0,
  heartbeat_s INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  started_ms INTEGER NOT NULL DEFAULT 0,
  finished_ms INTEGER NOT NULL DEFAULT 0,
  last_step INTEGER NOT NULL DEFAULT -1,
  last_loss REAL NOT NULL DEFAULT 0,
  pgid INTEGER NOT NULL DEFAULT 0,
  job_dir TEXT NOT NULL,
  spec_json TEXT NOT NULL,
  rendezvous TEXT NOT NULL DEFAULT '',
  first_failed_rank INTEGER NOT NULL DEFAULT -1,
  slurm TEXT NOT NULL DEFAULT ''
);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_request_id ON jobs(client_request_id) WHERE client_request_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS ranks (
  job_id TEXT NOT NULL,
  rank INTEGER NOT NULL,
  pid INTEGER NOT NULL,
  start_time INTEGER NOT NULL,
  running INTEGER NOT NULL,
  exit_known INTEGER NOT NULL,
  exit_code INTEGER NOT NULL,
  signal INTEGER NOT NULL,
  PRIMARY KEY (job_id, rank)
);
CREATE TABLE IF NOT EXISTS history (
  job_id TEXT NOT NULL,
  time_ms INTEGER NOT NULL,
  state INTEGER NOT NULL,
  reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS history_job ON history(job_id);
CREATE TABLE IF NOT EXISTS stop_when_done (
  job_id TEXT PRIMARY KEY,
  status INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS settings (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS checkpoint_keys (
  job_id TEXT NOT NULL,
  url TEXT NOT NULL,
  key BLOB NOT NULL,
  PRIMARY KEY (job_id, url)
);
CREATE TABLE IF NOT EXISTS blobs (
  sha256 TEXT PRIMARY KEY,
  size INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS artifact_hashes (
  job_id TEXT NOT NULL,
  path TEXT NOT NULL,
  size INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  sha256 TEXT NOT NULL,
  PRIMARY KEY (job_id, path)
);
)sql";

}  // namespace

bool IsFinal(JobState s) {
  return s == JobState::SUCCEEDED || s == JobState::FAILED || s == JobState::CANCELLED;
}

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::QUEUED:
      return "QUEUED";
    case JobState::RUNNING:
      return "RUNNING";
    case JobState::CANCELLING:
      return "CANCELLING";
    case JobState::SUCCEEDED:
      return "SUCCEEDED";
    case JobState::FAILED:
      return "FAILED";
    case JobState::CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

StatusOr<std::unique_ptr<StateStore>> StateStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return InternalError("cannot open database '" + path + "': " + msg);
  }
  std::unique_ptr<StateStore> store(new StateStore(db));
  sqlite3_busy_timeout(db, 5000);
  MutexLock lock(&store->mu_);  // not shared yet: nobody else can hold it
  SFT_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  // FULL: a committed state change survives power loss too; state changes are rare.
  SFT_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=FULL"));
  SFT_RETURN_IF_ERROR(store->Exec(kSchema));
  SFT_RETURN_IF_ERROR(store->Migrate());
  return store;
}

Status StateStore::Migrate() {
  // Columns added after the first release; CREATE TABLE IF NOT EXISTS leaves old tables as they were.
  static const struct {
    const char* name;
    const char* ddl;
  } kAdded[] = {
      {"rendezvous", "ALTER TABLE jobs ADD COLUMN rendezvous TEXT NOT NULL DEFAULT ''"},
      {"first_failed_rank", "ALTER TABLE jobs ADD COLUMN first_failed_rank INTEGER NOT NULL DEFAULT -1"},
      {"slurm", "ALTER TABLE jobs ADD COLUMN slurm TEXT NOT NULL DEFAULT ''"},
  };
  std::vector<std::string> have;
  {
    Stmt q(db_, "PRAGMA table_info(jobs)");
    while (q.Step() == SQLITE_ROW) have.push_back(q.Text(1));
  }
  for (const auto& c : kAdded) {
    if (std::find(have.begin(), have.end(), c.name) == have.end()) SFT_RETURN_IF_ERROR(Exec(c.ddl));
  }
  return OkStatus();
}

StateStore::~StateStore() { sqlite3_close(db_); }

Status StateStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown";
    sqlite3_free(err);
    return InternalError(std::string("sqlite: ") + msg);
  }
  return OkStatus();
}

StatusOr<JobRecord> StateStore::InsertJob(JobRecord rec, const CheckpointKeys& checkpoint_keys) {
  MutexLock lock(&mu_);
  SFT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto fail = [&](Status s) REQUIRES(mu_) {
    (void)Exec("ROLLBACK");
    return s;
  };
  {
    Stmt q(db_, "SELECT COALESCE(MAX(num), 0) + 1 FROM jobs");
    if (q.Step() != SQLITE_ROW) return fail(q.Error("next job number"));
    rec.num = q.Int(0);
  }
  rec.id = "job-" + std::to_string(rec.num);
  if (!rec.job_dir.empty() && rec.job_dir.back() == '/') rec.job_dir += rec.id;
  Stmt ins(db_,
           "INSERT INTO jobs (num, id, name, client_request_id, state, reason, gpus, world_size, "
           "max_restarts, heartbeat_s, created_ms, job_dir, spec_json, rendezvous, slurm) VALUES "
           "(?1, ?2, ?3, NULLIF(?4, ''), ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)");
  ins.Bind(1, rec.num).Bind(2, rec.id).Bind(3, rec.name).Bind(4, rec.client_request_id);
  ins.Bind(5, static_cast<int64_t>(rec.state)).Bind(6, rec.reason).Bind(7, static_cast<int64_t>(rec.gpus));
  ins.Bind(8, static_cast<int64_t>(rec.world_size)).Bind(9, static_cast<int64_t>(rec.max_restarts));
  ins.Bind(10, static_cast<int64_t>(rec.heartbeat_s)).Bind(11, rec.created_ms).Bind(12, rec.job_dir);
  ins.Bind(13, rec.spec_json).Bind(14, RendezvousToText(rec.rendezvous)).Bind(15, SlurmToText(rec));
  if (ins.Step() != SQLITE_DONE) return fail(ins.Error("insert job"));
  if (rec.stop_when_done) {
    Stmt sw(db_, "INSERT INTO stop_when_done (job_id, status) VALUES (?1, 0)");
    sw.Bind(1, rec.id);
    if (sw.Step() != SQLITE_DONE) return fail(sw.Error("insert stop_when_done"));
  }
  for (const auto& [url, key] : checkpoint_keys) {
    Stmt k(db_, "INSERT INTO checkpoint_keys (job_id, url, key) VALUES (?1, ?2, ?3)");
    k.Bind(1, rec.id).Bind(2, url).BindBlob(3, key);
    if (k.Step() != SQLITE_DONE) return fail(k.Error("insert checkpoint key"));
  }
  Stmt h(db_, "INSERT INTO history (job_id, time_ms, state, reason) VALUES (?1, ?2, ?3, ?4)");
  h.Bind(1, rec.id).Bind(2, rec.created_ms).Bind(3, static_cast<int64_t>(rec.state)).Bind(4, rec.reason);
  if (h.Step() != SQLITE_DONE) return fail(h.Error("insert history"));
  SFT_RETURN_IF_ERROR(Commit());
  return rec;
}

Status StateStore::SaveJob(const JobRecord& rec, const HistoryRecord* change) {
  MutexLock lock(&mu_);
  SFT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  auto fail = [&](Status s) REQUIRES(mu_) {
    (void)Exec("ROLLBACK");
    return s;
  };
  Stmt up(db_,
          "UPDATE jobs SET state=?2, reason=?3, assigned_gpus=?4, restarts=?5, started_ms=?6, "
          "finished_ms=?7, last_step=?8, last_loss=?9, pgid=?10, spec_json=?11, world_size=?12, "
          "rendezvous=?13, first_failed_rank=?14, slurm=?15, job_dir=?16 WHERE id=?1");
  up.Bind(1, rec.id).Bind(2, static_cast<int64_t>(rec.state)).Bind(3, rec.reason);
  up.Bind(4, JoinInts(rec.assigned_gpus)).Bind(5, static_cast<int64_t>(rec.restarts));
  up.Bind(6, rec.started_ms).Bind(7, rec.finished_ms).Bind(8, rec.last_step).Bind(9, rec.last_loss);
  up.Bind(10, rec.pgid).Bind(11, rec.spec_json).Bind(12, static_cast<int64_t>(rec.world_size));
  up.Bind(13, RendezvousToText(rec.rendezvous)).Bind(14, static_cast<int64_t>(rec.first_failed_rank));
  up.Bind(15, SlurmToText(rec)).Bind(16, rec.job_dir);
  if (up.Step() != SQLITE_DONE) return fail(up.Error("update job"));
  {
    Stmt del(db_, "DELETE FROM ranks WHERE job_id=?1");
    del.Bind(1, rec.id);
    if (del.Step() != SQLITE_DONE) return fail(del.Error("delete ranks"));
  }
  for (const RankRecord& r : rec.ranks) {
    Stmt ins(db_,
             "INSERT INTO ranks (job_id, rank, pid, start_time, running, exit_known, exit_code, signal) "
             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
    ins.Bind(1, rec.id).Bind(2, static_cast<int64_t>(r.rank)).Bind(3, r.pid);
    ins.Bind(4, static_cast<int64_t>(r.start_time)).Bind(5, static_cast<int64_t>(r.running));
    ins.Bind(6, static_cast<int64_t>(r.exit.known)).Bind(7, static_cast<int64_t>(r.exit.exit_code));
    ins.Bind(8, static_cast<int64_t>(r.exit.signal));
    if (ins.Step() != SQLITE_DONE) return fail(ins.Error("insert rank"));
  }
  if (change != nullptr) {
    Stmt h(db_, "INSERT INTO history (job_id, time_ms, state, reason) VALUES (?1, ?2, ?3, ?4)");
    h.Bind(1, rec.id).Bind(2, change->time_ms).Bind(3, static_cast<int64_t>(change->state));
    h.Bind(4, change->reason);
    if (h.Step() != SQLITE_DONE) return fail(h.Error("insert history"));
  }
  if (IsFinal(rec.state)) {  // nothing signs or resumes for the job any more
    Stmt del(db_, "DELETE FROM checkpoint_keys WHERE job_id=?1");
    del.Bind(1, rec.id);
    if (del.Step() != SQLITE_DONE) return fail(del.Error("delete checkpoint keys"));
  }
  return Commit();
}

Status StateStore::Commit() {
  Status st = Exec("COMMIT");
  // A failed COMMIT (disk full, I/O error, busy) can leave the transaction open, and the next
  // BEGIN would then fail forever: roll back, so the database keeps its last committed state.
  if (!st.ok() && !sqlite3_get_autocommit(db_)) (void)Exec("ROLLBACK");
  return st;
}

StatusOr<std::vector<JobRecord>> StateStore::QueryJobs(const std::string& where_id) {
  std::vector<JobRecord> out;
  std::string sql =
      "SELECT num, id, name, COALESCE(client_request_id, ''), state, reason, gpus, world_size, "
      "assigned_gpus, restarts, max_restarts, heartbeat_s, created_ms, started_ms, finished_ms, last_step, "
      "last_loss, pgid, job_dir, spec_json, rendezvous, first_failed_rank, "
      "EXISTS(SELECT 1 FROM stop_when_done s WHERE s.job_id = jobs.id), slurm FROM jobs";
  sql += where_id.empty() ? " ORDER BY num" : " WHERE id=?1";
  Stmt q(db_, sql.c_str());
  if (!where_id.empty()) q.Bind(1, where_id);
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    JobRecord r;
    r.num = q.Int(0);
    r.id = q.Text(1);
    r.name = q.Text(2);
    r.client_request_id = q.Text(3);
    r.state = static_cast<JobState>(q.Int(4));
    r.reason = q.Text(5);
    r.gpus = static_cast<uint32_t>(q.Int(6));
    r.world_size = static_cast<uint32_t>(q.Int(7));
    r.restarts = static_cast<uint32_t>(q.Int(9));
    r.max_restarts = static_cast<uint32_t>(q.Int(10));
    r.heartbeat_s = static_cast<uint32_t>(q.Int(11));
    r.created_ms = q.Int(12);
    r.started_ms = q.Int(13);
    r.finished_ms = q.Int(14);
    r.last_step = q.Int(15);
    r.last_loss = q.Double(16);
    r.pgid = q.Int(17);
    r.job_dir = q.Text(18);
    r.spec_json = q.Text(19);
    r.first_failed_rank = static_cast<int>(q.Int(21));
    r.stop_when_done = q.Int(22) != 0;
    ReadStructuredColumns(q.Text(8), q.Text(20), q.Text(23), &r);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return q.Error("query jobs");
  for (JobRecord& r : out) {
    Stmt rq(db_,
            "SELECT rank, pid, start_time, running, exit_known, exit_code, signal FROM ranks "
            "WHERE job_id=?1 ORDER BY rank");
    rq.Bind(1, r.id);
    while ((rc = rq.Step()) == SQLITE_ROW) {
      RankRecord k;
      k.rank = static_cast<int>(rq.Int(0));
      k.pid = rq.Int(1);
      k.start_time = static_cast<uint64_t>(rq.Int(2));
      k.running = rq.Int(3) != 0;
      k.exit.known = rq.Int(4) != 0;
      k.exit.exit_code = static_cast<int>(rq.Int(5));
      k.exit.signal = static_cast<int>(rq.Int(6));
      r.ranks.push_back(k);
    }
    if (rc != SQLITE_DONE) return rq.Error("query ranks");
  }
  return out;
}

Status StateStore::SaveProgress(const std::string& id, int64_t last_step, double last_loss) {
  MutexLock lock(&mu_);
  Stmt up(db_, "UPDATE jobs SET last_step=?2, last_loss=?3 WHERE id=?1 AND state IN (?4, ?5)");
  up.Bind(1, id).Bind(2, last_step).Bind(3, last_loss);
  up.Bind(4, static_cast<int64_t>(JobState::RUNNING)).Bind(5, static_cast<int64_t>(JobState::CANCELLING));
  if (up.Step() != SQLITE_DONE) return up.Error("save progress");
  return OkStatus();
}

StatusOr<JobRecord> StateStore::GetJob(const std::string& id) {
  MutexLock lock(&mu_);
  if (id.empty()) return NotFoundError("job_id: empty");
  SFT_ASSIGN_OR_RETURN(auto jobs, QueryJobs(id));
  if (jobs.empty()) return NotFoundError("job '" + id + "' not found");
  return std::move(jobs.front());
}

StatusOr<std::vector<JobRecord>> StateStore::ListJobs() {
  MutexLock lock(&mu_);
  return QueryJobs("");
}

StatusOr<std::vector<HistoryRecord>> StateStore::History(const std::string& id) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT state, reason, time_ms FROM history WHERE job_id=?1 ORDER BY rowid");
  q.Bind(1, id);
  std::vector<HistoryRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back({static_cast<JobState>(q.Int(0)), q.Text(1), q.Int(2)});
  }
  if (rc != SQLITE_DONE) return q.Error("query history");
  return out;
}

StatusOr<CheckpointKeys> StateStore::GetCheckpointKeys(const std::string& job_id) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT url, key FROM checkpoint_keys WHERE job_id=?1");
  q.Bind(1, job_id);
  CheckpointKeys out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) out[q.Text(0)] = q.Blob(1);
  if (rc != SQLITE_DONE) return q.Error("query checkpoint keys");
  return out;
}

StatusOr<std::optional<std::string>> StateStore::FindByRequestId(const std::string& client_request_id) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT id FROM jobs WHERE client_request_id=?1");
  q.Bind(1, client_request_id);
  int rc = q.Step();
  if (rc == SQLITE_ROW) return std::optional<std::string>(q.Text(0));
  if (rc != SQLITE_DONE) return q.Error("find request id");
  return std::optional<std::string>();
}

Status StateStore::PutBlob(const std::string& sha256, uint64_t size) {
  MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO blobs (sha256, size) VALUES (?1, ?2)");
  q.Bind(1, sha256).Bind(2, static_cast<int64_t>(size));
  if (q.Step() != SQLITE_DONE) return q.Error("put blob");
  return OkStatus();
}

Status StateStore::DeleteBlob(const std::string& sha256) {
  MutexLock lock(&mu_);
  Stmt q(db_, "DELETE FROM blobs WHERE sha256=?1");
  q.Bind(1, sha256);
  if (q.Step() != SQLITE_DONE) return q.Error("delete blob");
  return OkStatus();
}

std::optional<std::string> StateStore::CachedHash(const std::string& job_id, const std::string& path,
                                                  uint64_t size, int64_t mtime_ns) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT sha256 FROM artifact_hashes WHERE job_id=?1 AND path=?2 AND size=?3 AND mtime_ns=?4");
  q.Bind(1, job_id).Bind(2, path).Bind(3, static_cast<int64_t>(size)).Bind(4, mtime_ns);
  if (q.Step() == SQLITE_ROW) return q.Text(0);
  return std::nullopt;
}

Status StateStore::PutCachedHash(const std::string& job_id, const std::string& path, uint64_t size,
                                 int64_t mtime_ns, const std::string& sha256) {
  MutexLock lock(&mu_);
  Stmt q(db_,
         "INSERT OR REPLACE INTO artifact_hashes (job_id, path, size, mtime_ns, sha256) "
         "VALUES (?1, ?2, ?3, ?4, ?5)");
  q.Bind(1, job_id).Bind(2, path).Bind(3, static_cast<int64_t>(size)).Bind(4, mtime_ns).Bind(5, sha256);
  if (q.Step() != SQLITE_DONE) return q.Error("put artifact hash");
  return OkStatus();
}

StatusOr<std::vector<StopWhenDoneRecord>> StateStore::StopWhenDoneJobs() {
  MutexLock lock(&mu_);
  Stmt q(db_,
         "SELECT s.job_id, j.state, j.job_dir, s.status FROM stop_when_done s JOIN jobs j ON j.id = s.job_id "
         "WHERE s.status < ?1 ORDER BY j.num");
  q.Bind(1, static_cast<int64_t>(StopWhenDone::kConsumed));
  std::vector<StopWhenDoneRecord> out;
  int rc;
  while ((rc = q.Step()) == SQLITE_ROW) {
    out.push_back(
        {q.Text(0), static_cast<JobState>(q.Int(1)), q.Text(2), static_cast<StopWhenDone>(q.Int(3))});
  }
  if (rc != SQLITE_DONE) return q.Error("query stop_when_done");
  return out;
}

Status StateStore::SetStopWhenDone(const std::string& job_id, StopWhenDone status) {
  MutexLock lock(&mu_);
  Stmt q(db_, "UPDATE stop_when_done SET status=?2 WHERE job_id=?1");
  q.Bind(1, job_id).Bind(2, static_cast<int64_t>(status));
  if (q.Step() != SQLITE_DONE) return q.Error("update stop_when_done");
  return OkStatus();
}

Status StateStore::PutSetting(const std::string& key, const std::string& value) {
  MutexLock lock(&mu_);
  Stmt q(db_, "INSERT OR REPLACE INTO settings (key, value) VALUES (?1, ?2)");
  q.Bind(1, key).Bind(2, value);
  if (q.Step() != SQLITE_DONE) return q.Error("put setting");
  return OkStatus();
}

StatusOr<std::optional<std::string>> StateStore::GetSetting(const std::string& key) {
  MutexLock lock(&mu_);
  Stmt q(db_, "SELECT value FROM settings WHERE key=?1");
  q.Bind(1, key);
  int rc = q.Step();
  if (rc == SQLITE_ROW) return std::optional<std::string>(q.Text(0));
  if (rc != SQLITE_DONE) return q.Error("get setting");
  return std::optional<std::string>();
}

}  // namespace sftctl::agent
