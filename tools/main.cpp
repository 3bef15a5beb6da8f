// cpfill: command-line entry point. Parses the subcommand, runs it, and turns any error into one
// "error: ..." line on stderr and a non-zero exit code (docs/design.md §1; exit codes in
// docs/cli.md).
#include <cstdio>
#include <exception>
#include <map>

#include "tools/cli_options.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
    using namespace cpfill::tools;
    CLI::App app{"cpfill: context-parallel prefill for DeepSeek-V4 models"};
    app.require_subcommand(1);
    std::map<CLI::App*, Runner> runners;
    for (auto add : {add_run_command, add_gen_model_command, add_inspect_command, add_demo_command,
                     add_bench_command, add_serve_command, add_bench_serve_command}) {
        Runner r = add(app);
        runners[app.get_subcommands({}).back()] = r;
    }
    apply_shared_option_rules(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (e.get_exit_code() == 0) return app.exit(e);  // --help: the usage on stdout
        // docs/cli.md: 2 = command-line usage error, one "error:" line naming the nearest option
        std::fprintf(stderr, "%s\n", usage_error_line(app, e).c_str());
        return 2;
    }
    try {
        for (auto& [cmd, run] : runners)
            if (cmd->parsed()) return run();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "%s\n", error_line(e).c_str());
        return 1;
    }
    return 2;
}
