// KV state files for served requests, and base64.
#include "serve/kv_bytes.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/kv_export.h"
#include "io/output_paths.h"
#include "serve/http_error.h"

namespace cpfill::serve {

namespace fs = std::filesystem;

std::string base64_encode(const std::string& in) {
    static constexpr char kAlphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    size_t i = 0;
    for (; i + 2 < in.size(); i += 3) {
        const uint32_t v =
            uint32_t(uint8_t(in[i])) << 16 | uint32_t(uint8_t(in[i + 1])) << 8 | uint8_t(in[i + 2]);
        for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
    }
    if (i < in.size()) {
        uint32_t v = uint32_t(uint8_t(in[i])) << 16;
        if (i + 1 < in.size()) v |= uint32_t(uint8_t(in[i + 1])) << 8;
        out += kAlphabet[(v >> 18) & 63];
        out += kAlphabet[(v >> 12) & 63];
        out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

std::string base64_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    CPFILL_CHECK(in.good(), "cannot read the KV file {}", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return base64_encode(ss.str());
}

void check_kv_out(const std::string& dir, const std::string& model_dir) {
    try {
        check_output_folder(dir, "kv_out");
        const auto model = file_id(model_dir), out = file_id(dir);
        CPFILL_CHECK(!(model && out && *model == *out),
                     "kv_out {}: is the model folder, expected another folder", dir);
        check_kv_out_dir(dir);
    } catch (const HttpError&) {
        throw;
    } catch (const std::exception& e) {
        bad_request("{}", e.what());
    }
}

KvTempDir::KvTempDir(const KvStore& kv, const ModelConfig& cfg) {
    std::string tmpl = (fs::temp_directory_path() / "cpfill-serve-kv-XXXXXX").string();
    CPFILL_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot create a temporary folder {}", tmpl);
    dir_ = tmpl;
    try {
        write_kv_state(dir_, kv, cfg);
    } catch (...) {
        std::error_code ec;
        fs::remove_all(dir_, ec);
        throw;
    }
    for (const std::string& f : kv_state_files(kv.size()))
        files_.push_back((fs::path(dir_) / f).string());
}

KvTempDir::~KvTempDir() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
}

}  // namespace cpfill::serve
