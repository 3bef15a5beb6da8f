// load_bench: how fast a checkpoint becomes every CP rank's fp32 weights (load_rank_weights, as
// the engine does it), over a grid of reader threads × cp sizes. Each run opens the checkpoint
// afresh; with --cold the files' pages are first dropped from the page cache (posix_fadvise
// DONTNEED, no root needed) so the run reads the disk. Reports the share of the files cached
// before the run, seconds, and GB/s of stored bytes read and of fp32 bytes produced.
//   load_bench --model DIR [--threads 1,2] [--cp 1,2] [--repeat 2] [--cold]
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "io/checkpoint.h"
#include "model/weights.h"

namespace {

std::vector<std::string> safetensors_files(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        if (e.path().extension() == ".safetensors") out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

// Fraction of the files' pages in the page cache (mincore on a fresh mapping).
double cached_fraction(const std::vector<std::string>& files) {
    size_t pages = 0, resident = 0;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    for (const std::string& f : files) {
        const int fd = ::open(f.c_str(), O_RDONLY);
        if (fd < 0) continue;
        struct stat st {};
        ::fstat(fd, &st);
        const size_t size = static_cast<size_t>(st.st_size);
        void* p = size ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        if (p != MAP_FAILED) {
            std::vector<unsigned char> v((size + page - 1) / page);
            if (::mincore(p, size, v.data()) == 0)
                for (unsigned char c : v) resident += c & 1;
            pages += v.size();
            ::munmap(p, size);
        }
        ::close(fd);
    }
    return pages ? static_cast<double>(resident) / pages : 0.0;
}

void drop_from_page_cache(const std::vector<std::string>& files) {
    for (const std::string& f : files) {
        const int fd = ::open(f.c_str(), O_RDONLY);
        if (fd < 0) continue;
        ::fdatasync(fd);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"load_bench: checkpoint load throughput (load_rank_weights)"};
    std::string model;
    std::vector<int> threads{1, 2}, cps{1, 2};
    int repeat = 2;
    bool cold = false;
    app.add_option("--model", model, "checkpoint folder")->required();
    app.add_option("--threads", threads, "reader thread counts")->delimiter(',');
    app.add_option("--cp", cps, "CP sizes")->delimiter(',');
    app.add_option("--repeat", repeat, "runs per point (the best is reported)");
    app.add_flag("--cold", cold, "drop the files from the page cache before each run");
    CLI11_PARSE(app, argc, argv);
    try {
        const std::vector<std::string> files = safetensors_files(model);
        fmt::print("{:>7} {:>3} {:>7} {:>9} {:>8} {:>8} {:>9} {:>9}\n", "threads", "cp", "cached",
                   "stored GB", "f32 GB", "seconds", "stored/s", "f32/s");
        for (int cp : cps)
            for (int t : threads) {
                double best = 1e30, cached = 0;
                cpfill::LoadStats stats;
                for (int i = 0; i < repeat; ++i) {
                    if (cold) drop_from_page_cache(files);
                    const double c = cached_fraction(files);
                    const auto t0 = std::chrono::steady_clock::now();
                    cpfill::Checkpoint ck(model);
                    const auto ranks = cpfill::load_rank_weights(ck, cp, {t, true}, &stats);
                    const double s =
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                            .count();
                    if (s < best) best = s, cached = c;
                }
                const double gs = stats.stored_bytes * 1e-9, gf = stats.f32_bytes * 1e-9;
                fmt::print(
                    "{:>7} {:>3} {:>6.0f}% {:>9.2f} {:>8.2f} {:>8.2f} {:>7.2f} GB {:>7.2f} GB\n", t,
                    cp, 100 * cached, gs, gf, best, gs / best, gf / best);
                std::fflush(stdout);
            }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
