// Checks on a command's output paths, made before any long work (loading a model, generating a
// checkpoint) so that an unwritable path, a full disk or an output that would overwrite an input
// is one clear error at the start instead of a lost run at the end:
//  * check_output_file / check_output_folder: the file (folder) can be created — its folder exists
//    (or, for a folder, its nearest existing ancestor) and a file can be created in it — and is
//    not of the wrong kind;
//  * check_output_space: the bytes each filesystem receives fit into its free space (statvfs, as
//    an unprivileged user may use it) and each file fits the process's file size limit
//    (RLIMIT_FSIZE, `ulimit -f`);
//  * check_not_an_input: an output is not one of the inputs, compared by device and inode, so a
//    symlink, a hard link or another spelling of the same path is caught.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace cpfill {

// `what` names the output in messages ("--logits-out").
void check_output_file(const std::string& path, const std::string& what);
void check_output_folder(const std::string& dir, const std::string& what);

struct PlannedOutput {
    std::string what;  // "--logits-out", "--kv-out request_0.safetensors"
    std::string path;  // the file to be written (its folder may not exist yet)
    size_t bytes = 0;  // its size (at least)
};
// Throws naming the output, the bytes needed and free, when the planned files do not fit.
void check_output_space(const std::vector<PlannedOutput>& outputs);

// The bytes an unprivileged process may still write on the filesystem holding `path` (or its
// nearest existing ancestor); nullopt when it cannot be read.
std::optional<size_t> free_disk_bytes(const std::string& path);
// The largest file this process may write (RLIMIT_FSIZE); nullopt when unlimited.
std::optional<size_t> file_size_limit();

// An existing file or folder, identified by device and inode.
struct FileId {
    unsigned long long dev = 0, ino = 0;
    std::string path;  // as given, for messages
    bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};
std::optional<FileId> file_id(const std::string& path);  // nullopt when it does not exist
// `folder` and every entry directly in it (the files a model folder's loader may read).
std::vector<FileId> folder_ids(const std::string& folder);

// Throws when `output` is one of `inputs` (by device and inode): "--logits-out P is the input
// Q: it would be overwritten". An output that does not exist yet is no input.
void check_not_an_input(const std::string& output, const std::string& what,
                        const std::vector<FileId>& inputs);

}  // namespace cpfill
