// `cpfill serve` as a process: it prints the port it bound, /health turns 200 once it is warm,
// and SIGTERM while a batch runs lets that batch finish (its answer equals `cpfill run`'s), answers
// the queued request 503 and exits 0. The batch is held (--test-hold-batches) until the signal,
// so the order of events is fixed without timing; every wait is bounded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "../io/io_test_util.h"
#include "cli_test_util.h"

namespace cpfill {
namespace {

using test::TempDir;

template <typename Pred>
bool eventually(Pred pred) {
    for (int i = 0; i < 30000; ++i) {
        if (pred()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return pred();
}

// `cpfill serve …` with stdout on a pipe and stderr in a file; killed if the test leaves early.
class ServeProcess {
  public:
    ServeProcess(const std::string& args, const std::string& log) {
        int out[2];
        EXPECT_EQ(pipe(out), 0);
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out[1], 1);
            const int err = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(err, 2);
            close(out[0]);
            const std::string cmd = std::string("exec ") + CPFILL_BINARY + " serve " + args;
            execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
            _exit(127);
        }
        close(out[1]);
        out_ = out[0];
    }
    ~ServeProcess() {
        if (pid_ > 0 && !exited_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        close(out_);
    }
    // The port of the "listening on http://HOST:PORT" line (0 if none within 60 s).
    int port() {
        std::string text;
        for (int i = 0; i < 600 && text.find('\n') == std::string::npos; ++i) {
            pollfd p{out_, POLLIN, 0};
            if (poll(&p, 1, 100) <= 0) continue;
            char buf[256];
            const ssize_t n = read(out_, buf, sizeof buf);
            if (n <= 0) break;
            text.append(buf, static_cast<size_t>(n));
        }
        const size_t colon = text.rfind(':');
        if (text.find("listening on http://") != 0 || colon == std::string::npos) {
            ADD_FAILURE() << "no listening line: " << text;
            return 0;
        }
        return std::stoi(text.substr(colon + 1));
    }
    void signal(int sig) { kill(pid_, sig); }
    // The exit status, or -1 when it did not exit within 60 s.
    int wait_exit() {
        int status = 0;
        for (int i = 0; i < 6000; ++i) {
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                exited_ = true;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return -1;
    }

  private:
    pid_t pid_ = -1;
    int out_ = -1;
    bool exited_ = false;
};

// The first character of a metric's value in /metrics ("" when absent or unreachable): the gauges
// these tests read are single digits.
std::string metric_digit(httplib::Client& cli, const std::string& name) {
    auto r = cli.Get("/metrics");
    if (!r) return std::string();
    const size_t at = r->body.find("\n" + name + " ");
    return at == std::string::npos ? std::string() : r->body.substr(at + name.size() + 2, 1);
}

bool healthy(httplib::Client& cli) {
    auto r = cli.Get("/health");
    return r && r->status == 200;
}

TEST(CmdServe, SigtermFinishesTheRunningBatchRefusesTheQueuedAndExits0) {
    TempDir tmp;
    const std::string model = tmp.file("m");
    ASSERT_EQ(test::run_cli("gen-model --preset tiny --seed 4 --out " + model).code, 0);
    const test::CliResult run =
        test::run_cli("run --model " + model + " --input-ids 5,6,7,8 --threads 2 --json");
    ASSERT_EQ(run.code, 0) << run.out;
    const auto expected = nlohmann::json::parse(run.out.substr(run.out.find('{')));

    ServeProcess serve("--model " + model + " --port 0 --threads 2 --test-hold-batches",
                       tmp.file("serve.log"));
    const int port = serve.port();
    ASSERT_GT(port, 0);
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    const auto metric = [&](const std::string& name) { return metric_digit(cli, name); };
    ASSERT_TRUE(eventually([&] { return healthy(cli); }));
    int status_a = 0, status_b = 0;
    nlohmann::json answer_a;
    std::thread a([&] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60, 0);
        auto r = c.Post("/v1/prefill", R"({"input_ids": [5, 6, 7, 8]})", "application/json");
        if (!r) return;
        status_a = r->status;
        answer_a = nlohmann::json::parse(r->body, nullptr, false);
    });
    EXPECT_TRUE(eventually([&] { return metric("cpfill_batch_running") == "1"; }));
    std::thread b([&] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60, 0);
        auto r = c.Post("/v1/prefill", R"({"input_ids": [9, 9]})", "application/json");
        if (r) status_b = r->status;
    });
    EXPECT_TRUE(eventually([&] { return metric("cpfill_queue_length") == "1"; }));
    serve.signal(SIGTERM);
    a.join();
    b.join();
    EXPECT_EQ(serve.wait_exit(), 0);
    EXPECT_EQ(status_a, 200) << answer_a.dump();
    EXPECT_EQ(answer_a["requests"][0]["first_token"], expected["requests"][0]["first_token"]);
    EXPECT_EQ(status_b, 503);
    std::ifstream f(tmp.file("serve.log"));
    const std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(err.find("SIGTERM received"), std::string::npos) << err;
    EXPECT_NE(err.find("4 tokens"), std::string::npos) << err;
    EXPECT_NE(err.find("status 503"), std::string::npos) << err;
}

// --replicas 2 --cp 2: two engines of two CPU ranks, each running its own batches. With batches
// held, two requests form two batches that run side by side (the metric counts both); each answer
// equals `cpfill run`'s for its prompt, whichever replica ran it.
TEST(CmdServe, ReplicasRunBatchesSideBySide) {
    TempDir tmp;
    const std::string model = tmp.file("m");
    ASSERT_EQ(test::run_cli("gen-model --preset tiny --seed 4 --out " + model).code, 0);
    const auto first_token = [&](const std::string& ids) {
        const test::CliResult run = test::run_cli("run --model " + model + " --input-ids " + ids +
                                                  " --cp 2 --threads 2 --json");
        EXPECT_EQ(run.code, 0) << run.out;
        return nlohmann::json::parse(
                   run.out.substr(run.out.find('{')))["requests"][0]["first_token"]
            .get<int>();
    };
    const int expected_a = first_token("5,6,7,8"), expected_b = first_token("9,10,11");
    ServeProcess serve("--model " + model +
                           " --port 0 --threads 2 --cp 2 --replicas 2 --max-batch-tokens 4 "
                           "--test-hold-batches",
                       tmp.file("serve.log"));
    const int port = serve.port();
    ASSERT_GT(port, 0);
    httplib::Client cli("127.0.0.1", port);
    cli.set_read_timeout(60, 0);
    const auto metric = [&](const std::string& name) { return metric_digit(cli, name); };
    ASSERT_TRUE(eventually([&] { return healthy(cli); }));
    EXPECT_EQ(metric("cpfill_replicas"), "2");
    int status[2] = {0, 0}, token[2] = {-1, -1};
    const auto post = [&](int i, const std::string& body) {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60, 0);
        auto r = c.Post("/v1/prefill", body, "application/json");
        if (!r) return;
        status[i] = r->status;
        const auto j = nlohmann::json::parse(r->body, nullptr, false);
        if (r->status == 200) token[i] = j["requests"][0]["first_token"].get<int>();
    };
    std::thread a([&] { post(0, R"({"input_ids": [5, 6, 7, 8]})"); });
    EXPECT_TRUE(eventually([&] { return metric("cpfill_batch_running") == "1"; }));
    std::thread b([&] { post(1, R"({"input_ids": [9, 10, 11]})"); });
    // The second batch is formed by the other replica while the first is held: both run.
    EXPECT_TRUE(eventually([&] { return metric("cpfill_batch_running") == "2"; }));
    EXPECT_EQ(metric("cpfill_queue_length"), "0");
    serve.signal(SIGTERM);  // releases the held batches; both finish
    a.join();
    b.join();
    EXPECT_EQ(serve.wait_exit(), 0);
    EXPECT_EQ(status[0], 200);
    EXPECT_EQ(status[1], 200);
    EXPECT_EQ(token[0], expected_a);
    EXPECT_EQ(token[1], expected_b);
    std::ifstream f(tmp.file("serve.log"));
    const std::string err((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_NE(err.find("2 replicas of CP=2"), std::string::npos) << err;
}

// --replicas outside 1 … 64 is a usage error naming the option, before anything listens.
TEST(CmdServe, ReplicasOutOfRangeIsRefused) {
    for (const char* n : {"0", "65"}) {
        const test::CliResult r =
            test::run_cli(std::string("serve --model /nonexistent --port 0 --replicas ") + n);
        EXPECT_NE(r.code, 0) << r.out;
        EXPECT_NE(r.out.find("--replicas"), std::string::npos) << r.out;
        EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
    }
}

// Under mpirun every process would start a server of its own on one GPU: serve refuses, naming
// the one-process way to use several GPUs, before it binds a port or loads anything.
TEST(CmdServe, UnderMpirunIsRefusedNamingCp) {
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    const test::CliResult r = test::run_cli("serve --model /nonexistent --port 0");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("error: serve runs as one process: started by mpirun with 2 processes"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("--cp N"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace cpfill
