// libFuzzer target for parse_model_config on arbitrary text. The parser may only throw
// cpfill::Error. Whatever it accepts must survive a round trip: written back in either form (when
// that form can express it), the text must parse again to the same layer and MLP types.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "io/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    cpfill::ModelConfig cfg;
    try {
        cfg = cpfill::parse_model_config(text, "fuzz/config.json");
    } catch (const cpfill::Error&) {
        return 0;  // rejected with a message: the expected outcome for malformed input
    }
    for (const char* form : {"hf", "upstream"}) {
        std::string out;
        try {
            out = cpfill::model_config_to_json(cfg, form);
        } catch (const cpfill::Error&) {
            continue;  // not expressible in this form (e.g. YaRN main rope in upstream)
        }
        // Not caught: a config we wrote must parse.
        const cpfill::ModelConfig back = cpfill::parse_model_config(out, "fuzz/roundtrip.json");
        if (back.layer_types != cfg.layer_types || back.mlp_types != cfg.mlp_types ||
            back.rope_dim != cfg.rope_dim || back.d_model != cfg.d_model)
            __builtin_trap();
    }
    return 0;
}
