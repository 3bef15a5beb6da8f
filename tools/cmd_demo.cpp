// cpfill demo: no arguments, no downloads. Writes a small random model of the real architecture
// (preset "tiny") to a temporary folder, runs one random prompt long enough to exercise the sparse
// indexer and both compressors with CP=1 and CP=2 (CPU ranks), TBO off and on, and shows that all
// four agree, with their timings. Where GPUs are usable it also runs the CUDA backend (CP=1, and
// CP=2 with two GPUs, TBO off and on) and compares it with the CPU's fp32 logits.
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "engine/prefill_engine.h"
#include "io/presets.h"
#include "io/random_checkpoint.h"
#include "runtime/device.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

struct DemoArgs {
    int64_t length = 1000;
    int threads = 0;
    uint64_t seed = 1;
    std::string device = "auto";  // auto: add the CUDA runs when a GPU is usable
};

double max_rel_diff(const Tensor& a, const Tensor& b) {
    double m = 0, ref = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
        m = std::max(m, double(std::abs(a.f32()[i] - b.f32()[i])));
        ref = std::max(ref, double(std::abs(b.f32()[i])));
    }
    return ref > 0 ? m / ref : m;
}

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
    fmt::print("demo model: preset tiny ({} layers, d_model {}, head_dim {}, {} experts)\n",
               cfg.n_layers, cfg.d_model, cfg.head_dim, cfg.n_experts);

    std::mt19937_64 rng(a.seed);
    std::vector<int32_t> prompt(a.length);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % cfg.vocab_size);
    fmt::print("prompt: {} random tokens, CPU fp32\n", a.length);
    Tensor reference;
    int agree = 0, runs = 0;
    // One row of the report: the run agrees when its first token equals the reference's and its
    // logits are within `tol` (relative to the reference's largest).
    auto report = [&](int cp, TboMode tbo, const RunResult& r, double tol, const char* vs) {
        const Tensor& logits = r.out.logits[0];
        if (!reference.defined()) reference = logits;
        const double diff = max_rel_diff(logits, reference);
        const bool same = diff <= tol && argmax(logits.f32(), cfg.vocab_size) ==
                                             argmax(reference.f32(), cfg.vocab_size);
        agree += same;
        ++runs;
        fmt::print(
            "  CP={} TBO {:3}: first token {:4}  TTFT {:6.3f} s  {:6.0f} tokens/s  "
            "max rel diff vs {} {:.1e} {}\n",
            cp, tbo == TboMode::On ? "on" : "off", r.first_tokens[0], r.prefill_seconds,
            a.length / r.prefill_seconds, vs, diff, same ? "ok" : "MISMATCH");
    };
    for (int cp : {1, 2}) {
        EngineOptions eo;
        eo.threads = a.threads;
        eo.cp = cp;
        PrefillEngine engine(dir.string(), eo);
        for (TboMode tbo : {TboMode::Off, TboMode::On}) {
            RunOptions ro;
            ro.tbo = tbo;
            report(cp, tbo, engine.run({prompt}, ro), 1e-5, "CP=1");
        }
    }
    std::string why;
    const int gpus = a.device == "cpu" ? 0 : cuda_device_count(&why);
    if (a.device == "cuda") CPFILL_CHECK(gpus > 0, "--device cuda: no usable GPU: {}", why);
    if (gpus > 0) {
        // bf16 against fp32 (docs/numerics.md): same first token, logits within 2e-2.
        fmt::print("CUDA bf16 on {} GPU(s), compared with CPU CP=1:\n", std::min(gpus, 2));
        for (int cp = 1; cp <= std::min(gpus, 2); ++cp) {
            EngineOptions eo;
            eo.threads = a.threads;
            eo.cp = cp;
            eo.cuda = true;
            PrefillEngine engine(dir.string(), eo);
            for (TboMode tbo : {TboMode::Off, TboMode::On}) {
                RunOptions ro;
                ro.tbo = tbo;
                engine.run({prompt}, ro);  // warm-up: cuBLASLt plans, NCCL channels
                report(cp, tbo, engine.run({prompt}, ro), 2e-2, "CPU");
            }
        }
    } else if (a.device == "auto") {
        fmt::print("(no GPU run: {})\n", why);
    }
    fmt::print("{} of {} runs agree\n", agree, runs);
    return agree == runs ? 0 : 1;
}

}  // namespace

Runner add_demo_command(CLI::App& app) {
    auto a = std::make_shared<DemoArgs>();
    CLI::App* c = app.add_subcommand("demo", "run a small random model with CP=1/2, TBO off/on");
    c->add_option("--length", a->length, "prompt tokens")->check(CLI::Range(1, 1 << 20));
    c->add_option("--threads", a->threads, "CPU threads (default: all)");
    c->add_option("--seed", a->seed, "model and prompt seed");
    c->add_option("--device", a->device, "auto (CPU, plus GPUs when usable), cpu or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    return [a] { return demo(*a); };
}

}  // namespace cpfill::tools
