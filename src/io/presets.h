// Named ModelConfig presets: "tiny" (a small model of the real architecture for tests and the
// demo), "tiny-text" (tiny with DeepSeek's 129,280-id vocabulary, for text prompts), "flash" /
// "pro" (the released V4-Flash / V4-Pro hyperparameters, docs/architecture.md §1) and "flash-slice"
// / "pro-slice" (their first four layers at real dimensions, for benchmarks).
#pragma once

#include <string>
#include <vector>

#include "io/model_config.h"

namespace cpfill {

std::vector<std::string> preset_names();
// Throws listing the known names when `name` is not one.
ModelConfig preset_config(const std::string& name);

}  // namespace cpfill
