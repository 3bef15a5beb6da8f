// cpfill serve: the resident prefill server (docs/serve.md). Listens first (GET /health answers
// 503 while the model loads), loads the model once, runs a warm-up batch, then serves batches of
// requests through PrefillEngine until SIGTERM or SIGINT, which it answers with a graceful stop.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "engine/prefill_engine.h"
#include "io/model_config.h"
#include "runtime/device.h"
#include "serve/server.h"
#include "tools/cli_options.h"
#include "tools/commands.h"
#include "tools/mpi_session.h"
#include "tools/prompt.h"

namespace cpfill::tools {

namespace {

namespace fs = std::filesystem;

struct ServeArgs {
    std::string model;
    std::string device = "cpu";
    std::string weights = "auto";
    std::string indexer = "auto";
    std::string collectives = "nccl";
    std::string residual = "fp32";
    int cp = 1;
    int replicas = 1;  // model replicas, each of `cp` ranks, each running its own batches
    std::string tbo = "auto";
    int threads = 0;
    std::string host = "127.0.0.1";
    int port = 8000;
    int64_t max_batch_tokens = 8192;
    int64_t max_queue = 64;
    int64_t max_prompt_tokens = 0;
    std::string tokenizer;
    bool no_bos = false;
    bool hold_batches = false;  // tests: batches wait for the shutdown before they run
};

TboMode parse_tbo(const std::string& s) {
    return s == "on" ? TboMode::On : s == "off" ? TboMode::Off : TboMode::Auto;
}

// The tokenizer when one is found and fits the model's vocabulary (tiny models have 512 ids);
// without one, text prompts are refused. An explicit --tokenizer that cannot be used is an error.
std::optional<Tokenizer> serve_tokenizer(const ServeArgs& a, const ModelConfig& cfg) {
    std::optional<Tokenizer> tok;
    try {
        tok = load_tokenizer(a.tokenizer, a.model);
    } catch (const std::exception& e) {
        if (!a.tokenizer.empty()) throw;
        fmt::print(stderr, "serve: no tokenizer ({}); text prompts are refused\n", e.what());
        return std::nullopt;
    }
    if (tok->vocab_size() > cfg.vocab_size) {
        CPFILL_CHECK(a.tokenizer.empty(),
                     "--tokenizer {}: has {} ids but the model's vocabulary {}: expected a "
                     "tokenizer of this model",
                     a.tokenizer, tok->vocab_size(), cfg.vocab_size);
        fmt::print(stderr,
                   "serve: the tokenizer's {} ids do not fit the model's vocabulary of {}; text "
                   "prompts are refused\n",
                   tok->vocab_size(), cfg.vocab_size);
        return std::nullopt;
    }
    return tok;
}

// SIGTERM and SIGINT: the handler writes the signal's number into a pipe (all it may do: some
// threads, such as OpenBLAS's, exist before main and cannot be kept from receiving it), and a
// thread reading the pipe stops the server. Closing the pipe's write end ends that thread.
int g_signal_pipe = -1;

extern "C" void on_stop_signal(int sig) {
    const unsigned char c = static_cast<unsigned char>(sig);
    if (g_signal_pipe >= 0) {
        [[maybe_unused]] const ssize_t n = write(g_signal_pipe, &c, 1);
    }
}

class SignalThread {
  public:
    explicit SignalThread(serve::PrefillServer& server) {
        int fds[2];
        CPFILL_CHECK(pipe(fds) == 0, "cannot create a pipe for the signal handler");
        read_fd_ = fds[0];
        g_signal_pipe = write_fd_ = fds[1];
        struct sigaction sa {};
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, nullptr);
        sigaction(SIGINT, &sa, nullptr);
        thread_ = std::thread([this, &server] {
            unsigned char sig = 0;
            ssize_t n;
            while ((n = read(read_fd_, &sig, 1)) < 0 && errno == EINTR) {
            }
            if (n != 1 || sig == 0) return;  // closed: the server ended on its own
            fmt::print(stderr,
                       "serve: {} received: finishing the running batch, refusing the queued "
                       "requests\n",
                       sig == SIGTERM ? "SIGTERM" : "SIGINT");
            server.stop();
        });
    }
    ~SignalThread() {
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        const unsigned char zero = 0;
        [[maybe_unused]] auto n = write(write_fd_, &zero, 1);
        thread_.join();
        g_signal_pipe = -1;
        close(write_fd_);
        close(read_fd_);
    }

  private:
    int read_fd_ = -1, write_fd_ = -1;
    std::thread thread_;
};

serve::ServerOptions server_options(const ServeArgs& a, const ModelConfig& cfg,
                                    const std::optional<Tokenizer>& tok) {
    serve::ServerOptions o;
    o.model_dir = a.model;
    o.model_id = fs::path(a.model).lexically_normal().filename().string();
    if (o.model_id.empty()) o.model_id = fs::absolute(a.model).parent_path().filename().string();
    o.cfg = cfg;
    o.limits.vocab_size = cfg.vocab_size;
    o.limits.max_prompt_tokens =
        a.max_prompt_tokens > 0 ? a.max_prompt_tokens : cfg.max_position_embeddings;
    o.scheduler.max_batch_tokens = a.max_batch_tokens;
    o.scheduler.max_queue = static_cast<size_t>(a.max_queue);
    o.scheduler.chunk_long = true;  // both backends chunk (docs/parallel.md)
    o.scheduler.tbo = parse_tbo(a.tbo);
    o.scheduler.hold_batches = a.hold_batches;
    if (tok) {
        const bool bos = !a.no_bos;
        o.tokenize = [tok, bos](const std::string& text) { return encode_prompt(*tok, text, bos); };
        o.detokenize = [tok](int32_t id) {
            try {
                return tok->decode({id});
            } catch (const std::exception&) {
                return std::string();  // an unused id has no text
            }
        };
    }
    return o;
}

// Batches through the whole model (PrefillEngine::warm_up: on GPUs up to 8192 tokens, at most the
// batch budget, then quarters of it down to 16), so that the first request of any size does not
// pay for the thread pools' start, first-touch page faults or the GPU's first-use costs.
double warm_up(PrefillEngine& engine, const serve::ServerOptions& o) {
    return engine.warm_up(o.scheduler.max_batch_tokens, o.scheduler.tbo, true);
}

int serve_main(const ServeArgs& a) {
    // One server process drives every GPU (a thread per CP rank); rank 0 of an mpirun job would
    // have to hand each batch to the other processes, which serve does not do (docs/serve.md).
    CPFILL_CHECK(mpirun_processes() < 2,
                 "serve runs as one process: started by mpirun with {} processes; for several "
                 "GPUs start one server with --device cuda --cp N (a thread per GPU)",
                 mpirun_processes());
    CPFILL_CHECK(a.device == "cpu" || a.device == "cuda", "--device {}: expected cpu or cuda",
                 a.device);
    if (a.device == "cuda") require_cuda_device();
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-answer is an error of that write only
    const bool cuda = a.device == "cuda";
    if (cuda) {
        std::string why;
        const int gpus = cuda_device_count(&why);
        CPFILL_CHECK(a.replicas * a.cp <= gpus,
                     "--replicas {} of --cp {} need {} GPUs (a GPU per rank), {} visible: expected "
                     "--replicas × --cp <= {}",
                     a.replicas, a.cp, a.replicas * a.cp, gpus, gpus);
    }
    const ModelConfig cfg = load_model_config((fs::path(a.model) / "config.json").string());
    const std::optional<Tokenizer> tok = serve_tokenizer(a, cfg);
    const serve::ServerOptions opts = server_options(a, cfg, tok);
    serve::PrefillServer server(opts);
    SignalThread signals(server);
    const int port = server.start(a.host, a.port);
    fmt::print("listening on http://{}:{}\n", a.host, port);
    std::fflush(stdout);
    // Replica r of --cp C runs on GPUs rC … rC + C − 1; on the CPU the threads are shared out.
    EngineOptions common;
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    common.threads =
        a.replicas == 1 ? a.threads : std::max(1, (a.threads > 0 ? a.threads : hw) / a.replicas);
    common.cp = a.cp;
    common.cuda = cuda;
    common.weights = a.weights;
    common.gpu.indexer = parse_gpu_indexer(a.indexer);
    common.gpu.collectives = parse_gpu_collectives(a.collectives);
    common.residual = parse_residual_dtype(a.residual);
    std::vector<std::unique_ptr<PrefillEngine>> engines;
    double load = 0, warmup = 0;
    for (int r = 0; r < a.replicas; ++r) {
        EngineOptions eo = common;
        if (cuda)
            for (int k = 0; k < a.cp; ++k) eo.gpu.devices.push_back(r * a.cp + k);
        engines.push_back(std::make_unique<PrefillEngine>(a.model, eo));
        load += engines.back()->load_seconds();
        warmup += warm_up(*engines.back(), opts);
    }
    const PrefillEngine& first = *engines.front();
    fmt::print(stderr, "serve: ready: load {:.3f} s, warm-up {:.3f} s ({}, {}CP={})\n", load,
               warmup,
               cuda ? fmt::format("CUDA {}", gpu_weight_format_name(first.gpu_weight_format()))
                    : std::string("CPU fp32"),
               a.replicas > 1 ? fmt::format("{} replicas of ", a.replicas) : std::string(), a.cp);
    serve::ReadyModel ready;
    for (auto& e : engines)
        ready.runners.push_back(
            [e = e.get()](const std::vector<std::vector<int32_t>>& prompts, const RunOptions& ro) {
                return e->run(prompts, ro);
            });
    ready.load_seconds = load;
    ready.warmup_seconds = warmup;
    if (cuda)
        ready.gpu_bytes_in_use = [gpus = a.replicas * a.cp] {
            std::vector<size_t> used;
            for (int d = 0; d < gpus; ++d) {
                const CudaDeviceInfo info = cuda_device_info(d);
                used.push_back(info.total_bytes - info.free_bytes);
            }
            return used;
        };
    server.set_ready(std::move(ready));
    server.wait();  // until a signal stops it and every request is answered
    fmt::print(stderr, "serve: stopped\n");
    return 0;
}

}  // namespace

Runner add_serve_command(CLI::App& app) {
    auto a = std::make_shared<ServeArgs>();
    CLI::App* c = app.add_subcommand("serve", "the resident prefill server (docs/serve.md)");
    c->add_option("--model", a->model, "model folder (config.json + safetensors)")->required();
    c->add_option("--weights", a->weights,
                  "cuda: how the GPUs hold the matrices: auto (as stored), bf16, fp8 or fp4")
        ->capture_default_str();
    add_indexer_option(*c, a->indexer);
    add_collectives_option(*c, a->collectives);
    add_residual_option(*c, a->residual);
    c->add_option("--device", a->device, "cpu, or cuda (one GPU per CP rank)")
        ->check(CLI::IsMember({"cpu", "cuda"}));
    c->add_option("--cp", a->cp, "context-parallel ranks")->check(CLI::Range(1, 64));
    c->add_option("--replicas", a->replicas,
                  "model replicas of --cp ranks each, running batches side by side (on GPUs: "
                  "replica r on GPUs r·cp … r·cp + cp − 1; docs/serve.md)")
        ->check(CLI::Range(1, 64));
    c->add_option("--tbo", a->tbo, "two-batch overlap: on, off or auto")
        ->check(CLI::IsMember({"on", "off", "auto"}));
    c->add_option("--threads", a->threads, "CPU threads in all (default: all)");
    c->add_option("--host", a->host, "address to listen on (default 127.0.0.1)");
    c->add_option("--port", a->port, "port (0: an ephemeral one, printed)")
        ->check(CLI::Range(0, 65535));
    c->add_option("--max-batch-tokens", a->max_batch_tokens,
                  "tokens per batch (default 8192); longer prompts run alone, in chunks of it")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
    c->add_option("--max-queue", a->max_queue, "waiting requests before 503 (default 64)")
        ->check(CLI::Range(int64_t{1}, int64_t{4096}));
    c->add_option("--max-prompt-tokens", a->max_prompt_tokens,
                  "longest prompt accepted (default: the model's max_position_embeddings)")
        ->check(CLI::NonNegativeNumber);
    c->add_option("--tokenizer", a->tokenizer,
                  "tokenizer.json (default: the model folder's, then the fetched copy)");
    c->add_flag("--no-bos", a->no_bos, "do not prepend <｜begin▁of▁sentence｜> to text prompts");
    c->add_flag("--test-hold-batches", a->hold_batches,
                "tests only: every batch waits for SIGTERM before it runs")
        ->group("");
    return [a] { return serve_main(*a); };
}

}  // namespace cpfill::tools
