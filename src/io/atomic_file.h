// Output files that are never seen half written: AtomicFile writes into a temporary file in the
// target's folder (same filesystem, so the final rename(2) is atomic), flushes it to disk and
// renames it over the target on commit(). Until then the target keeps its old content (or stays
// absent); a failed write (full disk, file size limit, I/O error) or an exception before commit()
// removes the temporary file, so no truncated file is left behind. Errors name the target path
// and the system's reason.
#pragma once

#include <cstddef>
#include <string>

namespace cpfill {

class AtomicFile {
  public:
    // Creates the temporary file ".<name>.tmp-<pid>-<n>" beside `path`; throws if it cannot.
    explicit AtomicFile(std::string path);
    ~AtomicFile();  // not committed: closes and removes the temporary file; never throws
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t n);  // throws naming the target on any failure
    // fsync, close and rename onto the target. Throws (and removes the temporary) on failure.
    void commit();

    const std::string& path() const { return path_; }
    const std::string& temp_path() const { return temp_; }

  private:
    void discard() noexcept;

    std::string path_;
    std::string temp_;
    int fd_ = -1;
    size_t written_ = 0;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace cpfill
