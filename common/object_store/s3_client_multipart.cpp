// S3Client's listings and multipart calls (the object calls are in s3_client.cpp).
#include <cstdlib>

#include "common/object_store/s3_client.h"
#include "common/object_store/s3_xml.h"
#include "common/terminal_text.h"

namespace sftctl {

namespace {

std::string Unquoted(std::string s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

uint64_t ToU64(const std::string& s) { return std::strtoull(s.c_str(), nullptr, 10); }

// A listing holds only keys that start with the prefix asked for; callers cut the prefix off and act on
// the rest (download, delete). A key outside it (a hostile or broken endpoint) is DATA_LOSS naming it.
Status CheckListedKey(const std::string& bucket, const std::string& prefix, const std::string& key,
                      const char* call) {
  if (key.compare(0, prefix.size(), prefix) == 0) return OkStatus();  // a shorter key compares unequal
  return DataLossError(S3ObjectName(bucket, prefix) + ": " + call + " listed the key '" +
                       EscapeForTerminal(key) + "', which is outside the prefix");
}

}  // namespace

StatusOr<std::vector<S3ObjectInfo>> S3Client::ListObjects(const std::string& bucket,
                                                          const std::string& prefix, int page_size,
                                                          size_t max_objects) const {
  std::vector<S3ObjectInfo> out;
  std::string token;
  for (int page = 0;; ++page) {
    std::vector<std::pair<std::string, std::string>> q = {
        {"list-type", "2"}, {"max-keys", std::to_string(page_size)}, {"prefix", prefix}};
    if (!token.empty()) q.emplace_back("continuation-token", token);
    Request r{"GET", bucket, "", CanonicalQuery(q)};
    SFT_ASSIGN_OR_RETURN(Response resp, Send(r));
    for (std::string_view c : XmlElements(resp.body, "Contents")) {
      S3ObjectInfo info;
      info.key = XmlText(c, "Key");
      SFT_RETURN_IF_ERROR(CheckListedKey(bucket, prefix, info.key, "ListObjectsV2"));
      info.size = ToU64(XmlText(c, "Size"));
      info.etag = Unquoted(XmlText(c, "ETag"));
      out.push_back(std::move(info));
    }
    if (XmlText(resp.body, "IsTruncated") != "true") break;
    if (out.size() >= max_objects) {
      return DataLossError(S3ObjectName(bucket, prefix) + ": ListObjectsV2: " + std::to_string(out.size()) +
                           " objects and still truncated: refusing to list further (a run's prefix "
                           "holds thousands; is the endpoint answering in a loop?)");
    }
    std::string next = XmlText(resp.body, "NextContinuationToken");
    if (!next.empty() && next == token) {
      return DataLossError(S3ObjectName(bucket, prefix) +
                           ": ListObjectsV2: the endpoint returned the same "
                           "continuation token twice (page " +
                           std::to_string(page + 1) + ")");
    }
    token = std::move(next);
    if (token.empty())
      return DataLossError(S3ObjectName(bucket, prefix) +
                           ": ListObjectsV2: a truncated page without a "
                           "NextContinuationToken (page " +
                           std::to_string(page + 1) + ")");
  }
  return out;
}

StatusOr<std::string> S3Client::CreateMultipartUpload(const std::string& bucket,
                                                      const std::string& key) const {
  Request r{"POST", bucket, key, CanonicalQuery({{"uploads", ""}})};
  r.headers.emplace_back("Content-Type", "application/octet-stream");
  SFT_ASSIGN_OR_RETURN(Response resp, Send(r));
  std::string id = XmlText(resp.body, "UploadId");
  if (id.empty()) return DataLossError(S3ObjectName(bucket, key) + ": CreateMultipartUpload: no UploadId");
  return id;
}

StatusOr<std::string> S3Client::UploadPart(const std::string& bucket, const std::string& key,
                                           const std::string& upload_id, int part_number,
                                           std::string_view data) const {
  Request r{"PUT", bucket, key,
            CanonicalQuery({{"partNumber", std::to_string(part_number)}, {"uploadId", upload_id}})};
  std::string etag;
  SFT_RETURN_IF_ERROR(PutBody(r, data, &etag).WithContext("part " + std::to_string(part_number)));
  if (etag.empty())
    return DataLossError(S3ObjectName(bucket, key) + ": UploadPart " + std::to_string(part_number) +
                         ": no ETag");
  return etag;
}

Status S3Client::CompleteMultipartUpload(const std::string& bucket, const std::string& key,
                                         const std::string& upload_id,
                                         const std::vector<std::string>& etags) const {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>\"" + XmlEscape(etags[i]) +
           "\"</ETag></Part>";
  xml += "</CompleteMultipartUpload>";
  Request r{"POST", bucket, key, CanonicalQuery({{"uploadId", upload_id}})};
  r.headers.emplace_back("Content-Type", "application/xml");
  r.body = xml;
  SFT_ASSIGN_OR_RETURN(Response resp, Send(r));
  // S3 may answer 200 with an <Error> body when the completion fails late.
  if (const std::string code = XmlText(resp.body, "Code");
      !code.empty() && XmlElements(resp.body, "Error").size())
    return InternalError(S3ObjectName(bucket, key) + ": CompleteMultipartUpload: " + EscapeForTerminal(code) +
                         ": " + EscapeForTerminal(XmlText(resp.body, "Message")));
  return Status();
}

Status S3Client::AbortMultipartUpload(const std::string& bucket, const std::string& key,
                                      const std::string& upload_id) const {
  StatusOr<Response> resp = Send(Request{"DELETE", bucket, key, CanonicalQuery({{"uploadId", upload_id}})});
  if (!resp.ok() && resp.status().code() == StatusCode::kNotFound) return Status();  // gone already
  return resp.status();
}

StatusOr<std::vector<S3MultipartUpload>> S3Client::ListMultipartUploads(const std::string& bucket,
                                                                        const std::string& prefix) const {
  SFT_ASSIGN_OR_RETURN(
      Response resp, Send(Request{"GET", bucket, "", CanonicalQuery({{"prefix", prefix}, {"uploads", ""}})}));
  std::vector<S3MultipartUpload> out;
  for (std::string_view u : XmlElements(resp.body, "Upload")) {
    out.push_back({XmlText(u, "Key"), XmlText(u, "UploadId")});
    SFT_RETURN_IF_ERROR(CheckListedKey(bucket, prefix, out.back().key, "ListMultipartUploads"));
  }
  return out;
}

StatusOr<std::vector<S3Part>> S3Client::ListParts(const std::string& bucket, const std::string& key,
                                                  const std::string& upload_id) const {
  SFT_ASSIGN_OR_RETURN(Response resp,
                       Send(Request{"GET", bucket, key, CanonicalQuery({{"uploadId", upload_id}})}));
  std::vector<S3Part> out;
  for (std::string_view p : XmlElements(resp.body, "Part"))
    out.push_back({std::atoi(XmlText(p, "PartNumber").c_str()), ToU64(XmlText(p, "Size")),
                   Unquoted(XmlText(p, "ETag"))});
  return out;
}

}  // namespace sftctl
