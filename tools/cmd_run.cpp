// cpfill run: prefill of one or more prompts given as token ids; prints each request's first
// (argmax) token, TTFT and tokens/s; optionally writes logits to a safetensors file.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "engine/kv_export.h"
#include "engine/prefill_engine.h"
#include "io/model_config.h"
#include "io/output_paths.h"
#include "io/safetensors.h"
#include "runtime/device.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/input_ids.h"
#include "tools/mpi_session.h"
#include "tools/prompt.h"

namespace cpfill::tools {

namespace {

namespace fs = std::filesystem;

struct RunArgs {
    std::string model;
    std::string prompt;
    std::string prompt_file;
    std::string tokenizer;
    bool no_bos = false;
    std::string input_ids;
    std::string input_ids_file;
    std::string device = "cpu";
    std::string weights = "auto";
    std::string indexer = "auto";
    std::string collectives = "nccl";
    std::string residual = "fp32";
    std::string logits_out;
    bool all_logits = false;
    int threads = 0;
    int cp = 1;
    std::string tbo = "auto";
    int64_t chunk = 0;
    std::string kv_out;
    bool json = false;
    bool no_warmup = false;
    int repeat = 1;
    int inject_fault_rank = -1;  // tests: this GPU rank fails at layer 1
};

int64_t peak_rss_bytes() {
    struct rusage u {};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// fp8 weights that did not re-encode exactly (fp4 experts whose 1×32 scales span more than 2^6 in
// a 128-block, or a bf16 checkpoint quantised with --weights fp8): said, never hidden.
void report_fp8_inexact(const PrefillEngine& engine) {
    const GpuGroup::WeightStats s = engine.gpu_weight_stats();
    if (s.fp8_inexact == 0) return;
    fmt::print(stderr,
               "note: {} of {} fp8 weight values ({:.3g}%) are not exact in e4m3 with power-of-two "
               "block scales and were rounded (docs/fp8.md)\n",
               s.fp8_inexact, s.fp8_values,
               100.0 * s.fp8_inexact / std::max<uint64_t>(1, s.fp8_values));
}

void print_json(const RunArgs& a, const PrefillEngine& engine, const RunResult& r,
                const std::vector<std::vector<int32_t>>& requests, double warmup_s,
                const std::vector<double>& repeats) {
    nlohmann::json j;
    j["requests"] = nlohmann::json::array();
    for (size_t i = 0; i < requests.size(); ++i)
        j["requests"].push_back(
            {{"tokens", requests[i].size()}, {"first_token", r.first_tokens[i]}});
    j["device"] = a.device;
    j["cp"] = a.cp;
    j["tbo"] = r.out.tbo_used;
    j["chunk"] = r.out.chunk;  // tokens per chunk used (0: one pass; on GPUs maybe chosen)
    j["residual"] = a.residual;
    j["n_tokens"] = r.n_tokens;
    j["timings"] = {{"load_s", engine.load_seconds()},
                    {"warmup_s", warmup_s},
                    {"ttft_s", r.prefill_seconds},
                    {"repeat_ttft_s", repeats},
                    {"tokens_per_s", r.n_tokens / r.prefill_seconds}};
    j["memory"] = {{"rank_weight_bytes", engine.rank_weight_bytes()},
                   {"peak_rss_bytes", peak_rss_bytes()}};
    if (a.device == "cuda") {
        // No phases_s: `run` does not time phases (that needs a timed run, `cpfill bench`), and
        // zeros would read as measurements.
        const GpuGroup::WeightStats ws = engine.gpu_weight_stats();
        j["gpu"] = {{"peak_bytes_per_gpu", r.gpu.peak_bytes},
                    {"gemm_plans_made", r.gpu.gemm_plans},
                    {"gemm_plan_s", r.gpu.gemm_plan_seconds},
                    {"arena_grow_s", r.gpu.arena_seconds},
                    {"weight_bytes_per_gpu", r.gpu.weight_bytes},
                    {"weights", gpu_weight_format_name(engine.gpu_weight_format())},
                    {"indexer", ws.indexer_fp8 ? "fp8" : "bf16"},
                    {"fp8_values", ws.fp8_values},
                    {"fp8_inexact_values", ws.fp8_inexact}};
        // The load's parts: the GPU group's set-up (contexts, NCCL), the upload of the weights (the
        // rest of load_s: the checkpoint's headers) and where it waited (docs/loading.md).
        const GpuGroup::StoredLoad& sl = engine.gpu_stored_load();
        j["gpu"]["load"] = {{"setup_s", engine.gpu_setup_seconds()},
                            {"weights_s", sl.seconds},
                            {"bytes", sl.bytes},
                            {"pieces_read_by_uploads", sl.misses},
                            {"reader_wait_s", sl.reader_wait_s},
                            {"upload_wait_s", sl.upload_wait_s}};
    }
    if (!a.logits_out.empty()) j["logits_out"] = a.logits_out;
    if (!a.kv_out.empty()) j["kv_out"] = a.kv_out;
    fmt::print("{}\n", j.dump());
}

TboMode parse_tbo(const std::string& s) {
    if (s == "on") return TboMode::On;
    if (s == "off") return TboMode::Off;
    return TboMode::Auto;
}

void write_logits(const std::string& path, const RunResult& r, bool all_logits) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    if (r.out.logits.size() == 1) {
        tensors.emplace_back("logits", r.out.logits[0]);
    } else {
        for (size_t i = 0; i < r.out.logits.size(); ++i)
            tensors.emplace_back(fmt::format("logits_{}", i), r.out.logits[i]);
    }
    write_safetensors(path, tensors,
                      {{"format", "cpfill-logits"}, {"positions", all_logits ? "all" : "last"}});
}

// The first tokens are argmaxes: over NaN or Inf logits they mean nothing (NaN compares false, so
// the argmax would be token 0). Refuses to report or write them.
void check_logits_finite(const RunResult& r, int64_t V) {
    for (size_t i = 0; i < r.out.logits.size(); ++i) {
        const Tensor& l = r.out.logits[i];  // f32 [V] or [len, V]
        const float* v = l.f32();
        int64_t bad = 0, first = -1;
        for (int64_t k = 0; k < l.numel(); ++k)
            if (!std::isfinite(v[k])) {
                if (first < 0) first = k;
                ++bad;
            }
        if (bad == 0) continue;
        const std::string where =
            l.ndim() == 2 ? fmt::format("position {}, token id {}", first / V, first % V)
                          : fmt::format("token id {}", first);
        CPFILL_FAIL(
            "request {}: the logits are not finite ({} of {} values; the first, at {}, is {}), "
            "expected finite logits: no first token can be reported (the activations overflowed; "
            "check the weights' scale)",
            i, bad, l.numel(), where, v[first]);
    }
}

// Everything the run reads: the model folder and its files, the prompt or ids file, the tokenizer.
std::vector<FileId> run_inputs(const RunArgs& a) {
    std::vector<FileId> in = folder_ids(a.model);
    for (const std::string& f : {a.prompt_file, a.input_ids_file})
        if (!f.empty())
            if (auto id = file_id(f)) in.push_back(*id);
    if (!a.prompt.empty() || !a.prompt_file.empty())
        if (auto id = file_id(find_tokenizer(a.tokenizer, a.model))) in.push_back(*id);
    return in;
}

// Bytes of a safetensors header with `tensors` entries (JSON of name, dtype, shape, offsets; the
// metadata): an upper bound for the names cpfill writes.
size_t header_bytes(size_t tensors) { return 4096 + 256 * tensors; }

// The output paths, before the model is loaded (docs/cli.md "Outputs"): creatable, not an input,
// not inside the model folder, and enough room for the sizes the requests determine.
void check_run_outputs(const RunArgs& a, const std::vector<std::vector<int32_t>>& requests) {
    if (a.logits_out.empty() && a.kv_out.empty()) return;
    const ModelConfig cfg = load_model_config((fs::path(a.model) / "config.json").string());
    const std::vector<FileId> inputs = run_inputs(a);
    const std::optional<FileId> model = file_id(a.model);
    const auto in_model_folder = [&](const fs::path& folder) {
        const auto id = file_id(folder.empty() ? "." : folder.string());
        return model && id && *model == *id;
    };
    std::vector<PlannedOutput> planned;
    if (!a.logits_out.empty()) {
        check_output_file(a.logits_out, "--logits-out");
        check_not_an_input(a.logits_out, "--logits-out", inputs);
        CPFILL_CHECK(!in_model_folder(fs::path(a.logits_out).parent_path()),
                     "--logits-out {}: is inside the model folder {}, expected a path outside it "
                     "(the loader reads the folder's safetensors files)",
                     a.logits_out, a.model);
        size_t bytes = header_bytes(requests.size());
        for (const auto& r : requests)
            bytes += (a.all_logits ? r.size() : 1) * static_cast<size_t>(cfg.vocab_size) * 4;
        planned.push_back({"--logits-out", a.logits_out, bytes});
    }
    if (!a.kv_out.empty()) {
        check_output_folder(a.kv_out, "--kv-out");
        CPFILL_CHECK(!in_model_folder(a.kv_out),
                     "--kv-out {}: is the model folder, expected another folder (the loader "
                     "would read the KV files as weights)",
                     a.kv_out);
        check_kv_out_dir(a.kv_out);  // stale or foreign files (docs/kv-state.md)
        const std::vector<std::string> files = kv_state_files(requests.size());
        for (size_t r = 0; r < files.size(); ++r) {
            const std::string path = (fs::path(a.kv_out) / files[r]).string();
            const std::string what = "--kv-out " + files[r];
            check_not_an_input(path, what, inputs);
            const size_t n = static_cast<size_t>(requests[r].size());
            planned.push_back(
                {what, path, kv_state_bytes(cfg, n) + header_bytes(11 * cfg.n_layers)});
            if (!a.logits_out.empty()) {
                std::error_code ec;
                CPFILL_CHECK(
                    fs::weakly_canonical(a.logits_out, ec) != fs::weakly_canonical(path, ec),
                    "--logits-out {}: is also the KV file {} of --kv-out: expected two "
                    "different outputs",
                    a.logits_out, path);
            }
        }
        check_not_an_input((fs::path(a.kv_out) / kKvManifest).string(), "--kv-out manifest",
                           inputs);
    }
    check_output_space(planned);
}

int run_checked(const RunArgs& a, const MpiSession& mpi);

int run(const RunArgs& a) {
    CPFILL_CHECK(a.device == "cpu" || a.device == "cuda", "--device {}: expected cpu or cuda",
                 a.device);
    if (a.device == "cuda") require_cuda_device();  // names why there is no usable GPU
    // A file size limit (ulimit -f) then fails the write with EFBIG, reported as an error,
    // instead of killing the process with SIGXFSZ.
    std::signal(SIGXFSZ, SIG_IGN);
    MpiSession mpi;
    if (!mpi.active() && a.device != "cuda") return run_checked(a, mpi);
    if (!mpi.active()) {
        // A GPU failure can leave kernels of aborted collectives on the devices; tearing the CUDA
        // state down could then wait for them. Report and leave at once instead.
        try {
            return run_checked(a, mpi);
        } catch (const std::exception& e) {
            fmt::print(stderr, "error: {}\n", e.what());
            std::fflush(stderr);
            std::_Exit(1);
        }
    }
    // Under mpirun a failed rank stops the whole job, so that no peer waits in NCCL for it.
    try {
        return run_checked(a, mpi);
    } catch (const std::exception& e) {
        fmt::print(stderr, "error: rank {}: {}\n", mpi.rank(), e.what());
        std::fflush(stderr);
        mpi.abort(1);
    }
}

int run_checked(const RunArgs& a, const MpiSession& mpi) {
    if (mpi.active()) {
        CPFILL_CHECK(a.device == "cuda", "mpirun starts one process per GPU: add --device cuda");
        CPFILL_CHECK(a.cp == mpi.size(),
                     "--cp {} but mpirun started {} processes (one per GPU rank): expected --cp {}",
                     a.cp, mpi.size(), mpi.size());
    }
    const int given = !a.input_ids.empty() + !a.input_ids_file.empty() + !a.prompt.empty() +
                      !a.prompt_file.empty();
    CPFILL_CHECK(given == 1,
                 "give exactly one of --prompt, --prompt-file, --input-ids or --input-ids-file");
    std::vector<std::vector<int32_t>> requests;
    std::optional<Tokenizer> tok;
    if (!a.prompt.empty() || !a.prompt_file.empty()) {
        tok = load_tokenizer(a.tokenizer, a.model);
        const std::string text = a.prompt.empty() ? read_text_file(a.prompt_file) : a.prompt;
        requests.push_back(encode_prompt(*tok, text, !a.no_bos));
    } else if (!a.input_ids.empty()) {
        requests.push_back(parse_id_list(a.input_ids, "--input-ids"));
    } else {
        requests = read_input_ids_file(a.input_ids_file);
    }
    if (mpi.rank() == 0) check_run_outputs(a, requests);  // rank 0 writes them
    EngineOptions eo;
    eo.threads = a.threads;
    eo.cp = a.cp;
    eo.cuda = a.device == "cuda";
    eo.weights = a.weights;
    eo.gpu.indexer = parse_gpu_indexer(a.indexer);
    eo.gpu.collectives = parse_gpu_collectives(a.collectives);
    eo.residual = parse_residual_dtype(a.residual);
    if (mpi.active()) {
        eo.gpu.local_ranks = {mpi.rank()};
        eo.gpu.devices = {mpi.local_rank()};
        eo.gpu.nccl_id = mpi.broadcast(mpi.rank() == 0 ? GpuGroup::new_nccl_id() : NcclId{});
    }
    PrefillEngine engine(a.model, eo);
    report_fp8_inexact(engine);
    RunOptions opt;
    opt.all_logits = a.all_logits;
    opt.tbo = parse_tbo(a.tbo);
    opt.chunk = a.chunk;
    opt.fail_rank = a.inject_fault_rank;
    opt.keep_kv = !a.kv_out.empty();
    // A warm-up batch first (every rank, as the real one; PrefillEngine::warm_up), so that TTFT
    // does not include the thread pools' start, first-touch page faults or the GPU's first-use
    // costs (GEMM plans, kernels, the arena).
    double warmup_s = 0;
    if (!a.no_warmup) {
        // At most the batch, and at most one --chunk (memory may allow no more).
        int64_t budget = 0;
        for (const auto& r : requests) budget += static_cast<int64_t>(r.size());
        if (a.chunk > 0) budget = std::min(budget, a.chunk);
        warmup_s = engine.warm_up(budget, opt.tbo);
    }
    RunResult r = engine.run(requests, opt);
    // --repeat: the same batch again (every rank), each TTFT kept; outputs come from the first.
    std::vector<double> again;
    for (int i = 1; i < a.repeat; ++i) again.push_back(engine.run(requests, opt).prefill_seconds);
    if (mpi.rank() != 0) return 0;  // rank 0 holds the logits and prints
    check_logits_finite(r, engine.config().vocab_size);
    if (!a.logits_out.empty()) write_logits(a.logits_out, r, a.all_logits);
    if (!a.kv_out.empty()) write_kv_state(a.kv_out, r.out.kv, engine.config());
    if (a.json) {
        print_json(a, engine, r, requests, warmup_s, again);
        return 0;
    }
    for (size_t i = 0; i < requests.size(); ++i) {
        std::string text;
        if (tok && r.first_tokens[i] < tok->vocab_size())
            text = fmt::format(" \"{}\"", tok->decode({r.first_tokens[i]}));
        fmt::print("request {}: {} tokens, first token {}{}\n", i, requests[i].size(),
                   r.first_tokens[i], text);
    }
    fmt::print(
        "load {:.3f} s, warm-up {}, TTFT {:.3f} s, {:.0f} tokens/s ({} tokens, {}{}, CP={}, TBO "
        "{})\n",
        engine.load_seconds(), a.no_warmup ? "off" : fmt::format("{:.3f} s", warmup_s),
        r.prefill_seconds, r.n_tokens / r.prefill_seconds, r.n_tokens,
        a.device == "cuda"
            ? fmt::format("CUDA {}, {} indexer", gpu_weight_format_name(engine.gpu_weight_format()),
                          engine.gpu_weight_stats().indexer_fp8 ? "fp8" : "bf16")
            : std::string("CPU fp32"),
        a.residual == "bf16" ? ", bf16 residual" : "", a.cp, r.out.tbo_used ? "on" : "off");
    if (r.out.chunk > 0) fmt::print("in chunks of {} tokens\n", r.out.chunk);
    if (!again.empty()) fmt::print("TTFT of the repeats: {:.3f} s\n", fmt::join(again, " s, "));
    return 0;
}

}  // namespace

Runner add_run_command(CLI::App& app) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* c = app.add_subcommand("run", "prefill prompts and print the first token");
    c->add_option("--model", args->model, "model folder (config.json + safetensors)")->required();
    c->add_option("--prompt", args->prompt, "prompt text (tokenised with the DeepSeek tokenizer)");
    c->add_option("--prompt-file", args->prompt_file, "a UTF-8 file holding one prompt");
    c->add_option(
        "--tokenizer", args->tokenizer,
        "tokenizer.json (default: the model folder's, then scripts/fetch-tokenizer.sh's)");
    c->add_flag("--no-bos", args->no_bos, "do not prepend <｜begin▁of▁sentence｜> to the prompt");
    c->add_option("--input-ids", args->input_ids, "token ids of one prompt: 1,2,3");
    c->add_option("--input-ids-file", args->input_ids_file,
                  "safetensors with input_ids [S] or [B, S], or text: one request per line");
    c->add_option("--device", args->device,
                  "cpu, or cuda (one GPU per CP rank; under mpirun one process per GPU)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    c->add_option("--weights", args->weights,
                  "cuda: how the GPUs hold the matrices: auto (as stored), bf16, fp8, or fp4 "
                  "(fp8 linears, fp4 experts)")
        ->capture_default_str();
    add_indexer_option(*c, args->indexer);
    add_collectives_option(*c, args->collectives);
    add_residual_option(*c, args->residual);
    c->add_option("--logits-out", args->logits_out,
                  "write logits f32 to this safetensors file ([V] per request, or [S, V])");
    c->add_flag("--all-logits", args->all_logits, "logits of every position, not only the last");
    c->add_option("--threads", args->threads, "CPU threads in all (default: all)");
    c->add_option("--cp", args->cp, "context-parallel ranks (CPU: threads of this process)")
        ->check(CLI::Range(1, 64));
    c->add_option("--tbo", args->tbo, "two-batch overlap: on, off or auto")
        ->check(CLI::IsMember({"on", "off", "auto"}));
    c->add_option("--chunk", args->chunk,
                  "prefill in chunks of this many tokens (0: one pass; on cuda, chunks where one "
                  "pass does not fit)")
        ->check(CLI::NonNegativeNumber);
    c->add_option(
        "--kv-out", args->kv_out,
        "write each request's KV state for a decoder into this folder (docs/kv-state.md)");
    c->add_option("--inject-fault-rank", args->inject_fault_rank,
                  "tests only: this GPU rank fails at layer 1 (checks that its peers stop)")
        ->group("");  // hidden from --help
    c->add_option("--repeat", args->repeat,
                  "run the batch this many times, printing each TTFT (the outputs are the "
                  "first run's)")
        ->check(CLI::Range(1, 1000))
        ->capture_default_str();
    c->add_flag(
        "--no-warmup", args->no_warmup,
        "time the first batch cold (default: a warm-up batch of the batch's first tokens runs "
        "first: 16 on cpu, up to 8192 on cuda)");
    c->add_flag("--json", args->json, "print one JSON object instead of text (docs/cli.md)");
    return [args] { return run(*args); };
}

}  // namespace cpfill::tools
