#include "meshsim/text_file.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "meshsim/error.hpp"

namespace meshsim {

namespace {

// Fd closes the descriptor on every path out.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string read_text_file(const std::string& path, std::size_t max_bytes, const std::string& what) {
  const std::string where = what + " " + quote_input(path);
  auto refuse = [&](const std::string& why) { return InvalidArgument(where + " cannot be read: " + why); };
  if (path.empty()) throw refuse("the path is empty");
  if (path.find('\0') != std::string::npos) throw refuse("the path holds a NUL byte");
  // O_NONBLOCK: opening a FIFO no process writes to returns at once instead of waiting for a
  // writer forever; a pipe or FIFO is then read under a deadline (kInputDeadlineMs).
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (f.fd < 0) throw refuse(std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw refuse(std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw refuse("it is a directory");
  const bool stream = !S_ISREG(st.st_mode);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kInputDeadlineMs);
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) > max_bytes) {
    throw ResourceExhausted(where + " is over " + std::to_string(max_bytes) + " bytes (it holds " +
                            std::to_string(st.st_size) + ")");
  }
  std::string text;
  if (S_ISREG(st.st_mode) && st.st_size > 0) {
    // A file: straight into the string, its size known (no copy through a buffer, no regrowth);
    // the loop below then reads whatever was appended meanwhile.
    text.resize(static_cast<std::size_t>(st.st_size));
    std::size_t got = 0;
    while (got < text.size()) {
      const ssize_t n = ::read(f.fd, text.data() + got, text.size() - got);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        throw refuse(std::string(std::strerror(errno)) + " after " + std::to_string(got) + " bytes");
      }
      got += static_cast<std::size_t>(n);
    }
    text.resize(got);
  }
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n == 0) break;  // the end, or a FIFO nothing writes to (then it reads as empty)
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && stream) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        throw DeadlineExceeded(where + " cannot be read: its writer sent " + std::to_string(text.size()) +
                               " bytes and then nothing for " + std::to_string(kInputDeadlineMs / 1000) +
                               " s (a pipe or FIFO is read under that deadline)");
      }
      pollfd p{f.fd, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
      continue;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      throw refuse(std::string(std::strerror(errno)) + " after " + std::to_string(text.size()) + " bytes");
    }
    text.append(buf, static_cast<std::size_t>(n));
    deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kInputDeadlineMs);
    if (text.size() > max_bytes) {
      throw ResourceExhausted(where + " is over " + std::to_string(max_bytes) + " bytes");
    }
  }
  if (stream && text.empty()) throw refuse("it is a pipe or FIFO and nothing wrote to it");
  return text;
}

namespace {

// file_key is what identifies a file: "inode DEV:INO" where it exists, else its absolute,
// normalised path.
std::string file_key(const std::string& path, bool& special) {
  struct stat st {};
  special = false;
  if (::stat(path.c_str(), &st) == 0) {
    special = !S_ISREG(st.st_mode);
    return "inode " + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  }
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  return "path " + (ec ? path : p.string());
}

}  // namespace

void check_distinct(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
  std::vector<std::pair<std::string, const NamedPath*>> seen;
  for (const NamedPath& in : inputs) {
    if (in.path.empty()) continue;
    bool special = false;
    seen.push_back({file_key(in.path, special), &in});
  }
  const std::size_t n_inputs = seen.size();
  for (const NamedPath& out : outputs) {
    if (out.path.empty()) continue;
    bool special = false;
    const std::string key = file_key(out.path, special);
    if (special) continue;
    for (std::size_t i = 0; i < seen.size(); ++i) {
      if (seen[i].first != key) continue;
      const NamedPath& other = *seen[i].second;
      if (i < n_inputs) {
        throw InvalidArgument(out.what + " " + quote_input(out.path) + " is the file " + other.what + " reads (" +
                              quote_input(other.path) + "): an output never replaces an input; write it elsewhere");
      }
      throw InvalidArgument(out.what + " " + quote_input(out.path) + " and " + other.what + " " + quote_input(other.path) +
                            " are one file: each output needs its own");
    }
    seen.push_back({key, &out});
  }
}

void prepare_output(const std::string& path, const std::string& what) {
  const std::string where = what + " " + quote_input(path);
  auto refuse = [&](const std::string& why) { return InvalidArgument(where + " cannot be written: " + why); };
  if (path.empty()) throw refuse("the path is empty");
  if (path.find('\0') != std::string::npos) throw refuse("the path holds a NUL byte");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw refuse("it is a directory");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw refuse("its directory " + quote_input(dir.string()) + " cannot be made: " + ec.message());
  if (::access(dir.c_str(), W_OK) != 0) {
    throw refuse("its directory " + quote_input(dir.string()) + " is not writable: " + std::strerror(errno));
  }
}

void write_file_whole(const std::string& path, const std::string& text, const std::string& what) {
  const std::string where = what + " " + quote_input(path);
  auto refuse = [&](const std::string& why) { return InvalidArgument(where + " cannot be written: " + why); };
  if (path.empty()) throw refuse("the path is empty");
  if (path.find('\0') != std::string::npos) throw refuse("the path holds a NUL byte");
  auto write_all = [&](int fd) {
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  };
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw refuse("it is a directory");
    Fd f{::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY)};
    if (f.fd < 0 || !write_all(f.fd)) throw refuse(std::strerror(errno));
    return;
  }
  std::string tmp = path + ".meshsim-XXXXXX";
  Fd f{::mkstemp(tmp.data())};
  if (f.fd < 0) throw refuse(std::strerror(errno));
  const bool written = write_all(f.fd) && ::fsync(f.fd) == 0;
  const int write_errno = errno;
  const int closed = ::close(f.fd);
  f.fd = -1;
  if (!written || closed != 0 || ::chmod(tmp.c_str(), exists ? st.st_mode & 07777 : 0644) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = written && closed == 0 ? errno : write_errno;
    ::unlink(tmp.c_str());
    throw refuse(std::strerror(e));
  }
}

}  // namespace meshsim
