// cpfill run: prefill of one or more prompts given as token ids; prints each request's first
// (argmax) token, TTFT and tokens/s; optionally writes logits to a safetensors file.
#include <fmt/format.h>

#include "engine/prefill_engine.h"
#include "io/safetensors.h"
#include "tools/commands.h"
#include "tools/input_ids.h"

namespace cpfill::tools {

namespace {

struct RunArgs {
    std::string model;
    std::string input_ids;
    std::string input_ids_file;
    std::string device = "cpu";
    std::string logits_out;
    bool all_logits = false;
    int threads = 0;
    int cp = 1;
    std::string tbo = "auto";
    int64_t chunk = 0;
};

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

int run(const RunArgs& a) {
    CPFILL_CHECK(a.device == "cpu",
                 "--device {}: this build runs on the CPU backend only (expected --device cpu)",
                 a.device);
    CPFILL_CHECK(a.input_ids.empty() != a.input_ids_file.empty(),
                 "give exactly one of --input-ids or --input-ids-file");
    std::vector<std::vector<int32_t>> requests;
    if (!a.input_ids.empty())
        requests.push_back(parse_id_list(a.input_ids, "--input-ids"));
    else
        requests = read_input_ids_file(a.input_ids_file);
    EngineOptions eo;
    eo.threads = a.threads;
    eo.cp = a.cp;
    PrefillEngine engine(a.model, eo);
    RunOptions opt;
    opt.all_logits = a.all_logits;
    opt.tbo = parse_tbo(a.tbo);
    opt.chunk = a.chunk;
    RunResult r = engine.run(requests, opt);
    for (size_t i = 0; i < requests.size(); ++i)
        fmt::print("request {}: {} tokens, first token {}\n", i, requests[i].size(),
                   r.first_tokens[i]);
    fmt::print(
        "load {:.3f} s, TTFT {:.3f} s, {:.0f} tokens/s ({} tokens, CPU fp32, CP={}, TBO {})\n",
        engine.load_seconds(), r.prefill_seconds, r.n_tokens / r.prefill_seconds, r.n_tokens, a.cp,
        r.out.tbo_used ? "on" : "off");
    if (!a.logits_out.empty()) write_logits(a.logits_out, r, a.all_logits);
    return 0;
}

}  // namespace

Runner add_run_command(CLI::App& app) {
    auto args = std::make_shared<RunArgs>();
    CLI::App* c = app.add_subcommand("run", "prefill prompts and print the first token");
    c->add_option("--model", args->model, "model folder (config.json + safetensors)")->required();
    c->add_option("--input-ids", args->input_ids, "token ids of one prompt: 1,2,3");
    c->add_option("--input-ids-file", args->input_ids_file,
                  "safetensors with input_ids [S] or [B, S], or text: one request per line");
    c->add_option("--device", args->device, "cpu (cuda comes with the CUDA backend)");
    c->add_option("--logits-out", args->logits_out,
                  "write logits f32 to this safetensors file ([V] per request, or [S, V])");
    c->add_flag("--all-logits", args->all_logits, "logits of every position, not only the last");
    c->add_option("--threads", args->threads, "CPU threads in all (default: all)");
    c->add_option("--cp", args->cp, "context-parallel ranks (CPU: threads of this process)")
        ->check(CLI::Range(1, 64));
    c->add_option("--tbo", args->tbo, "two-batch overlap: on, off or auto")
        ->check(CLI::IsMember({"on", "off", "auto"}));
    c->add_option("--chunk", args->chunk, "prefill in chunks of this many tokens (0: one pass)")
        ->check(CLI::NonNegativeNumber);
    return [args] { return run(*args); };
}

}  // namespace cpfill::tools
