// Token-id input parsing with errors that name the file, line and offending text.
#include "tools/input_ids.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/safetensors.h"

namespace cpfill::tools {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& source) {
    std::vector<int32_t> ids;
    std::string item;
    std::string normalized = text;
    for (char& c : normalized)
        if (c == ',' || c == '\t') c = ' ';
    std::istringstream in(normalized);
    while (in >> item) {
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        CPFILL_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX,
                     "{}: '{}' is not a token id (expected a non-negative integer)", source, item);
        ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
}

namespace {

bool is_safetensors(const std::string& path) {
    return path.size() > 12 && path.substr(path.size() - 12) == ".safetensors";
}

std::vector<std::vector<int32_t>> read_safetensors_ids(const std::string& path) {
    SafetensorsFile f(path);
    CPFILL_CHECK(f.has("input_ids"), "{}: no tensor 'input_ids' (found {} other tensors)", path,
                 f.tensors().size());
    Tensor t = f.get("input_ids");
    CPFILL_CHECK(t.ndim() == 1 || t.ndim() == 2,
                 "{}: input_ids must be [S] or [B, S], found shape {}", path, shape_str(t.shape()));
    const int64_t rows = t.ndim() == 2 ? t.dim(0) : 1, cols = t.dim(-1);
    std::vector<std::vector<int32_t>> out(rows);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
            int64_t v = 0;
            const int64_t i = r * cols + c;
            if (t.dtype() == DType::I64)
                v = t.data<int64_t>()[i];
            else if (t.dtype() == DType::I32)
                v = t.data<int32_t>()[i];
            else
                CPFILL_FAIL("{}: input_ids must be I32 or I64, found {}", path, t.dtype());
            CPFILL_CHECK(v >= 0 && v <= INT32_MAX, "{}: input_ids[{}] = {} is not a token id", path,
                         i, v);
            out[r].push_back(static_cast<int32_t>(v));
        }
    return out;
}

}  // namespace

std::vector<std::vector<int32_t>> read_input_ids_file(const std::string& path) {
    if (is_safetensors(path)) return read_safetensors_ids(path);
    std::ifstream in(path);
    CPFILL_CHECK(in.good(), "cannot open input ids file {}", path);
    std::vector<std::vector<int32_t>> out;
    std::string line;
    int line_no = 0;
    while (std::getline(in, line)) {
        ++line_no;
        auto ids = parse_id_list(line, path + ":" + std::to_string(line_no));
        if (!ids.empty()) out.push_back(std::move(ids));
    }
    CPFILL_CHECK(!out.empty(), "{}: no token ids found (expected one request per line)", path);
    return out;
}

}  // namespace cpfill::tools
