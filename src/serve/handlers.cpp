// POST /v1/prefill and POST /v1/completions: parse and validate, queue, wait for the batch,
// answer; every failure is one JSON error with its status, and one log line per request.
#include <fmt/format.h>
#include <httplib.h>

#include <chrono>
#include <ctime>
#include <optional>

#include "engine/kv_export.h"
#include "serve/connection.h"
#include "serve/http_error.h"
#include "serve/kv_bytes.h"
#include "serve/server.h"

namespace cpfill::serve {

namespace {

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

void reply(httplib::Response& res, int status, const nlohmann::json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json");
}

void reply_error(httplib::Response& res, const HttpError& e) {
    res.status = e.status();
    if (e.status() == 503) res.set_header("Retry-After", "1");
    res.set_content(error_body(e.what(), e.type(), e.status()), "application/json");
}

int64_t count_tokens(const std::vector<std::vector<int32_t>>& prompts) {
    int64_t n = 0;
    for (const auto& p : prompts) n += static_cast<int64_t>(p.size());
    return n;
}

}  // namespace

JobSpec PrefillServer::job_spec(const httplib::Request& req,
                                std::vector<std::vector<int32_t>> prompts, bool all_logits,
                                bool keep_kv) {
    JobSpec s;
    s.prompts = std::move(prompts);
    s.all_logits = all_logits;
    s.keep_kv = keep_kv;
    // The socket is looked up once; the handler's thread keeps it open until it answers.
    const int fd = find_connection_fd(req.remote_addr, req.remote_port, req.local_port);
    s.client_gone = [fd] { return peer_closed(fd); };
    return s;
}

void PrefillServer::log_request(const std::string& endpoint, uint64_t id, int status,
                                int64_t tokens, const JobResult* r, double total_s) {
    const bool ran = r && r->status != 499 && r->status != 503;
    metrics_.record_request(endpoint, status, tokens, r ? r->queue_seconds : 0, total_s, ran);
    if (!opt_.log_requests) return;
    fmt::print(stderr, "request {} {}: {} tokens, queue {:.1f} ms, TTFT {:.1f} ms, status {}\n", id,
               endpoint, tokens, r ? r->queue_seconds * 1e3 : 0.0,
               status == 200 ? total_s * 1e3 : 0.0, status);
}

// One request: its id, the body (which sets the prompt tokens and the batch's result as it gets
// them), HttpError or any other failure as the JSON error reply, and the log line.
void PrefillServer::serve_request(const char* endpoint, httplib::Response& res,
                                  const RequestBody& body) {
    const Clock::time_point t0 = Clock::now();
    const uint64_t id = next_id_++;
    int status = 200;
    int64_t tokens = 0;
    std::optional<JobResult> job;
    try {
        body(id, t0, tokens, job);
    } catch (const HttpError& e) {
        status = e.status();
        reply_error(res, e);
    } catch (const std::exception& e) {
        status = 500;
        reply_error(res, HttpError(500, "server_error", e.what()));
    }
    log_request(endpoint, id, status, tokens, job ? &*job : nullptr, seconds_since(t0));
}

void PrefillServer::handle_prefill(const httplib::Request& req, httplib::Response& res) {
    serve_request(
        "prefill", res,
        [&](uint64_t, Clock::time_point t0, int64_t& tokens, std::optional<JobResult>& job) {
            std::shared_ptr<Scheduler> sched = scheduler_or_503();
            const PrefillRequest pr = parse_prefill_request(req.body, opt_.limits, opt_.tokenize);
            tokens = count_tokens(pr.prompts);
            if (!pr.kv_out.empty()) check_kv_out(pr.kv_out, opt_.model_dir);
            const bool keep_kv = !pr.kv_out.empty() || pr.return_kv;
            job = sched->submit(job_spec(req, pr.prompts, false, keep_kv)).get();
            if (job->status != 200)
                throw HttpError(job->status, job->error_type, job->error_message);
            std::vector<std::string> kv_files;
            std::optional<KvTempDir> tmp;
            try {
                if (!pr.kv_out.empty()) write_kv_state(pr.kv_out, job->kv, opt_.cfg);
                if (pr.return_kv) {
                    tmp.emplace(job->kv, opt_.cfg);
                    kv_files = tmp->files();
                }
            } catch (const std::exception& e) {
                throw HttpError(500, "server_error",
                                fmt::format("writing the KV state failed: {}", e.what()));
            }
            Timings t{job->queue_seconds * 1e3, job->prefill_seconds * 1e3,
                      seconds_since(t0) * 1e3};
            reply(res, 200, prefill_response(pr, *job, opt_.detokenize, t, kv_files));
        });
}

void PrefillServer::handle_completions(const httplib::Request& req, httplib::Response& res) {
    serve_request(
        "completions", res,
        [&](uint64_t id, Clock::time_point, int64_t& tokens, std::optional<JobResult>& job) {
            std::shared_ptr<Scheduler> sched = scheduler_or_503();
            const CompletionRequest cr =
                parse_completion_request(req.body, opt_.limits, opt_.tokenize);
            tokens = count_tokens(cr.prompts);
            job = sched->submit(job_spec(req, cr.prompts, cr.all_logits(), false)).get();
            if (job->status != 200)
                throw HttpError(job->status, job->error_type, job->error_message);
            reply(res, 200,
                  completion_response(cr, *job, opt_.detokenize, opt_.model_id,
                                      fmt::format("cmpl-{}", id), int64_t(std::time(nullptr))));
        });
}

}  // namespace cpfill::serve
