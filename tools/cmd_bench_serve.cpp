// cpfill bench-serve: a load generator for `cpfill serve` (docs/serve.md "Benchmark").
#include "tools/commands.h"

namespace cpfill::tools {

Runner add_bench_serve_command(CLI::App& app) {
    app.add_subcommand("bench-serve", "load generator for cpfill serve (docs/serve.md)");
    return [] { return 2; };
}

}  // namespace cpfill::tools
