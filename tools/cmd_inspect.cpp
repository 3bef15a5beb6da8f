// cpfill inspect: a checkpoint's config, layer schedule, stored tensors by dtype, unused tensors
// and the fp32 memory the CPU backend needs.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "engine/prefill_engine.h"
#include "io/checkpoint.h"
#include "io/presets.h"
#include "model/weight_bytes.h"
#include "model/weights.h"
#include "tools/commands.h"

namespace cpfill::tools {

namespace {

std::string gib(double bytes) {
    if (bytes < double(1ull << 30)) return fmt::format("{:.2f} MiB", bytes / (1ull << 20));
    return fmt::format("{:.3f} GiB", bytes / (1ull << 30));
}

// GPU weights per rank (the widest slice) in both formats, for --cp 1, 2, 4, 8 and `cp`.
void print_gpu_weights(const ModelConfig& c, int cp, const char* auto_means) {
    fmt::print("  GPU weights per rank (--weights auto: {}), plus the workspace:\n", auto_means);
    std::vector<int> sizes{1, 2, 4, 8};
    if (std::find(sizes.begin(), sizes.end(), cp) == sizes.end()) sizes.push_back(cp);
    for (int n : sizes) {
        if (n > c.moe_dim) continue;
        fmt::print("    --cp {}: bf16 {}, fp8 {}, fp8 + fp4 experts {}\n", n,
                   gib(double(gpu_weight_bytes(c, n))),
                   gib(double(gpu_weight_bytes(c, n, GpuWeightFormat::Fp8))),
                   gib(double(gpu_weight_bytes(c, n, GpuWeightFormat::Fp4))));
    }
}

// inspect --preset: the GPU memory of a preset's model, no checkpoint needed.
int inspect_preset(const std::string& name, int cp) {
    const ModelConfig c = preset_config(name);
    fmt::print("preset {}: {} layers, d_model {}, {} experts of width {}\n", name, c.n_layers,
               c.d_model, c.n_experts, c.moe_dim);
    print_gpu_weights(c, cp, "as the checkpoint stores them; fp8 + fp4 experts for the release");
    return 0;
}

int inspect(const std::string& dir, int cp) {
    Checkpoint ck(dir);
    ck.validate();
    const ModelConfig& c = ck.config();
    fmt::print("model {} (naming: {})\n", dir, ck.naming());
    fmt::print("  vocab {}  d_model {}  layers {}  heads {} x {} (rope {})  q_rank {}\n",
               c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.head_dim, c.rope_dim, c.q_rank);
    fmt::print("  o_groups {} x o_rank {}  window {}  hc {}  experts {} (top {}, width {})\n",
               c.o_groups, c.o_rank, c.window, c.hc, c.n_experts, c.top_k, c.moe_dim);
    fmt::print("  indexer {} heads x {}, top-k {}; compress ratios CSA {} HCA {}\n",
               c.index_n_heads, c.index_head_dim, c.index_topk, c.csa_ratio, c.hca_ratio);
    fmt::print("  layers:");
    for (int i = 0; i < c.n_layers; ++i)
        fmt::print(" {}:{}/{}", i, attn_type_name(c.layer_types[i]), mlp_type_name(c.mlp_types[i]));
    fmt::print("\n");
    std::map<std::string, std::pair<int, double>> by_dtype;
    double stored = 0, fp32 = 0, expert_stored = 0, expert_fp32 = 0;
    for (const auto& spec : ck.specs().all()) {
        StoredWeight w = ck.stored(spec.name);
        auto& e = by_dtype[std::string(dtype_name(w.dtype))];
        e.first += 1;
        e.second += static_cast<double>(w.bytes);
        stored += static_cast<double>(w.bytes);
        fp32 += 4.0 * static_cast<double>(shape_numel(spec.shape));
        if (is_expert_weight(spec)) {
            expert_stored += static_cast<double>(w.bytes);
            expert_fp32 += 4.0 * static_cast<double>(shape_numel(spec.shape));
        }
    }
    for (const auto& [name, e] : by_dtype)
        fmt::print("  {:8} {:6} weights  {}\n", name, e.first, gib(e.second));
    fmt::print("  stored {}; CPU backend (fp32) needs {}\n", gib(stored), gib(fp32));
    // docs/design.md §4: attention, norms, router and head replicated; routed and shared experts
    // 1/C.
    fmt::print("  per rank with --cp {}: stored {} (experts {} / {}), CPU fp32 {}\n", cp,
               gib(stored - expert_stored + expert_stored / cp), gib(expert_stored), cp,
               gib(fp32 - expert_fp32 + expert_fp32 / cp));
    // What a run needs: host memory while loading, and GPU memory for the bf16 weights.
    std::vector<int> all_ranks(static_cast<size_t>(cp));
    for (int r = 0; r < cp; ++r) all_ranks[static_cast<size_t>(r)] = r;
    fmt::print(
        "  host memory to load with --cp {}: CPU backend {}; CUDA backend {} in one process, "
        "{} per process under mpirun (one layer at a time)\n",
        cp, gib(double(rank_weights_host_bytes(c, cp, all_ranks))),
        gib(double(streamed_load_host_bytes(c, cp, all_ranks))),
        gib(double(streamed_load_host_bytes(c, cp, {0}))));
    print_gpu_weights(c, cp, std::string(gpu_weight_format_name(stored_gpu_format(ck))).c_str());
    auto unused = ck.unused_tensors();
    if (!unused.empty())
        fmt::print("  {} stored tensors unused (e.g. {})\n", unused.size(), unused.front());
    return 0;
}

}  // namespace

Runner add_inspect_command(CLI::App& app) {
    auto dir = std::make_shared<std::string>();
    auto preset = std::make_shared<std::string>();
    auto cp = std::make_shared<int>(1);
    CLI::App* c = app.add_subcommand("inspect", "describe a checkpoint");
    auto* model = c->add_option("--model", *dir, "model folder");
    auto* pre = c->add_option("--preset", *preset,
                              "a preset's model instead (tiny, flash, pro, ...): its GPU memory");
    model->excludes(pre);
    c->add_option("--cp", *cp, "show each rank's weight bytes for this many ranks")
        ->check(CLI::Range(1, 1024));
    return [dir, preset, cp] {
        CPFILL_CHECK(!dir->empty() || !preset->empty(),
                     "inspect: give --model DIR (a checkpoint) or --preset NAME");
        return preset->empty() ? inspect(*dir, *cp) : inspect_preset(*preset, *cp);
    };
}

}  // namespace cpfill::tools
