// The KV state of a served request (docs/serve.md "KV state"): written into a client's folder as
// `cpfill run --kv-out` writes it (engine/kv_export.h), or returned in the response as the same
// safetensors bytes, base64-encoded (RFC 4648, with padding).
#pragma once

#include <string>
#include <vector>

#include "io/model_config.h"
#include "model/kv_store.h"

namespace cpfill::serve {

std::string base64_encode(const std::string& bytes);
// The file's bytes, base64-encoded.
std::string base64_file(const std::string& path);

// Checks a request's kv_out folder before it is queued (creatable, not the model folder, no
// foreign files in it); throws HttpError 400 naming the problem.
void check_kv_out(const std::string& dir, const std::string& model_dir);

// A temporary folder (under the system's temporary directory) holding the request's KV files;
// removed with the object.
class KvTempDir {
  public:
    KvTempDir(const KvStore& kv, const ModelConfig& cfg);
    ~KvTempDir();
    KvTempDir(const KvTempDir&) = delete;
    KvTempDir& operator=(const KvTempDir&) = delete;
    const std::vector<std::string>& files() const { return files_; }

  private:
    std::string dir_;
    std::vector<std::string> files_;
};

}  // namespace cpfill::serve
