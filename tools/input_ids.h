// Reading prompts given as token ids: "1,2,3" on the command line, a safetensors file with an
// integer tensor `input_ids` ([S] or [B, S]), or a text file with one request per line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cpfill::tools {

std::vector<int32_t> parse_id_list(const std::string& text, const std::string& source);
std::vector<std::vector<int32_t>> read_input_ids_file(const std::string& path);

}  // namespace cpfill::tools
