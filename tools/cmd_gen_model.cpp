// cpfill gen-model: writes a random checkpoint of a named preset or a given config.json, in HF or
// official names, f32 / bf16 / fp8 storage and optionally fp4 routed experts. Sizes, memory and
// disk space are checked before anything is written; a failure leaves no partial checkpoint.
#include <fmt/format.h>

#include <csignal>
#include <memory>

#include "io/presets.h"
#include "io/progress.h"
#include "io/random_checkpoint.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

struct GenArgs {
    std::string preset;
    std::string config;
    std::string out;
    uint64_t seed = 0;
    std::string dtype = "f32";
    std::string names = "hf";
    std::string experts = "same";
};

int gen(const GenArgs& a) {
    std::signal(SIGXFSZ, SIG_IGN);  // ulimit -f: an error from the write, not a kill
    CPFILL_CHECK(a.preset.empty() != a.config.empty(), "give exactly one of --preset or --config");
    ModelConfig cfg;
    if (!a.preset.empty()) {
        cfg = preset_config(a.preset);
    } else {
        cfg = load_model_config(a.config);
    }
    RandomCheckpointOptions opt;
    opt.seed = a.seed;
    opt.names = a.names;
    opt.dtype = a.dtype;
    opt.experts = a.experts;
    // A progress line on a terminal (io/progress.h: drawn after a second of work).
    std::unique_ptr<Progress> bar;
    size_t reported = 0;
    opt.on_progress = [&bar, &reported](size_t done, size_t total) {
        if (!bar) bar = std::make_unique<Progress>("generating", total, true);
        bar->add(done - reported);
        reported = done;
    };
    write_random_checkpoint(cfg, a.out, opt);
    if (bar) bar->finish();
    fmt::print("wrote {} ({} layers, d_model {}, {} experts; names {}, dtype {}, experts {})\n",
               a.out, cfg.n_layers, cfg.d_model, cfg.n_experts, a.names, a.dtype, a.experts);
    return 0;
}

}  // namespace

Runner add_gen_model_command(CLI::App& app) {
    auto a = std::make_shared<GenArgs>();
    CLI::App* c = app.add_subcommand("gen-model", "write a random checkpoint");
    c->add_option("--preset", a->preset, "tiny, flash, pro, flash-slice, pro-slice");
    c->add_option("--config", a->config, "a config.json (HF or official form)");
    c->add_option("--out", a->out, "output folder")->required();
    c->add_option("--seed", a->seed, "random seed");
    c->add_option("--dtype", a->dtype, "f32, bf16 or fp8 (official layout)")
        ->check(CLI::IsMember({"f32", "bf16", "fp8"}));
    c->add_option("--names", a->names, "hf (save_pretrained names), upstream, hf-module")
        ->check(CLI::IsMember({"hf", "upstream", "hf-module"}));
    c->add_option("--experts", a->experts, "same, or fp4 (packed e2m1 with 1x32 scales)")
        ->check(CLI::IsMember({"same", "fp4"}));
    return [a] { return gen(*a); };
}

}  // namespace cpfill::tools
