// Output path checks (see the header): probes with a real file, statvfs, getrlimit, stat.
#include "io/output_paths.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"

namespace cpfill {

namespace fs = std::filesystem;

namespace {

// `path` itself when it exists, else its nearest existing ancestor ("." for a relative path).
fs::path nearest_existing(const fs::path& path) {
    std::error_code ec;
    fs::path p = path;
    while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
    return p.empty() ? fs::path(".") : p;
}

fs::path folder_of(const std::string& file) {
    const fs::path parent = fs::path(file).parent_path();
    return parent.empty() ? fs::path(".") : parent;
}

// Creates and removes a file in `folder`: the one test of "a file can be created here" that
// permissions, read-only mounts, ACLs and full inode tables all answer truthfully.
void probe_folder(const fs::path& folder, const std::string& what, const std::string& target) {
    const fs::path probe = folder / (".cpfill-probe-" + std::to_string(::getpid()));
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    CPFILL_CHECK(fd >= 0, "{} {}: cannot create a file in the folder {} ({})", what, target,
                 folder.string(), std::strerror(errno));
    ::close(fd);
    ::unlink(probe.c_str());
}

}  // namespace

void check_output_file(const std::string& path, const std::string& what) {
    CPFILL_CHECK(!path.empty() && fs::path(path).has_filename(),
                 "{} '{}': expected a file name (not a folder)", what, path);
    std::error_code ec;
    const fs::file_status st = fs::status(path, ec);
    CPFILL_CHECK(!fs::is_directory(st), "{} {}: is a folder, expected a file name", what, path);
    CPFILL_CHECK(!fs::exists(st) || fs::is_regular_file(st),
                 "{} {}: exists and is not a regular file", what, path);
    const fs::path folder = folder_of(path);
    const fs::file_status fst = fs::status(folder, ec);
    CPFILL_CHECK(fs::exists(fst), "{} {}: the folder {} does not exist", what, path,
                 folder.string());
    CPFILL_CHECK(fs::is_directory(fst), "{} {}: {} is not a folder", what, path, folder.string());
    probe_folder(folder, what, path);
}

void check_output_folder(const std::string& dir, const std::string& what) {
    CPFILL_CHECK(!dir.empty(), "{}: expected a folder name", what);
    std::error_code ec;
    const fs::file_status st = fs::status(dir, ec);
    CPFILL_CHECK(!fs::exists(st) || fs::is_directory(st), "{} {}: exists and is not a folder", what,
                 dir);
    const fs::path base = nearest_existing(dir);
    CPFILL_CHECK(fs::is_directory(base, ec), "{} {}: {} is not a folder", what, dir, base.string());
    probe_folder(base, what, dir);
}

std::optional<size_t> free_disk_bytes(const std::string& path) {
    struct statvfs s {};
    if (::statvfs(nearest_existing(path).c_str(), &s) != 0) return std::nullopt;
    return static_cast<size_t>(s.f_bavail) * static_cast<size_t>(s.f_frsize);
}

std::optional<size_t> file_size_limit() {
    struct rlimit r {};
    if (::getrlimit(RLIMIT_FSIZE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
    return static_cast<size_t>(r.rlim_cur);
}

void check_output_space(const std::vector<PlannedOutput>& outputs) {
    const std::optional<size_t> limit = file_size_limit();
    struct Fs {
        size_t need = 0;
        std::optional<size_t> free;
        std::string where;
    };
    std::map<unsigned long long, Fs> by_device;
    for (const PlannedOutput& o : outputs) {
        CPFILL_CHECK(!limit || o.bytes <= *limit,
                     "{} {}: the file needs {} bytes but this process may write files of at most "
                     "{} bytes (ulimit -f)",
                     o.what, o.path, o.bytes, *limit);
        const fs::path base = nearest_existing(fs::path(o.path).parent_path());
        struct stat st {};
        if (::stat(base.c_str(), &st) != 0) continue;
        Fs& f = by_device[static_cast<unsigned long long>(st.st_dev)];
        if (f.where.empty()) {
            f.where = base.string();
            f.free = free_disk_bytes(base.string());
        }
        f.need += o.bytes;
        // An existing file is replaced only after its successor is complete: no credit for it.
        CPFILL_CHECK(!f.free || f.need <= *f.free,
                     "{} {}: the outputs on the filesystem of {} need {:.3f} GB ({} bytes) but "
                     "{:.3f} GB ({} bytes) are free",
                     o.what, o.path, f.where, f.need * 1e-9, f.need, *f.free * 1e-9, *f.free);
    }
}

std::optional<FileId> file_id(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return std::nullopt;
    return FileId{static_cast<unsigned long long>(st.st_dev),
                  static_cast<unsigned long long>(st.st_ino), path};
}

std::vector<FileId> folder_ids(const std::string& folder) {
    std::vector<FileId> out;
    if (auto id = file_id(folder)) out.push_back(*id);
    std::error_code ec;
    for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
        if (auto id = file_id(it->path().string())) out.push_back(*id);
    return out;
}

void check_not_an_input(const std::string& output, const std::string& what,
                        const std::vector<FileId>& inputs) {
    const std::optional<FileId> id = file_id(output);
    if (!id) return;
    for (const FileId& in : inputs)
        CPFILL_CHECK(!(in == *id),
                     "{} {}: is the input {}: expected an output path that is not "
                     "read by this run (it would be overwritten)",
                     what, output, in.path);
}

}  // namespace cpfill
