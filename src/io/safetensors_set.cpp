// SafetensorsSet: every tensor of a checkpoint by name, across the files of a folder.
// With model.safetensors.index.json the index is authoritative and checked against the files:
// every file it names exists, every tensor it maps is in that file, and every tensor of a file is
// mapped to that file. Without an index, model.safetensors alone when it exists (as HF reads a
// single-file checkpoint; other files beside it, e.g. test references, are not weights), else all
// *.safetensors of the folder, and a name may appear in only one of them.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"

namespace cpfill {

namespace fs = std::filesystem;

namespace {

using json = nlohmann::json;

constexpr const char* kIndexName = "model.safetensors.index.json";

json read_json_file(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    CPFILL_CHECK(in.good(), "{}: cannot open", path.string());
    std::stringstream text;
    text << in.rdbuf();
    try {
        return json::parse(text.str());
    } catch (const json::exception& e) {
        CPFILL_FAIL("{}: not valid JSON: {}", path.string(), e.what());
    }
}

// weight_map of an index: tensor name → file name (relative to the folder), checked for shape.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
    const json index = read_json_file(index_path);
    const std::string src = index_path.string();
    CPFILL_CHECK(index.is_object(), "{}: expected a JSON object, found {}", src, index.type_name());
    auto it = index.find("weight_map");
    CPFILL_CHECK(it != index.end() && it->is_object(),
                 "{}: expected a \"weight_map\" object of tensor name -> file name", src);
    std::map<std::string, std::string> map;
    for (const auto& [name, file] : it->items()) {
        CPFILL_CHECK(file.is_string(), "{}: weight_map[\"{}\"]: expected a file name, found {}",
                     src, name, file.type_name());
        const fs::path rel(file.get<std::string>());
        CPFILL_CHECK(!rel.empty() && rel.is_relative() &&
                         std::find(rel.begin(), rel.end(), "..") == rel.end(),
                     "{}: weight_map[\"{}\"]: expected a file name inside the folder, found '{}'",
                     src, name, rel.string());
        map[name] = rel.string();
    }
    return map;
}

using Files = std::vector<std::unique_ptr<SafetensorsFile>>;
using Where = std::map<std::string, const SafetensorsFile*>;

void load_indexed(const fs::path& root, Files& files, Where& where) {
    const fs::path index_path = root / kIndexName;
    const std::string src = index_path.string();
    const auto weight_map = read_weight_map(index_path);
    std::map<std::string, const SafetensorsFile*> opened;  // file name → file
    for (const auto& [name, file] : weight_map) {
        if (opened.count(file)) continue;
        const fs::path shard = root / file;
        CPFILL_CHECK(fs::is_regular_file(shard),
                     "{}: tensor '{}' is mapped to {}, which does not exist", src, name,
                     shard.string());
        files.push_back(std::make_unique<SafetensorsFile>(shard.string()));
        opened[file] = files.back().get();
    }
    for (const auto& [name, file] : weight_map) {
        const SafetensorsFile* f = opened.at(file);
        CPFILL_CHECK(f->has(name), "{}: tensor '{}' is mapped to {}, which does not hold it", src,
                     name, f->path());
        where[name] = f;
    }
    for (const auto& [file, f] : opened)
        for (const auto& [name, info] : f->tensors()) {
            auto it = weight_map.find(name);
            CPFILL_CHECK(it != weight_map.end() && it->second == file,
                         "{}: {} holds tensor '{}', which the index maps to {}", src, f->path(),
                         name, it == weight_map.end() ? std::string("no file") : it->second);
        }
}

void load_folder(const fs::path& root, Files& files, Where& where) {
    std::vector<fs::path> shards;
    if (fs::is_regular_file(root / "model.safetensors")) {
        shards.push_back(root / "model.safetensors");
    } else {
        for (const auto& e : fs::directory_iterator(root))
            if (e.path().extension() == ".safetensors" && e.is_regular_file())
                shards.push_back(e.path());
    }
    CPFILL_CHECK(!shards.empty(), "{}: folder holds neither {} nor any *.safetensors file",
                 root.string(), kIndexName);
    std::sort(shards.begin(), shards.end());
    for (const fs::path& shard : shards) {
        files.push_back(std::make_unique<SafetensorsFile>(shard.string()));
        const SafetensorsFile* f = files.back().get();
        for (const auto& [name, info] : f->tensors()) {
            auto [it, inserted] = where.emplace(name, f);
            CPFILL_CHECK(inserted, "{}: tensor '{}' is in both {} and {}", root.string(), name,
                         it->second->path(), f->path());
        }
    }
}

}  // namespace

SafetensorsSet::SafetensorsSet(const std::string& path) : path_(path) {
    const fs::path root(path);
    CPFILL_CHECK(fs::exists(root), "{}: no such file or folder", path);
    if (!fs::is_directory(root)) {
        files_.push_back(std::make_unique<SafetensorsFile>(path));
        for (const auto& [name, info] : files_[0]->tensors()) where_[name] = files_[0].get();
    } else if (fs::exists(root / kIndexName)) {
        load_indexed(root, files_, where_);
    } else {
        load_folder(root, files_, where_);
    }
}

std::vector<std::string> SafetensorsSet::names() const {
    std::vector<std::string> out;
    out.reserve(where_.size());
    for (const auto& [name, file] : where_) out.push_back(name);
    return out;
}

bool SafetensorsSet::has(const std::string& name) const { return where_.count(name) > 0; }

const TensorInfo& SafetensorsSet::info(const std::string& name) const {
    auto it = where_.find(name);
    CPFILL_CHECK(it != where_.end(), "{}: no tensor named '{}' ({} tensors in the checkpoint)",
                 path_, name, where_.size());
    return it->second->tensors().at(name);
}

Tensor SafetensorsSet::get(const std::string& name) const {
    auto it = where_.find(name);
    CPFILL_CHECK(it != where_.end(), "{}: no tensor named '{}' ({} tensors in the checkpoint)",
                 path_, name, where_.size());
    return it->second->get(name);
}

}  // namespace cpfill
