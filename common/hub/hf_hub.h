// Models and data sets from the Hugging Face Hub, downloaded into the standard HF cache.
//
// A Hub reference reads `hf://[datasets/]ORG/NAME[@REVISION][/PATH]` (REVISION: a branch, tag or
// commit, default "main"; PATH: a file or folder inside the repository). HubDownloader lists the
// repository at the revision (GET /api/{models|datasets}/ORG/NAME/revision/REV: "sha" and
// "siblings"), picks the files (see HubFileWanted), and fetches each through
// `/[datasets/]ORG/NAME/resolve/COMMIT/FILE` (HEAD first: X-Repo-Commit, ETag / X-Linked-Etag,
// X-Linked-Size and the Location of the content, to which the GET goes) into the cache layout every
// Hub client shares:
//
//   <cache>/models--ORG--NAME/blobs/<etag>                 the content (LFS files: etag = sha256)
//   <cache>/models--ORG--NAME/blobs/<etag>.incomplete      a download in progress (resumed with Range)
//   <cache>/models--ORG--NAME/snapshots/<commit>/<file>    relative symlink to ../../blobs/<etag>
//   <cache>/models--ORG--NAME/refs/<revision>              the commit the revision named
//
// A blob already present is not fetched again; a dropped connection resumes from the bytes held; an
// LFS file's content is verified against its sha256 before it is renamed into place (nothing is
// kept when it differs). The token goes only to the endpoint's own origin: not with the content GET
// to a CDN the Hub redirected to, nor (common/net/http_client.h) across a redirect to another origin; and
// never into messages.
//
// Thread safety: a HubDownloader is used by one thread at a time. Two downloads of one blob (two
// jobs, two processes, or sftctl and Python's huggingface_hub) take turns on the blob's lock file
// `<cache>/.locks/models--ORG--NAME/<etag>.lock` (common/os/file_lock.h); the second finds the blob
// whole and only links it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/net/http_client.h"
#include "common/os/file_system.h"
#include "common/spec/hub_path.h"
#include "common/status.h"

namespace sftctl {

struct HubRef {
  bool dataset = false;
  std::string repo_id;            // "ORG/NAME"
  std::string revision = "main";  // branch, tag or commit
  std::string path;               // inside the repository; "" = the whole repository
  std::string text;               // as written, for messages

  // "models" or "datasets", as in the API paths and the cache folder names.
  std::string Kind() const { return dataset ? "datasets" : "models"; }
  // The repository's page, e.g. "https://huggingface.co/ORG/NAME" (datasets/ for a data set).
  std::string PageUrl(const std::string& endpoint) const;
};

// Parses `hf://[datasets/]ORG/NAME[@REV][/PATH]`. Errors: INVALID_ARGUMENT naming the reference and
// what is wrong (missing ORG or NAME, empty revision, "." or ".." components, characters the Hub
// does not allow in names).
StatusOr<HubRef> ParseHubRef(std::string_view text);

struct HubOptions {
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT; no trailing '/'
  std::string cache_dir;                            // HF_HUB_CACHE, else $HF_HOME/hub
  std::string token;                                // HF_TOKEN, else $HF_HOME/token; "" = none
  // How to get a token to where the download runs, in the error for a gated or private repository;
  // empty: "set HF_TOKEN (or run `huggingface-cli login`)". The agent names `submit --forward-hf-token`.
  std::string token_advice;
  HttpClient* http = nullptr;  // null: CurlHttpClient()
  FileSystem* fs = nullptr;    // null: FileSystem::Default()
  int max_attempts = 5;        // per file, for dropped connections
  // Progress of the file being fetched (called on the downloading thread; must not block long).
  std::function<void(const std::string& file, uint64_t done, uint64_t total)> progress;
  // Polled while bytes arrive; returning true stops the download with CANCELLED.
  std::function<bool()> cancelled;
};

// Options from the environment: HF_ENDPOINT, HF_HUB_CACHE / HF_HOME (default ~/.cache/huggingface),
// the token from HF_TOKEN, else the file HF_TOKEN_PATH, else $HF_HOME/token (trimmed).
HubOptions HubOptionsFromEnvironment();

// Whether a model repository's file is fetched by default: config.json, generation_config.json,
// tokenizer files (tokenizer*, special_tokens_map.json, vocab.json, merges.txt, chat_template.jinja),
// *.safetensors and model.safetensors.index.json. Other weight formats (.bin, .pt, .gguf, .onnx, ...)
// and everything else are skipped.
bool HubFileWanted(const std::string& path);

// True when `path` matches the shell-style `pattern` (`*` and `?` also match '/'), as --include.
bool HubPatternMatch(std::string_view pattern, std::string_view path);

struct HubSnapshot {
  std::string commit;              // 40 hex digits
  std::string folder;              // <cache>/<kind>--ORG--NAME/snapshots/<commit>
  std::string path;                // folder + "/" + the reference's PATH (folder when it has none)
  std::vector<std::string> files;  // the files fetched or found, relative to `folder`
  uint64_t bytes_downloaded = 0;   // content bytes received by this call
  int files_downloaded = 0;        // files whose content this call fetched
};

class HubDownloader {
 public:
  explicit HubDownloader(HubOptions options);

  // Downloads what `ref` names into the cache and returns the snapshot. A model without PATH: the
  // files HubFileWanted picks; with PATH: that file, or the wanted files beneath that folder; a data
  // set needs PATH (a file, or every file beneath a folder). `include` (shell patterns) replaces
  // those rules when not empty. Errors name the reference: PERMISSION_DENIED for a gated or private
  // repository ("accept the licence at <page> and set HF_TOKEN"), NOT_FOUND for a repository,
  // revision or file the Hub does not have, DATA_LOSS when a file's content does not match its
  // sha256 or size, UNAVAILABLE when the Hub cannot be reached or a file could not be completed in
  // max_attempts, the file system's error (naming the path) for disk errors, CANCELLED.
  StatusOr<HubSnapshot> Download(const HubRef& ref, const std::vector<std::string>& include = {});

 private:
  struct FileMeta;
  StatusOr<std::pair<std::string, std::vector<std::string>>> ListRepo(const HubRef& ref);
  StatusOr<FileMeta> Head(const HubRef& ref, const std::string& commit, const std::string& file);
  Status Fetch(const HubRef& ref, const std::string& repo_dir, const FileMeta& meta, HubSnapshot* snap);
  Status FetchAttempt(const std::string& part, const FileMeta& meta, uint64_t* have, HubSnapshot* snap);
  Status Verify(const HubRef& ref, const std::string& part, const FileMeta& meta);
  Status Link(const std::string& repo_dir, const std::string& commit, const FileMeta& meta);
  Status HttpError(const HubRef& ref, const HttpResponse& r, const std::string& what) const;
  // Request headers for `url`: the token only when it is the Hub's own origin.
  std::vector<std::pair<std::string, std::string>> Headers(const std::string& url) const;

  HubOptions opt_;
};

}  // namespace sftctl
