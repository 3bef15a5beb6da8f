// Rules shared by every subcommand of the command line, and how main() reports what goes wrong:
// the --threads range, usage errors with the nearest option or subcommand for a misspelt one, and
// error lines without source locations unless CPFILL_DEBUG is set (docs/cli.md).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace cpfill::tools {

// The most --threads accepts: 4 × the hardware threads (at least 4). 0 means all hardware threads.
int max_threads();

// Adds the shared checks to the registered subcommands: every --threads option takes 0 (all) to
// max_threads(). Call once after all subcommands are added.
void apply_shared_option_rules(CLI::App& app);

// The candidate nearest to `word` by edit distance, or "" when none is close enough to be a likely
// misspelling (distance at most a third of the word's length, and at least 1 allowed).
std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates);

// The usage error line for a failed parse (without the trailing newline): "error: " + CLI11's
// message, with "did you mean …?" for an unknown subcommand or option that is close to a known one.
std::string usage_error_line(const CLI::App& app, const CLI::ParseError& e);

// True when CPFILL_DEBUG is set to anything but "" or "0": error lines then end in the source
// location that threw.
bool debug_enabled();

// The "error: …" line (without the trailing newline) for an exception that reached main().
std::string error_line(const std::exception& e);

// --indexer on a subcommand that runs on GPUs (run, serve, bench): auto, bf16 or fp8, parsed by
// parse_gpu_indexer (model/weight_bytes.h).
void add_indexer_option(CLI::App& c, std::string& value);
// --collectives nccl|ce (GpuCollectives; docs/cli.md).
void add_collectives_option(CLI::App& c, std::string& value);

// --residual on run, serve and bench: fp32 or bf16, parsed by parse_residual_dtype
// (parallel/cp_prefill.h).
void add_residual_option(CLI::App& c, std::string& value);

// "a,b,c" → items (spaces around an item dropped); an empty item is an error naming the option.
std::vector<std::string> split_list(const std::string& text, const char* option);
// A positive integer with an optional suffix k (×1024) or M (×1024²): "8k" → 8192.
int64_t parse_count(const std::string& item, const char* option);

}  // namespace cpfill::tools
