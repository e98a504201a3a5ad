// meshsim/text_file.hpp — the one reader of the files users hand meshsim (recipe files, job
// files): the whole file or a clear refusal, never a prefix; and the one writer of the files
// meshsim makes for them (pictures): the whole file or the old one untouched.
//
//   const std::string text = meshsim::read_text_file(path, 16 << 20, "--recipe");
//
// A read that fails part-way is reported as such (an ifstream takes it for the end of the file
// and hands back what it had), a directory is named as one, and a file over `max_bytes` is
// refused after reading at most max_bytes + 1 bytes (so /dev/zero ends too). Pipes and other
// character devices are read like files.
// Thread safety: a free function; concurrent calls are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace meshsim {

// read_text_file returns the contents of `path`. Errors name `what` and the path:
// InvalidArgument "<what> '<path>' cannot be read: <reason>" (missing, a directory, no
// permission, a read error part-way), ResourceExhausted "<what> '<path>' is over N bytes".
// A pipe or FIFO never blocks past a deadline: one nothing writes to is refused at once, and one
// whose writer stops sending before the end is DeadlineExceeded after kInputDeadlineMs.
inline constexpr int64_t kInputDeadlineMs = 30000;
std::string read_text_file(const std::string& path, std::size_t max_bytes, const std::string& what);

// NamedPath is a path and the flag that names it ("--trace").
struct NamedPath {
  std::string path;
  std::string what;
};

// check_distinct refuses (InvalidArgument, naming both flags and the path) an output that is one
// of the inputs or another output: the same file by device and inode where it exists, by its
// absolute, normalised path where it does not yet. An output that exists and is not a regular
// file (/dev/null, a pipe) is written in place and compared with nothing.
void check_distinct(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs);

// write_file_whole replaces `path` with `text` whole or not at all: it writes a temporary file
// beside it and renames it over the path, so a failed write (a full disk, a refused directory)
// leaves an existing file as it was. A path that exists and is not a regular file (a pipe,
// /dev/stdout) is written in place. Errors: InvalidArgument "<what> '<path>' cannot be
// written: <reason>".
void write_file_whole(const std::string& path, const std::string& text, const std::string& what);

// prepare_output makes the directory `path` goes in (with its parents, as `mkdir -p`) and checks
// that it can be written there, so a command writes its outputs only once every one of them has
// a place: a refused run leaves no file written. Errors: InvalidArgument "<what> '<path>' cannot
// be written: <reason>" (empty, a NUL byte, a directory, no permission).
void prepare_output(const std::string& path, const std::string& what);

}  // namespace meshsim
