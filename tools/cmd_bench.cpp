// cpfill bench: times the CUDA prefill of one random prompt per length on random weights, for each
// CP size and TBO mode, and reports TTFT, tokens/s, MFU, CP speed-up, exposed communication, a
// per-phase and per-layer-type breakdown and a full-model projection (docs/bench.md). Rows that do
// not fit in memory or fail are kept, with the reason. Progress goes to stderr, the table to
// stdout.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "core/error.h"
#include "engine/bench_report.h"
#include "io/presets.h"
#include "parallel/gpu_prefill.h"
#include "runtime/device.h"
#include "tools/cli_options.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

struct BenchArgs {
    std::string preset = "flash-slice";
    int layers = 0;
    CLI::Option* layers_opt = nullptr;  // --layers given: otherwise the preset's count
    std::string lengths = "8k,32k,64k";
    std::string cp = "1,2";
    std::string tbo = "off,on";
    std::string weights = "bf16";
    std::string indexer = "auto";
    std::string collectives = "nccl";
    int repeat = 3;
    int warmup = 1;
    uint64_t seed = 1;
    std::string json;
    std::string plot;
    bool no_exposed = false;
    bool no_ceilings = false;
    int64_t chunk = 0;  // --chunk: tokens per chunk (0: one pass, chunks where it does not fit)
    int expert_streams = GpuRunOptions{}.expert_streams;
    std::string expert_gemm = "auto";
    std::string mhc_fused = "on";
    std::string residual = "fp32";
};

TboMode tbo_mode(const std::string& s) {
    return s == "on" ? TboMode::On : s == "auto" ? TboMode::Auto : TboMode::Off;
}

struct Plan {
    ModelConfig cfg;
    std::vector<int64_t> lengths;
    std::vector<int> cps;
    std::vector<std::string> tbos;
    std::vector<std::string> weights;
};

Plan make_plan(const BenchArgs& a) {
    Plan p;
    p.cfg = preset_config(a.preset);
    if (a.layers_opt && a.layers_opt->count() > 0) p.cfg = with_layer_count(p.cfg, a.layers);
    for (const std::string& s : split_list(a.lengths, "--lengths")) {
        p.lengths.push_back(parse_count(s, "--lengths"));
        CPFILL_CHECK(p.lengths.back() <= p.cfg.max_position_embeddings,
                     "--lengths {}: longer than the model's {} positions", s,
                     p.cfg.max_position_embeddings);
    }
    for (const std::string& s : split_list(a.cp, "--cp")) {
        const bool digits = s.find_first_not_of("0123456789") == std::string::npos && s.size() < 6;
        CPFILL_CHECK(digits && std::stoi(s) >= 1, "--cp {}: expected an integer >= 1", s);
        p.cps.push_back(std::stoi(s));
    }
    for (const std::string& s : split_list(a.tbo, "--tbo")) {
        CPFILL_CHECK(s == "off" || s == "on" || s == "auto", "--tbo {}: expected off, on or auto",
                     s);
        p.tbos.push_back(s);
    }
    for (const std::string& s : split_list(a.weights, "--weights")) {
        CPFILL_CHECK(s == "bf16" || s == "fp8" || s == "fp4",
                     "--weights {}: expected bf16, fp8 or fp4", s);
        p.weights.push_back(s);
    }
    CPFILL_CHECK(a.repeat >= 1, "--repeat {}: expected at least 1", a.repeat);
    CPFILL_CHECK(a.warmup >= 0, "--warmup {}: expected at least 0", a.warmup);
    return p;
}

std::vector<int32_t> random_prompt(const ModelConfig& cfg, int64_t length, uint64_t seed) {
    std::mt19937_64 rng(seed + static_cast<uint64_t>(length));
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(cfg.vocab_size - 1));
    std::vector<int32_t> ids(length);
    for (int32_t& t : ids) t = token(rng);
    return ids;
}

// Warm-up, timed runs, the phase-timing run and (cp > 1) the no-communication runs of one row.
void measure(GpuGroup& g, const std::vector<int32_t>& prompt, const BenchArgs& a, BenchRow& row) {
    const std::vector<std::vector<int32_t>> requests{prompt};
    GpuRunOptions base;
    base.tbo = tbo_mode(row.tbo);
    base.chunk = a.chunk;
    base.expert_streams = a.expert_streams;
    base.expert_gemm = a.expert_gemm == "grouped"   ? ExpertGemm::Grouped
                       : a.expert_gemm == "streams" ? ExpertGemm::Streams
                                                    : ExpertGemm::Auto;
    base.mhc_fused = a.mhc_fused == "on";
    base.residual = parse_residual_dtype(a.residual);
    row.residual = a.residual;
    row.indexer = g.weight_stats().indexer_fp8 ? "fp8" : "bf16";
    auto once = [&](const GpuRunOptions& opt) {
        GpuStats st;
        g.run(requests, opt, &st);
        row.peak_bytes = std::max<uint64_t>(row.peak_bytes, st.peak_bytes);
        return st;
    };
    const std::string what =
        fmt::format("cp={} TBO {} {} {}", row.cp, row.tbo, row.weights, format_length(row.length));
    for (int i = 0; i < a.warmup; ++i) once(base);
    for (int i = 0; i < a.repeat; ++i) {
        const GpuStats st = once(base);
        row.ttft_runs.push_back(st.seconds);
        row.tbo_used = st.tbo_used;
        row.chunk = st.chunk;
        fmt::print(stderr,
                   "bench: {}: run {}/{} {:.4f} s ({} GEMM plans made in {:.1f} ms, arena "
                   "grown in {:.1f} ms)\n",
                   what, i + 1, a.repeat, st.seconds, st.gemm_plans, st.gemm_plan_seconds * 1e3,
                   st.arena_seconds * 1e3);
    }
    GpuRunOptions timed = base;
    timed.phase_timing = true;
    const GpuStats st = once(timed);
    row.phase_run_seconds = st.seconds;
    row.layer_seconds = st.layer_seconds;
    row.phases = st.phases;
    if (row.cp > 1 && !a.no_exposed) {
        GpuRunOptions silent = base;
        silent.no_comm = true;  // timing only: the result is wrong
        for (int i = 0; i < a.repeat; ++i) row.no_comm_runs.push_back(once(silent).seconds);
        fmt::print(stderr, "bench: {}: without communication {:.4f} s (median)\n", what,
                   median(row.no_comm_runs));
    }
}

// The rows of one CP size and weight format: memory check, then one GpuGroup for all rows that
// fit. A failed run skips its row with the error and the next row starts a fresh group (a failed
// group is aborted).
void run_cp(int cp, const std::string& weights, int gpus, const Plan& plan, const BenchArgs& a,
            std::vector<BenchRow>& rows) {
    const GpuWeightFormat format = parse_gpu_weight_format(weights);
    std::vector<BenchRow> mine;
    for (int64_t length : plan.lengths)
        for (const std::string& tbo : plan.tbos) {
            BenchRow& row = mine.emplace_back();
            row.cp = cp, row.tbo = tbo, row.length = length, row.weights = weights;
            if (cp > gpus) row.skipped = fmt::format("needs {} GPUs, {} visible", cp, gpus);
        }
    size_t free_bytes = SIZE_MAX;
    for (int d = 0; d < std::min(cp, gpus); ++d)
        free_bytes = std::min(free_bytes, cuda_device_info(d).free_bytes);
    for (BenchRow& row : mine) {
        if (!row.measured()) continue;
        // Without --chunk, a row whose one pass does not fit runs in chunks (GpuGroup::run picks
        // them): skipped only when chunks of kMinAutoChunk tokens do not fit either.
        const GpuIndexer indexer = parse_gpu_indexer(a.indexer);
        const ResidualDtype residual = parse_residual_dtype(a.residual);
        GpuMemoryPlan m = plan_gpu_memory(plan.cfg, row.length, 1, cp, row.tbo != "off", false,
                                          format, a.chunk, indexer, residual);
        if (m.total() > free_bytes && a.chunk == 0)
            m = plan_gpu_memory(plan.cfg, row.length, 1, cp, row.tbo != "off", false, format,
                                kMinAutoChunk, indexer, residual);
        if (m.total() > free_bytes)
            row.skipped = fmt::format(
                "not enough memory: needs {:.2f} GB per GPU (weights {:.2f} + workspace {:.2f}), "
                "{:.2f} GB free",
                m.total() / 1e9, m.weights / 1e9, m.workspace / 1e9, free_bytes / 1e9);
    }
    std::unique_ptr<GpuGroup> group;
    for (BenchRow& row : mine) {
        if (!row.measured()) continue;
        try {
            if (!group) {
                fmt::print(stderr, "bench: cp={}: setting up {} GPU(s), random {} weights\n", cp,
                           cp, weights);
                GpuGroupOptions opt;
                opt.cp = cp;
                opt.weights = format;
                opt.indexer = parse_gpu_indexer(a.indexer);
                opt.collectives = parse_gpu_collectives(a.collectives);
                group = std::make_unique<GpuGroup>(opt);
                group->randomize(plan.cfg, a.seed);
            }
            measure(*group, random_prompt(plan.cfg, row.length, a.seed), a, row);
        } catch (const std::exception& e) {
            fmt::print(stderr, "bench: cp={} TBO {} {}: {}\n", cp, row.tbo,
                       format_length(row.length), e.what());
            BenchRow failed;  // drop what the failed row had measured
            failed.cp = cp, failed.tbo = row.tbo, failed.length = row.length;
            failed.weights = weights;
            failed.skipped = fmt::format("error: {}", e.what());
            row = failed;
            group.reset();
        }
    }
    rows.insert(rows.end(), mine.begin(), mine.end());
}

void write_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    CPFILL_CHECK(out.good(), "{}: cannot open for writing", path);
    out << text;
    out.close();
    CPFILL_CHECK(!out.fail(), "{}: write failed", path);
}

int bench(const BenchArgs& a) {
    const Plan plan = make_plan(a);
    std::string why;
    const int gpus = cuda_device_count(&why);
    CPFILL_CHECK(gpus > 0, "cpfill bench times the CUDA backend, and no GPU is usable: {}", why);

    BenchReport report;
    report.preset = a.preset;
    report.config = plan.cfg;
    report.device = cuda_device_info(0).name;
    report.gpus = gpus;
    report.repeat = a.repeat;
    report.warmup = a.warmup;
    report.seed = a.seed;
    report.indexer = a.indexer;
    report.collectives = a.collectives;
    report.kernels = gpu_kernel_choices(plan.cfg);
    if (!a.no_ceilings) {
        fmt::print(stderr, "bench: measuring ceilings (GEMM, HBM, all-gather)\n");
        const GpuCeilings c = measure_gpu_ceilings();
        report.ceilings =
            BenchCeilings{c.gemm_tflops,          c.fp8_gemm_tflops, c.hbm_gbps,
                          c.allgather_busbw_gbps, c.allgather_gpus,  c.ce_allgather_busbw_gbps};
    }
    for (int cp : plan.cps)
        for (const std::string& w : plan.weights) run_cp(cp, w, gpus, plan, a, report.rows);
    finalize_report(report);

    fmt::print("{}", report_markdown(report));
    if (!a.json.empty()) write_file(a.json, report_to_json(report).dump(2) + "\n");
    if (!a.plot.empty()) write_file(a.plot, report_svg(report));
    const bool any = std::any_of(report.rows.begin(), report.rows.end(),
                                 [](const BenchRow& r) { return r.measured(); });
    CPFILL_CHECK(any, "no configuration could be measured (the table gives each reason)");
    return 0;
}

}  // namespace

Runner add_bench_command(CLI::App& app) {
    auto args = std::make_shared<BenchArgs>();
    CLI::App* c = app.add_subcommand("bench", "time the GPU prefill over lengths, CP and TBO");
    c->add_option("--preset", args->preset,
                  "model: tiny, flash, pro, flash-slice or pro-slice (random weights)")
        ->capture_default_str();
    args->layers_opt = c->add_option("--layers", args->layers,
                                     "number of layers (keeps the preset's layer-type pattern)");
    c->add_option("--lengths", args->lengths, "prompt lengths, k = 1024: 8k,32k,64k")
        ->capture_default_str();
    c->add_option("--cp", args->cp, "context-parallel sizes: 1,2")->capture_default_str();
    c->add_option("--tbo", args->tbo, "two-batch overlap modes: off,on (or auto)")
        ->capture_default_str();
    c->add_option("--weights", args->weights,
                  "weight formats on the GPUs: bf16,fp8,fp4 (fp8: the release's fp8 / fp4 "
                  "matrices in e4m3 with block scales; fp4: the routed experts in packed fp4)")
        ->capture_default_str();
    add_indexer_option(*c, args->indexer);
    add_collectives_option(*c, args->collectives);
    c->add_option("--repeat", args->repeat, "timed runs per row (TTFT = their median)")
        ->capture_default_str();
    c->add_option("--warmup", args->warmup, "untimed runs before them")->capture_default_str();
    c->add_option("--chunk", args->chunk,
                  "prefill in chunks of this many tokens (0: one pass where it fits, else the "
                  "largest power-of-two chunks that do)")
        ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
    c->add_option("--seed", args->seed, "seed of the weights and token ids")->capture_default_str();
    c->add_option("--json", args->json, "write the report as JSON to this file");
    c->add_option("--plot", args->plot, "write tokens/s per GPU vs length as SVG to this file");
    c->add_flag("--no-exposed", args->no_exposed,
                "skip the runs without communication (exposed communication)");
    c->add_flag("--no-ceilings", args->no_ceilings, "skip measuring GEMM/HBM/all-gather ceilings");
    c->add_option("--expert-gemm", args->expert_gemm,
                  "routed experts: grouped (one launch per GEMM for all experts), streams (a GEMM "
                  "pair per expert) or auto (the faster as measured: docs/fp8.md)")
        ->check(CLI::IsMember({"auto", "grouped", "streams"}))
        ->capture_default_str();
    add_residual_option(*c, args->residual);
    c->add_option("--mhc-fused", args->mhc_fused,
                  "on: each mHC post-mix fused with the next pre-mix and norm (one op); off: apart")
        ->check(CLI::IsMember({"on", "off"}))
        ->capture_default_str();
    c->add_option("--expert-streams", args->expert_streams,
                  "with --expert-gemm streams: CUDA streams the GEMM pairs are spread over")
        ->check(CLI::Range(1, 8))
        ->capture_default_str();
    return [args] { return bench(*args); };
}

}  // namespace cpfill::tools
