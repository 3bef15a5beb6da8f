// The command line's shared rules and error lines (tools/cli_options.h).
#include "tools/cli_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "core/error.h"

namespace cpfill::tools {

namespace {

// Edit distance counting insertions, deletions, substitutions and swaps of neighbours as one each
// (optimal string alignment), over bytes: "rnu" is 1 from "run".
size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
        for (size_t j = 1; j <= b.size(); ++j) {
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                                d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    return d[a.size()][b.size()];
}

// The visible long options of `app`, spelt "--name" (hidden options have an empty group).
std::vector<std::string> visible_options(const CLI::App& app) {
    std::vector<std::string> names;
    for (const CLI::Option* o : app.get_options()) {
        if (o->get_group().empty()) continue;
        for (const auto& l : o->get_lnames()) names.push_back("--" + l);
    }
    return names;
}

// The subcommand given on the command line, or nullptr.
const CLI::App* parsed_subcommand(const CLI::App& app) {
    for (const CLI::App* s : app.get_subcommands([](const CLI::App* c) { return c->parsed(); }))
        return s;
    return nullptr;
}

// "did you mean …" for the first unexpected argument close to a known name, or "".
std::string suggestion(const CLI::App& app) {
    const CLI::App* sub = parsed_subcommand(app);
    std::vector<std::string> extras = app.remaining(true);
    for (std::string arg : extras) {
        if (arg.rfind("--", 0) == 0) {
            arg = arg.substr(0, arg.find('='));
            const std::string near = nearest_name(arg, visible_options(sub ? *sub : app));
            if (!near.empty()) return fmt::format("unknown option {}: did you mean {}?", arg, near);
        } else if (!sub && !arg.empty() && arg[0] != '-') {
            std::vector<std::string> names;
            for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
                names.push_back(s->get_name());
            const std::string near = nearest_name(arg, names);
            if (!near.empty())
                return fmt::format("unknown subcommand {}: did you mean {}?", arg, near);
        }
    }
    return {};
}

}  // namespace

int max_threads() { return 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

void apply_shared_option_rules(CLI::App& app) {
    const int max = max_threads();
    CLI::Validator threads(
        [max](std::string& value) -> std::string {
            long n = 0;
            if (!CLI::detail::lexical_cast(value, n) || n < 0 || n > max)
                return fmt::format(
                    "expected 0 (all hardware threads) to {} (4 x the {} hardware threads), "
                    "found {}",
                    max, max / 4, value);
            return {};
        },
        fmt::format("0..{}", max));
    for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
        if (CLI::Option* o = sub->get_option_no_throw("--threads")) o->check(threads);
}

std::string nearest_name(const std::string& word, const std::vector<std::string>& candidates) {
    std::string best;
    size_t best_d = 0;
    for (const auto& c : candidates) {
        const size_t d = edit_distance(word, c);
        if (best.empty() || d < best_d) best = c, best_d = d;
    }
    const size_t allowed = std::max<size_t>(1, word.size() / 3);
    return !best.empty() && best_d <= allowed ? best : std::string{};
}

std::string usage_error_line(const CLI::App& app, const CLI::ParseError& e) {
    const std::string hint = suggestion(app);
    const CLI::App* sub = parsed_subcommand(app);
    const std::string help = sub ? "cpfill " + sub->get_name() + " --help" : "cpfill --help";
    return fmt::format("error: {} (usage: {})", hint.empty() ? std::string(e.what()) : hint, help);
}

bool debug_enabled() {
    const char* v = std::getenv("CPFILL_DEBUG");
    return v && *v && std::string(v) != "0";
}

std::string error_line(const std::exception& e) {
    std::string line = fmt::format("error: {}", e.what());
    if (const auto* ce = dynamic_cast<const Error*>(&e); ce && debug_enabled())
        if (!ce->location().empty()) line += fmt::format(" [{}]", ce->location());
    return line;
}

void add_indexer_option(CLI::App& c, std::string& value) {
    c.add_option("--indexer", value,
                 "cuda: how the GPUs score the indexer: auto (fp8 with fp8 or fp4 weights on "
                 "Hopper, else bf16), bf16 or fp8")
        ->check(CLI::IsMember({"auto", "bf16", "fp8"}))
        ->capture_default_str();
}

void add_collectives_option(CLI::App& c, std::string& value) {
    c.add_option("--collectives", value,
                 "cuda: how the GPU ranks exchange rows: nccl, or ce (peer copies by the GPUs' "
                 "copy engines, no SMs; every rank in this process, not under mpirun)")
        ->check(CLI::IsMember({"nccl", "ce"}))
        ->each([](const std::string& v) {
            // Before CUDA starts (parsing comes first): room for every stream a rank keeps, so
            // that a stream waiting on a peer's flag never shares a hardware queue with work
            // that peer's flag needs; and every kernel loaded at start-up, since a kernel's
            // first launch under lazy loading waits for the device, where a stream may wait for
            // a peer held up behind that launch (docs/parallel.md). Values the user set stay.
            if (v == "ce") {
                setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
                setenv("CUDA_MODULE_LOADING", "EAGER", 0);
            }
        })
        ->capture_default_str();
}

void add_residual_option(CLI::App& c, std::string& value) {
    c.add_option("--residual", value,
                 "how the mHC residual streams are kept between sites: fp32, or bf16 as the "
                 "release's reference inference keeps them (on GPUs half the bytes; "
                 "docs/numerics.md)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
}

// "a,b,c" → items; an empty item is an error naming the option.
std::vector<std::string> split_list(const std::string& text, const char* option) {
    std::vector<std::string> items;
    size_t start = 0;
    while (true) {
        const size_t end = text.find(',', start);
        std::string item = text.substr(start, end == std::string::npos ? end : end - start);
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        CPFILL_CHECK(!item.empty(), "{} \"{}\": empty item in the comma-separated list", option,
                     text);
        items.push_back(item);
        if (end == std::string::npos) return items;
        start = end + 1;
    }
}

// A positive integer with an optional suffix k (×1024) or M (×1024²).
int64_t parse_count(const std::string& item, const char* option) {
    int64_t scale = 1;
    std::string digits = item;
    const char last = item.back();
    if (last == 'k' || last == 'K') scale = 1024, digits.pop_back();
    if (last == 'm' || last == 'M') scale = 1024 * 1024, digits.pop_back();
    const bool ok =
        !digits.empty() && digits.size() <= 12 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    CPFILL_CHECK(ok,
                 "{}: \"{}\" is not a count (expected an integer, optionally with k = 1024 or "
                 "M = 1048576, e.g. 8k)",
                 option, item);
    const int64_t v = std::stoll(digits) * scale;
    CPFILL_CHECK(v >= 1, "{}: {} must be at least 1", option, item);
    return v;
}

}  // namespace cpfill::tools
