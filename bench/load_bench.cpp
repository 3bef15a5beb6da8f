// load_bench: how fast a checkpoint becomes every CP rank's fp32 weights (load_rank_weights, as
// the engine does it), over a grid of reader threads × cp sizes. Each run opens the checkpoint
// afresh; with --cold the files' pages are first dropped from the page cache (posix_fadvise
// DONTNEED, no root needed) so the run reads the disk. Reports the share of the files cached
// before the run, best and median wall seconds, the CPU seconds of the best run, GB/s of stored
// bytes read and of fp32 bytes produced (from the best run), and the time merely to allocate and
// first-touch as many fp32 bytes on as many threads ("touch s", the floor on this machine).
// --reuse-memory keeps freed memory in the process, so that later runs show the load without the
// kernel's first-touch cost.
//   load_bench --model DIR [--threads 1,2] [--cp 1,2] [--repeat 2] [--cold | --reuse-memory]
#include <fcntl.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "core/parallel.h"
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

double cpu_seconds() {
    rusage u{};
    ::getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The floor a load cannot beat: allocating `bytes` in 32 MiB buffers (huge pages advised, as the
// loader does) and writing them once, on `threads` threads. On a VM whose memory is backed
// lazily this first touch is far slower than memset bandwidth.
double touch_seconds(size_t bytes, int threads) {
    constexpr size_t kChunk = size_t{32} << 20;
    std::vector<std::unique_ptr<char[]>> bufs(bytes / kChunk + 1);
    const auto t0 = std::chrono::steady_clock::now();
    cpfill::ThreadPool pool(threads);
    pool.parallel_for(static_cast<int64_t>(bufs.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            bufs[i].reset(new char[kChunk]);
            const auto p = reinterpret_cast<uintptr_t>(bufs[i].get());
            const uintptr_t h = uintptr_t{2} << 20, lo = (p + h - 1) & ~(h - 1);
            ::madvise(reinterpret_cast<void*>(lo), (p + kChunk - lo) & ~(h - 1), MADV_HUGEPAGE);
            std::memset(bufs[i].get(), 1, kChunk);
        }
    });
    return seconds_since(t0);
}

struct Point {
    std::vector<double> wall, cpu;
    double cached = 0;  // of the fastest run
    cpfill::LoadStats stats;
};

Point measure(const std::string& model, const std::vector<std::string>& files, int cp, int threads,
              int repeat, bool cold) {
    Point p;
    double best = 1e30;
    for (int i = 0; i < repeat; ++i) {
        if (cold) drop_from_page_cache(files);
        const double cached = cached_fraction(files);
        const double c0 = cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        {
            cpfill::Checkpoint ck(model);
            const auto ranks = cpfill::load_rank_weights(ck, cp, {threads, true}, &p.stats);
            p.wall.push_back(seconds_since(t0));  // freeing the weights is not part of a load
            p.cpu.push_back(cpu_seconds() - c0);
        }
        if (p.wall.back() < best) best = p.wall.back(), p.cached = cached;
    }
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"load_bench: checkpoint load throughput (load_rank_weights)"};
    std::string model;
    std::vector<int> threads{1, 2}, cps{1, 2};
    int repeat = 2;
    bool cold = false, reuse = false;
    app.add_option("--model", model, "checkpoint folder")->required();
    app.add_option("--threads", threads, "reader thread counts")->delimiter(',');
    app.add_option("--cp", cps, "CP sizes")->delimiter(',');
    app.add_option("--repeat", repeat, "runs per point (the best is reported)");
    app.add_flag("--cold", cold, "drop the files from the page cache before each run");
    app.add_flag("--reuse-memory", reuse,
                 "keep freed memory in the process (malloc never unmaps or trims), so runs after "
                 "the first write into memory already touched: the load without first-touch cost");
    CLI11_PARSE(app, argc, argv);
    if (reuse) {
        ::mallopt(M_MMAP_MAX, 0);         // every allocation from the heap...
        ::mallopt(M_TRIM_THRESHOLD, -1);  // ...which is never given back
    }
    try {
        const std::vector<std::string> files = safetensors_files(model);
        fmt::print("{:>7} {:>3} {:>6} {:>9} {:>7} {:>7} {:>7} {:>6} {:>8} {:>8} {:>7}\n", "threads",
                   "cp", "cached", "stored GB", "f32 GB", "best s", "median", "CPU s", "stored/s",
                   "f32/s", "touch s");
        for (int cp : cps)
            for (int t : threads) {
                Point p = measure(model, files, cp, t, repeat, cold);
                const size_t best = std::min_element(p.wall.begin(), p.wall.end()) - p.wall.begin();
                std::vector<double> sorted = p.wall;
                std::sort(sorted.begin(), sorted.end());
                double touch = 1e30;
                for (int i = 0; i < std::min(repeat, 2); ++i)
                    touch = std::min(touch, touch_seconds(p.stats.f32_bytes, t));
                const double gs = p.stats.stored_bytes * 1e-9, gf = p.stats.f32_bytes * 1e-9;
                const double w = p.wall[best];
                fmt::print(
                    "{:>7} {:>3} {:>5.0f}% {:>9.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>6.2f} {:>8.2f} "
                    "{:>8.2f} {:>7.2f}\n",
                    t, cp, 100 * p.cached, gs, gf, w, sorted[sorted.size() / 2], p.cpu[best],
                    gs / w, gf / w, touch);
                std::fflush(stdout);
            }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
