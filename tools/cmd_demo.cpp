// cpfill demo: no arguments, no downloads. Writes a small random model of the real architecture
// (preset "tiny") to a temporary folder, runs a random prompt long enough to exercise the sparse
// indexer and both compressors, and prints the first token with timings.
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "engine/prefill_engine.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

struct DemoArgs {
    int64_t length = 1000;
    int threads = 0;
    uint64_t seed = 1;
};

int demo(const DemoArgs& a) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / fmt::format("cpfill-demo-{}", ::getpid());
    struct Cleanup {
        fs::path p;
        ~Cleanup() {
            std::error_code ec;
            fs::remove_all(p, ec);
        }
    } cleanup{dir};
    ModelConfig cfg = preset_config("tiny");
    RandomCheckpointOptions gen;
    gen.seed = a.seed;
    write_random_checkpoint(cfg, dir.string(), gen);
    fmt::print("demo model: preset tiny ({} layers, d_model {}, head_dim {}, {} experts) in {}\n",
               cfg.n_layers, cfg.d_model, cfg.head_dim, cfg.n_experts, dir.string());

    std::mt19937_64 rng(a.seed);
    std::vector<int32_t> prompt(a.length);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    PrefillEngine engine(dir.string(), EngineOptions{a.threads});
    RunResult r = engine.run({prompt}, ForwardOptions{});
    fmt::print(
        "prompt {} tokens, CP=1 (CPU fp32): first token {}, TTFT {:.3f} s, {:.0f} tokens/s\n",
        a.length, r.first_tokens[0], r.prefill_seconds, a.length / r.prefill_seconds);
    return 0;
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
    auto a = std::make_shared<DemoArgs>();
    CLI::App* c = app.add_subcommand("demo", "run a small random model end to end");
    c->add_option("--length", a->length, "prompt tokens")->check(CLI::Range(1, 1 << 20));
    c->add_option("--threads", a->threads, "CPU threads (default: all)");
    c->add_option("--seed", a->seed, "model and prompt seed");
    return [a] { return demo(*a); };
}

}  // namespace cpfill::tools
