// AtomicFile: temporary file + fsync + rename (see the header).
#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace cpfill {

namespace fs = std::filesystem;

namespace {

std::string temp_name_for(const std::string& path) {
    static std::atomic<unsigned> counter{0};
    const fs::path p(path);
    const std::string name =
        fmt::format(".{}.tmp-{}-{}", p.filename().string(), ::getpid(), counter++);
    return (p.parent_path() / name).string();
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
    CPFILL_CHECK(!path_.empty() && fs::path(path_).has_filename(),
                 "output path '{}': expected a file name", path_);
    std::error_code ec;
    CPFILL_CHECK(!fs::is_directory(path_, ec), "{}: is a folder, expected a file to write", path_);
    temp_ = temp_name_for(path_);
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    CPFILL_CHECK(fd_ >= 0, "{}: cannot create a file in its folder ({})", path_,
                 std::strerror(errno));
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (!temp_.empty()) ::unlink(temp_.c_str());
    temp_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
    CPFILL_CHECK(fd_ >= 0, "{}: write after commit or failure", path_);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int err = w < 0 ? errno : ENOSPC;
            discard();
            CPFILL_FAIL("{}: writing failed after {} bytes ({}); nothing was written there", path_,
                        written_, std::strerror(err));
        }
        p += w;
        n -= static_cast<size_t>(w);
        written_ += static_cast<size_t>(w);
    }
}

void AtomicFile::commit() {
    CPFILL_CHECK(fd_ >= 0, "{}: commit after commit or failure", path_);
    // A full disk can show only now (delayed allocation): fsync and close are checked too.
    if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) {
        const int err = errno;
        discard();
        CPFILL_FAIL("{}: flushing {} bytes to disk failed ({}); nothing was written there", path_,
                    written_, std::strerror(err));
    }
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        const int err = errno;
        discard();
        CPFILL_FAIL("{}: closing the file failed ({}); nothing was written there", path_,
                    std::strerror(err));
    }
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
        const int err = errno;
        discard();
        CPFILL_FAIL("{}: renaming the finished file into place failed ({})", path_,
                    std::strerror(err));
    }
    temp_.clear();
}

void write_file_atomically(const std::string& path, const std::string& text) {
    AtomicFile f(path);
    f.write(text.data(), text.size());
    f.commit();
}

}  // namespace cpfill
