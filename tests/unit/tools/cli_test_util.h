// Runs the built `cpfill` binary with arguments and captures what it prints, for the tests of the
// command line.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace cpfill::test {

struct CliResult {
    int code = -1;
    std::string out;  // stdout and stderr together
};

// `cpfill <args>`; code is the exit status (128 + signal when killed).
inline CliResult run_cli(const std::string& args) {
    const std::string cmd = std::string(CPFILL_BINARY) + " " + args + " 2>&1";
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
    const int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
}

}  // namespace cpfill::test
