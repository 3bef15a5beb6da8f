// Text prompts: finding the tokenizer (--tokenizer, the model folder's tokenizer.json, the
// CPFILL_TOKENIZER environment variable, then the copy scripts/fetch-tokenizer.sh put in this
// source tree) and encoding with DeepSeek's BOS convention.
#pragma once

#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace cpfill::tools {

// The tokenizer.json path in that order of preference; throws naming the places tried.
std::string find_tokenizer(const std::string& explicit_path, const std::string& model_dir);
Tokenizer load_tokenizer(const std::string& explicit_path, const std::string& model_dir);
// encode(text), with <｜begin▁of▁sentence｜> first when `bos` and the vocabulary has it (DeepSeek's
// tokenizer_config.json sets add_bos_token; the tokenizer.json post-processor adds nothing).
std::vector<int32_t> encode_prompt(const Tokenizer& tok, const std::string& text, bool bos);
// The prompt file's text; throws for a missing file, a folder or an empty file.
std::string read_text_file(const std::string& path);

}  // namespace cpfill::tools
