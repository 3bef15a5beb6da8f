// The bench report: FLOP model (docs/architecture.md §5.1), derived ratios (docs/performance.md
// "How to count") and the markdown and JSON writers. The SVG plot is in bench_plot.cpp.
#include "engine/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace cpfill {

namespace {

// Σ over query positions of the keys each one reads: window keys and compressed entries
// (selected ones for CSA, all eligible ones for HCA), and the entries the CSA indexer scores.
struct KeyCounts {
    int64_t window = 0, entries = 0, scored = 0;
};

KeyCounts key_counts(const ModelConfig& c, AttnType attn, int64_t length) {
    KeyCounts k;
    const int64_t ratio = attn == AttnType::CSA ? c.csa_ratio : c.hca_ratio;
    for (int64_t t = 0; t < length; ++t) {
        k.window += std::min<int64_t>(t + 1, c.window);
        if (attn == AttnType::Sliding) continue;
        const int64_t eligible = (t + 1) / ratio;  // entry w visible iff w < floor((t+1)/R)
        if (attn == AttnType::CSA) {
            k.entries += std::min<int64_t>(c.index_topk, eligible);
            k.scored += eligible;
        } else {
            k.entries += eligible;
        }
    }
    return k;
}

// The CSA indexer's compressor projections (wkv, wgate, 2·d_I wide: overlapping windows) over
// `n` tokens: part of LayerFlops::indexer_fixed, run in the compressor phase (phase_floors).
double indexer_compressor_flops(const ModelConfig& c, double n) {
    return n * 2 * 2 * c.d_model * (2.0 * c.index_head_dim);
}

}  // namespace

double LayerFlops::total() const {
    return mhc + attn_proj + compressor + indexer_fixed + core_attention + indexer_scoring + moe;
}

LayerFlops layer_flops(const ModelConfig& c, AttnType attn, MlpType /*mlp*/, int64_t length) {
    const double n = static_cast<double>(length);
    const double D = c.d_model, H = c.n_heads, d = c.head_dim, N = c.hc;
    const double nI = c.index_n_heads, dI = c.index_head_dim;
    LayerFlops f;
    // Per site: fn [(2+N)·N, N·D] on the flattened streams, collapse, post, comb mix (N×N).
    f.mhc = n * 2 * (2 * (2 + N) * N * N * D + 2 * N * D + 2 * N * D + 2 * N * N * D);
    f.attn_proj = n * (2 * D * c.q_rank + 2 * c.q_rank * H * d + 2 * D * d + 2 * H * d * c.o_rank +
                       2 * c.o_groups * c.o_rank * D);
    const KeyCounts k = key_counts(c, attn, length);
    f.core_attention = 4 * H * d * static_cast<double>(k.window + k.entries);
    if (attn == AttnType::HCA) f.compressor = n * 2 * 2 * D * d;
    if (attn == AttnType::CSA) {
        f.compressor = n * 2 * 2 * D * (2 * d);
        f.indexer_fixed =
            n * (2 * c.q_rank * nI * dI + 2 * D * nI) + indexer_compressor_flops(c, n);
        f.indexer_scoring = 2 * nI * dI * static_cast<double>(k.scored);
    }
    const double experts = c.top_k + c.n_shared_experts;
    f.moe = n * (6 * D * c.moe_dim * experts + 2 * D * c.n_experts);
    return f;
}

double head_flops(const ModelConfig& c) { return 2.0 * c.d_model * c.vocab_size; }

double prefill_flops(const ModelConfig& c, int64_t length) {
    std::map<AttnType, int> count;
    for (AttnType t : c.layer_types) ++count[t];
    double sum = head_flops(c);
    for (auto [t, n] : count) sum += n * layer_flops(c, t, MlpType::Learned, length).total();
    return sum;
}

std::optional<GpuPhases> phase_floors(const ModelConfig& cfg, int64_t length, int cp, bool fp8,
                                      bool fp8_indexer, const std::optional<BenchCeilings>& c,
                                      int residual_bytes) {
    if (!c || c->gemm_tflops <= 0 || c->hbm_gbps <= 0 ||
        ((fp8 || fp8_indexer) && c->fp8_gemm_tflops <= 0) || cp < 1)
        return std::nullopt;
    const double bf16 = c->gemm_tflops * 1e12, lin = fp8 ? c->fp8_gemm_tflops * 1e12 : bf16;
    const double scores = fp8_indexer ? c->fp8_gemm_tflops * 1e12 : bf16;
    const double n = static_cast<double>(length);
    GpuPhases f;
    for (AttnType t : cfg.layer_types) {
        const LayerFlops l = layer_flops(cfg, t, MlpType::Learned, length);
        // The indexer's compressor runs in the compressor phase (bf16 weights).
        const double idx_comp = t == AttnType::CSA ? indexer_compressor_flops(cfg, n) : 0.0;
        f.attention += l.attn_proj / lin + l.core_attention / bf16;
        f.compressor += (l.compressor + idx_comp) / bf16;
        f.indexer += (l.indexer_fixed - idx_comp) / lin + l.indexer_scoring / scores;
        f.moe += l.moe / lin;
        f.other += n * 2 * 2 * cfg.hc * cfg.d_model * double(residual_bytes) / (c->hbm_gbps * 1e9);
    }
    for (double* v : {&f.attention, &f.indexer, &f.compressor, &f.moe, &f.other}) *v /= cp;
    return f;
}

ModelConfig with_layer_count(const ModelConfig& cfg, int n_layers) {
    CPFILL_CHECK(n_layers >= 1, "--layers {}: expected at least 1", n_layers);
    CPFILL_CHECK(!cfg.layer_types.empty() && cfg.mlp_types.size() == cfg.layer_types.size(),
                 "with_layer_count: the config has no layer types to repeat");
    ModelConfig c = cfg;
    const size_t old = cfg.layer_types.size(), n = static_cast<size_t>(n_layers);
    c.layer_types.resize(n);
    c.mlp_types.resize(n);
    for (size_t i = old; i < n; ++i) {
        c.layer_types[i] = old >= 2 ? cfg.layer_types[old - 2 + (i - old) % 2] : cfg.layer_types[0];
        c.mlp_types[i] = cfg.mlp_types.back();
    }
    c.n_layers = n_layers;
    validate_model_config(c, fmt::format("config with {} layers", n_layers));
    return c;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string format_length(int64_t n) {
    if (n > 0 && n % (1 << 20) == 0) return fmt::format("{}M", n >> 20);
    if (n > 0 && n % 1024 == 0) return fmt::format("{}k", n / 1024);
    return fmt::format("{}", n);
}

std::optional<ProjectionTarget> projection_target(const std::string& preset) {
    if (preset.rfind("flash", 0) == 0) return ProjectionTarget{"V4-Flash", 2, 21, 20};
    if (preset.rfind("pro", 0) == 0) return ProjectionTarget{"V4-Pro", 0, 30, 31};
    return std::nullopt;
}

namespace {

std::string short_name(AttnType t) {
    return t == AttnType::Sliding ? "sliding" : t == AttnType::CSA ? "csa" : "hca";
}

// Mean seconds per attention type over the layers of the phase-timing run.
std::vector<LayerTypeTime> layer_type_times(const ModelConfig& c, const BenchRow& row) {
    std::vector<LayerTypeTime> out;
    if (row.layer_seconds.size() != c.layer_types.size()) return out;
    for (AttnType t : {AttnType::Sliding, AttnType::CSA, AttnType::HCA}) {
        LayerTypeTime lt{t, 0, 0};
        for (size_t i = 0; i < row.layer_seconds.size(); ++i)
            if (c.layer_types[i] == t) ++lt.layers, lt.mean_seconds += row.layer_seconds[i];
        if (lt.layers == 0) continue;
        lt.mean_seconds /= lt.layers;
        out.push_back(lt);
    }
    return out;
}

void project(const BenchReport& r, BenchRow& row) {
    const std::optional<ProjectionTarget> target = projection_target(r.preset);
    if (!target) {
        row.projection_note = fmt::format("no full model to project to for preset {}", r.preset);
        return;
    }
    if (row.layer_types.empty()) {
        row.projection_note = "no per-layer times";
        return;
    }
    Projection p{*target, 0, 0, 0, 0, 0};
    double layers = 0;
    for (double s : row.layer_seconds) layers += s;
    p.remainder_seconds = std::max(0.0, row.ttft - layers);
    p.ttft = p.remainder_seconds;
    p.flops = head_flops(r.config);
    for (auto [type, count] : {std::pair{AttnType::Sliding, target->sliding},
                               {AttnType::CSA, target->csa},
                               {AttnType::HCA, target->hca}}) {
        if (count == 0) continue;
        auto it = std::find_if(row.layer_types.begin(), row.layer_types.end(),
                               [&](const LayerTypeTime& lt) { return lt.type == type; });
        if (it == row.layer_types.end()) {
            row.projection_note = fmt::format("no {} layer measured", short_name(type));
            return;
        }
        p.ttft += count * it->mean_seconds;
        p.flops += count * layer_flops(r.config, type, MlpType::Learned, row.length).total();
    }
    p.mfu = p.flops / (kPeakFlopsPerGpu * row.cp * p.ttft);
    p.tokens_per_s_per_gpu = row.length / p.ttft / row.cp;
    row.projection = p;
}

}  // namespace

void finalize_report(BenchReport& r) {
    for (BenchRow& row : r.rows) {
        row.flops = prefill_flops(r.config, row.length);
        if (!row.measured() || row.ttft_runs.empty()) continue;
        row.ttft = median(row.ttft_runs);
        row.tokens_per_s = row.length / row.ttft;
        row.tokens_per_s_per_gpu = row.tokens_per_s / row.cp;
        row.mfu = row.flops / (kPeakFlopsPerGpu * row.cp * row.ttft);
        if (row.cp > 1 && !row.no_comm_runs.empty()) {
            row.ttft_no_comm = median(row.no_comm_runs);
            row.exposed = row.ttft / *row.ttft_no_comm - 1;
        }
        row.layer_types = layer_type_times(r.config, row);
        // fp4 rows run their experts as fp8 GEMMs (re-encoded per layer) and their linears in fp8.
        row.floors = phase_floors(r.config, row.length, row.cp, row.weights != "bf16",
                                  row.indexer == "fp8", r.ceilings, row.residual == "bf16" ? 2 : 4);
        project(r, row);
    }
    for (BenchRow& row : r.rows) {
        if (!row.measured() || row.ttft <= 0) continue;
        for (const BenchRow& base : r.rows)
            if (base.cp == 1 && base.length == row.length && base.tbo == row.tbo &&
                base.weights == row.weights && base.measured() && base.ttft > 0)
                row.speedup = base.ttft / row.ttft;
    }
}

// ---- markdown
// ------------------------------------------------------------------------------------

namespace {

std::string cell(const std::string& s) {  // a table cell: '|' would end it
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
}

std::string opt(const std::optional<double>& v, const char* spec) {
    return v ? fmt::format(fmt::runtime(spec), *v) : "–";
}

// "256k", or "256k in 64k chunks" for a chunked prefill.
std::string length_label(const BenchRow& row) {
    if (row.chunk <= 0) return format_length(row.length);
    return fmt::format("{} in {} chunks", format_length(row.length), format_length(row.chunk));
}

std::string tbo_label(const BenchRow& row) {
    if (!row.measured()) return row.tbo;
    if (row.tbo == "auto") return row.tbo_used ? "auto (on)" : "auto (off)";
    if (row.tbo == "on" && !row.tbo_used) return "on (not used)";
    return row.tbo;
}

std::string header(const BenchReport& r) {
    std::string types;
    for (AttnType t : r.config.layer_types) types += (types.empty() ? "" : ", ") + short_name(t);
    std::string s = fmt::format("## cpfill bench: preset {} ({} layers: {}), {} × {}\n\n", r.preset,
                                r.config.n_layers, types, r.gpus, r.device);
    // Every row of a run keeps the residual alike (`--residual`).
    const std::string residual = r.rows.empty() ? "fp32" : r.rows.front().residual;
    s += fmt::format(
        "TTFT = median of {} runs after {} warm-up; one request of random token ids, random "
        "weights (seed {}); indexer {}; mHC residual {}.\n",
        r.repeat, r.warmup, r.seed,
        r.indexer == "auto" ? "fp8 in the fp8 / fp4 rows, bf16 in the others (auto)"
                            : r.indexer + " in every row",
        residual);
    if (!r.kernels.empty()) s += fmt::format("Kernels: {}.\n", r.kernels);
    if (r.collectives != "nccl")
        s += fmt::format("Collectives: {} (the GPUs' copy engines).\n", r.collectives);
    if (r.ceilings) {
        const BenchCeilings& c = *r.ceilings;
        s += fmt::format(
            "Ceilings (this machine, this run): bf16 GEMM 8192³ {:.0f} TFLOP/s, {}HBM copy {:.0f} "
            "GB/s, NCCL all-gather 1 GiB ",
            c.gemm_tflops,
            c.fp8_gemm_tflops > 0
                ? fmt::format("fp8 GEMM 8192³ (128×128 / 1×128 block scales) {:.0f} TFLOP/s, ",
                              c.fp8_gemm_tflops)
                : std::string(),
            c.hbm_gbps);
        s +=
            c.allgather_gpus > 1
                ? fmt::format(
                      "{:.0f} GB/s busbw on {} GPUs{}.\n", c.allgather_busbw_gbps, c.allgather_gpus,
                      c.ce_allgather_busbw_gbps > 0
                          ? fmt::format(" (copy engines: {:.0f} GB/s)", c.ce_allgather_busbw_gbps)
                          : std::string())
                : std::string("not measured (one GPU).\n");
    }
    s += fmt::format(
        "FLOPs as in docs/architecture.md §5.1 (keys really attended, indexer scoring over "
        "eligible entries, head for the last token); MFU = FLOPs / ({:.0f} TFLOP/s × GPUs × "
        "TTFT).\n\n",
        kPeakFlopsPerGpu / 1e12);
    return s;
}

std::string main_table(const BenchReport& r) {
    std::string s =
        "| cp | TBO | weights | length | TFLOP | TTFT ms | tokens/s | tokens/s/GPU | MFU | CP "
        "speed-up | exposed comm | peak GB/GPU |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const BenchRow& row : r.rows) {
        s += fmt::format("| {} | {} | {} | {} | {:.2f} | ", row.cp, tbo_label(row), row.weights,
                         length_label(row), row.flops / 1e12);
        if (!row.measured()) {
            s += fmt::format("skipped: {} | – | – | – | – | – | – |\n", cell(row.skipped));
            continue;
        }
        const std::optional<double> exposed =
            row.exposed ? std::optional<double>(*row.exposed * 100) : std::nullopt;
        s += fmt::format("{:.1f} | {:.0f} | {:.0f} | {:.1f}% | {} | {} | {:.1f} |\n",
                         row.ttft * 1e3, row.tokens_per_s, row.tokens_per_s_per_gpu, row.mfu * 100,
                         opt(row.speedup, "{:.2f}×"), opt(exposed, "{:+.1f}%"),
                         row.peak_bytes / 1e9);
    }
    return s;
}

std::string phase_table(const BenchReport& r) {
    std::string s =
        "\n### Time per phase and per layer (the phase-timing run, ms)\n\n"
        "| cp | TBO | weights | length | attention | indexer | compressor | MoE | collectives | "
        "other | sliding /layer | CSA /layer | HCA /layer |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (const BenchRow& row : r.rows) {
        if (!row.measured()) continue;
        const BenchPhases& p = row.phases;
        s += fmt::format(
            "| {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} |", row.cp,
            tbo_label(row), row.weights, length_label(row), p.attention * 1e3, p.indexer * 1e3,
            p.compressor * 1e3, p.moe * 1e3, p.collectives * 1e3, p.other * 1e3);
        for (AttnType t : {AttnType::Sliding, AttnType::CSA, AttnType::HCA}) {
            std::optional<double> ms;
            for (const LayerTypeTime& lt : row.layer_types)
                if (lt.type == t) ms = lt.mean_seconds * 1e3;
            s += fmt::format(" {} |", opt(ms, "{:.2f}"));
        }
        s += "\n";
    }
    return s;
}

// measured / floor (ratio×) of one phase.
std::string floor_cell(double measured, double floor) {
    if (floor <= 0) return fmt::format("{:.1f} / –", measured * 1e3);
    return fmt::format("{:.1f} / {:.1f} ({:.2f}×)", measured * 1e3, floor * 1e3, measured / floor);
}

std::string floor_table(const BenchReport& r) {
    std::string s =
        "\n### Phases against their floors (ms: measured / floor)\n\n"
        "Floor: the phase's FLOPs at this run's GEMM ceiling (fp8 rows: the fp8 one for the "
        "linears) and, for other (mHC, norms), one read and one write of the residual streams per "
        "mHC site at the HBM rate (docs/bench.md).\n\n"
        "| cp | TBO | weights | length | attention | indexer | compressor | MoE | other |\n"
        "|---:|---|---|---:|---:|---:|---:|---:|---:|\n";
    bool any = false;
    for (const BenchRow& row : r.rows) {
        if (!row.measured() || !row.floors) continue;
        any = true;
        const BenchPhases &p = row.phases, &f = *row.floors;
        s += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", row.cp, tbo_label(row),
                         row.weights, length_label(row), floor_cell(p.attention, f.attention),
                         floor_cell(p.indexer, f.indexer), floor_cell(p.compressor, f.compressor),
                         floor_cell(p.moe, f.moe), floor_cell(p.other, f.other));
    }
    return any ? s : std::string();
}

std::string projection_table(const BenchReport& r) {
    std::string s =
        "\n### Full-model projection — a projection, not a measurement\n\n"
        "Measured mean time per layer of each type × the full model's count of that type + the "
        "measured remainder (TTFT − Σ layer times).\n\n"
        "| cp | TBO | weights | length | model | layers (sliding + CSA + HCA) | projected TTFT "
        "ms | tokens/s/GPU | MFU |\n"
        "|---:|---|---|---:|---|---|---:|---:|---:|\n";
    for (const BenchRow& row : r.rows) {
        if (!row.measured()) continue;
        s += fmt::format("| {} | {} | {} | {} | ", row.cp, tbo_label(row), row.weights,
                         length_label(row));
        if (!row.projection) {
            s += fmt::format("– ({}) | – | – | – | – |\n", cell(row.projection_note));
            continue;
        }
        const Projection& p = *row.projection;
        s += fmt::format("{} | {} + {} + {} | {:.1f} | {:.0f} | {:.1f}% |\n", p.target.model,
                         p.target.sliding, p.target.csa, p.target.hca, p.ttft * 1e3,
                         p.tokens_per_s_per_gpu, p.mfu * 100);
    }
    return s;
}

}  // namespace

std::string report_markdown(const BenchReport& r) {
    std::string s = header(r) + main_table(r);
    const bool any = std::any_of(r.rows.begin(), r.rows.end(),
                                 [](const BenchRow& row) { return row.measured(); });
    if (any) s += phase_table(r) + floor_table(r) + projection_table(r);
    return s;
}

// ---- JSON
// ----------------------------------------------------------------------------------------

namespace {

using nlohmann::json;

json opt_json(const std::optional<double>& v) { return v ? json(*v) : json(nullptr); }

template <class T>
T field(const json& j, const char* key) {
    try {
        return j.at(key).get<T>();
    } catch (const json::exception& e) {
        CPFILL_FAIL("bench report: field \"{}\": {}", key, e.what());
    }
}

std::optional<double> opt_field(const json& j, const char* key) {
    if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
    return field<double>(j, key);
}

AttnType attn_from_name(const std::string& s) {
    for (AttnType t : {AttnType::Sliding, AttnType::CSA, AttnType::HCA})
        if (short_name(t) == s) return t;
    CPFILL_FAIL("bench report: layer type \"{}\": expected sliding, csa or hca", s);
}

GpuPhases phases_from_json(const json& p) {
    return {field<double>(p, "attention"),   field<double>(p, "indexer"),
            field<double>(p, "compressor"),  field<double>(p, "moe"),
            field<double>(p, "collectives"), field<double>(p, "other")};
}

json row_json(const BenchRow& row) {
    json j = {{"cp", row.cp},
              {"tbo", row.tbo},
              {"weights", row.weights},
              {"indexer", row.indexer},
              {"residual", row.residual},
              {"length", row.length},
              {"skipped", row.skipped},
              {"ttft_runs_s", row.ttft_runs},
              {"no_comm_runs_s", row.no_comm_runs},
              {"phase_run_s", row.phase_run_seconds},
              {"phases_s", phases_to_json(row.phases)},
              {"layer_seconds", row.layer_seconds},
              {"peak_bytes", row.peak_bytes},
              {"tbo_used", row.tbo_used},
              {"chunk", row.chunk},
              {"flops", row.flops},
              {"ttft_s", row.ttft},
              {"tokens_per_s", row.tokens_per_s},
              {"tokens_per_s_per_gpu", row.tokens_per_s_per_gpu},
              {"mfu", row.mfu},
              {"cp_speedup", opt_json(row.speedup)},
              {"ttft_no_comm_s", opt_json(row.ttft_no_comm)},
              {"exposed_comm", opt_json(row.exposed)},
              {"layer_types", json::array()},
              {"phase_floors_s", row.floors ? phases_to_json(*row.floors) : json(nullptr)},
              {"projection", nullptr},
              {"projection_note", row.projection_note}};
    for (const LayerTypeTime& lt : row.layer_types)
        j["layer_types"].push_back(
            {{"type", short_name(lt.type)}, {"layers", lt.layers}, {"mean_s", lt.mean_seconds}});
    if (const auto& p = row.projection)
        j["projection"] = {{"is_projection", true},
                           {"model", p->target.model},
                           {"sliding", p->target.sliding},
                           {"csa", p->target.csa},
                           {"hca", p->target.hca},
                           {"remainder_s", p->remainder_seconds},
                           {"ttft_s", p->ttft},
                           {"flops", p->flops},
                           {"mfu", p->mfu},
                           {"tokens_per_s_per_gpu", p->tokens_per_s_per_gpu}};
    return j;
}

BenchRow row_from_json(const json& j) {
    BenchRow row;
    row.cp = field<int>(j, "cp");
    row.tbo = field<std::string>(j, "tbo");
    row.weights = j.value("weights", std::string("bf16"));    // reports before --weights: bf16
    row.indexer = j.value("indexer", std::string("bf16"));    // reports before the fp8 indexer
    row.residual = j.value("residual", std::string("fp32"));  // reports before --residual
    row.length = field<int64_t>(j, "length");
    row.skipped = field<std::string>(j, "skipped");
    row.ttft_runs = field<std::vector<double>>(j, "ttft_runs_s");
    row.no_comm_runs = field<std::vector<double>>(j, "no_comm_runs_s");
    row.phase_run_seconds = field<double>(j, "phase_run_s");
    row.phases = phases_from_json(j.at("phases_s"));
    row.layer_seconds = field<std::vector<double>>(j, "layer_seconds");
    row.peak_bytes = field<uint64_t>(j, "peak_bytes");
    row.tbo_used = field<bool>(j, "tbo_used");
    row.chunk = j.value("chunk", int64_t{0});  // reports before GPU chunking: one pass
    row.flops = field<double>(j, "flops");
    row.ttft = field<double>(j, "ttft_s");
    row.tokens_per_s = field<double>(j, "tokens_per_s");
    row.tokens_per_s_per_gpu = field<double>(j, "tokens_per_s_per_gpu");
    row.mfu = field<double>(j, "mfu");
    row.speedup = opt_field(j, "cp_speedup");
    row.ttft_no_comm = opt_field(j, "ttft_no_comm_s");
    row.exposed = opt_field(j, "exposed_comm");
    for (const json& lt : field<json>(j, "layer_types"))
        row.layer_types.push_back({attn_from_name(field<std::string>(lt, "type")),
                                   field<int>(lt, "layers"), field<double>(lt, "mean_s")});
    if (j.contains("phase_floors_s") && !j.at("phase_floors_s").is_null())
        row.floors = phases_from_json(j.at("phase_floors_s"));  // reports before: none
    if (j.contains("projection") && !j.at("projection").is_null()) {
        const json& q = j.at("projection");
        row.projection = Projection{{field<std::string>(q, "model"), field<int>(q, "sliding"),
                                     field<int>(q, "csa"), field<int>(q, "hca")},
                                    field<double>(q, "remainder_s"),
                                    field<double>(q, "ttft_s"),
                                    field<double>(q, "flops"),
                                    field<double>(q, "mfu"),
                                    field<double>(q, "tokens_per_s_per_gpu")};
    }
    row.projection_note = field<std::string>(j, "projection_note");
    return row;
}

}  // namespace

nlohmann::json phases_to_json(const GpuPhases& p) {
    return {{"attention", p.attention},     {"indexer", p.indexer},
            {"compressor", p.compressor},   {"moe", p.moe},
            {"collectives", p.collectives}, {"other", p.other}};
}

nlohmann::json report_to_json(const BenchReport& r) {
    json j = {{"format", "cpfill-bench"},
              {"version", 1},
              {"preset", r.preset},
              {"config", json::parse(model_config_to_json(r.config, "hf"))},
              {"device", r.device},
              {"gpus", r.gpus},
              {"repeat", r.repeat},
              {"warmup", r.warmup},
              {"seed", r.seed},
              {"indexer", r.indexer},
              {"peak_flops_per_gpu", kPeakFlopsPerGpu},
              {"ceilings", nullptr},
              {"rows", json::array()}};
    j["kernels"] = r.kernels;
    j["collectives"] = r.collectives;
    if (const auto& c = r.ceilings)
        j["ceilings"] = {{"gemm_tflops", c->gemm_tflops},
                         {"fp8_gemm_tflops", c->fp8_gemm_tflops},
                         {"hbm_gbps", c->hbm_gbps},
                         {"allgather_busbw_gbps", c->allgather_busbw_gbps},
                         {"allgather_gpus", c->allgather_gpus},
                         {"ce_allgather_busbw_gbps", c->ce_allgather_busbw_gbps}};
    for (const BenchRow& row : r.rows) j["rows"].push_back(row_json(row));
    return j;
}

BenchReport report_from_json(const nlohmann::json& j) {
    CPFILL_CHECK(j.is_object() && j.value("format", "") == "cpfill-bench",
                 "bench report: expected an object with \"format\": \"cpfill-bench\"");
    BenchReport r;
    r.preset = field<std::string>(j, "preset");
    r.config = parse_model_config(field<json>(j, "config").dump(), "bench report config");
    r.device = field<std::string>(j, "device");
    r.gpus = field<int>(j, "gpus");
    r.repeat = field<int>(j, "repeat");
    r.warmup = field<int>(j, "warmup");
    r.seed = field<uint64_t>(j, "seed");
    r.indexer = j.value("indexer", std::string("auto"));          // reports before --indexer: auto
    r.kernels = j.value("kernels", std::string());                // reports before it: not recorded
    r.collectives = j.value("collectives", std::string("nccl"));  // before --collectives
    if (j.contains("ceilings") && !j.at("ceilings").is_null()) {
        const json& c = j.at("ceilings");
        r.ceilings =
            BenchCeilings{field<double>(c, "gemm_tflops"), c.value("fp8_gemm_tflops", 0.0),
                          field<double>(c, "hbm_gbps"),    field<double>(c, "allgather_busbw_gbps"),
                          field<int>(c, "allgather_gpus"), c.value("ce_allgather_busbw_gbps", 0.0)};
    }
    for (const json& row : field<json>(j, "rows")) r.rows.push_back(row_from_json(row));
    return r;
}

}  // namespace cpfill
