// The cpfill subcommands. Each registers its options on the CLI11 app and runs when chosen.
// tools/ is the only place that reads argv and the environment.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace cpfill::tools {

// Registers a subcommand; the returned function runs it (returns the exit code).
using Runner = std::function<int()>;
Runner add_run_command(CLI::App& app);
Runner add_gen_model_command(CLI::App& app);
Runner add_inspect_command(CLI::App& app);
Runner add_demo_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_serve_command(CLI::App& app);
Runner add_bench_serve_command(CLI::App& app);

}  // namespace cpfill::tools
