// socket.hpp (backends-private) — a TCP client socket whose every connect, send and receive
// ends by a deadline (poll(2) on a non-blocking socket): what the store clients read and write
// with, so a server that is silent, drops SYNs or stops mid-answer cannot hold a caller forever.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "meshsim/error.hpp"

namespace meshsim::detail {

using Clock = std::chrono::steady_clock;

inline int remaining_ms(Clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Socket is one connected TCP socket whose every operation ends by a deadline.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Socket() { close(); }
  bool open() const { return fd_ >= 0; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  // connect tries every address of host:port once; "" on success, else why not.
  static std::pair<Socket, std::string> connect(const std::string& host, uint16_t port,
                                                Clock::time_point until) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
      return {Socket(), "cannot resolve " + quote_input(host) + ": " + ::gai_strerror(rc)};
    }
    std::string why = "no address";
    for (addrinfo* a = res; a; a = a->ai_next) {
      Socket s(
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
      if (!s.open()) {
        why = std::strerror(errno);
        continue;
      }
      int rc = ::connect(s.fd_, a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{s.fd_, POLLOUT, 0};
        rc = ::poll(&p, 1, remaining_ms(until));
        if (rc == 0) {
          why = "no answer to the connection request (dropped or unreachable)";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc != 0) {
        why = std::strerror(errno);
        continue;
      }
      int one = 1;
      ::setsockopt(s.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::freeaddrinfo(res);
      return {std::move(s), ""};
    }
    ::freeaddrinfo(res);
    return {Socket(), why};
  }

  // send_all: false when the peer is gone or the deadline passed.
  bool send_all(const std::string& data, Clock::time_point until) {
    std::size_t at = 0;
    while (at < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + at, data.size() - at, MSG_NOSIGNAL);
      if (n > 0) {
        at += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};
        if (::poll(&p, 1, remaining_ms(until)) <= 0) return false;
        continue;
      }
      return false;
    }
    return true;
  }

  enum class Got { kAll, kClosed, kTimeout };
  // recv_exact reads exactly n bytes into out (appending) by `until`.
  Got recv_exact(std::size_t n, std::string& out, Clock::time_point until) {
    const std::size_t want = out.size() + n;
    char buf[4096];
    while (out.size() < want) {
      const ssize_t r = ::recv(fd_, buf, std::min(sizeof buf, want - out.size()), 0);
      if (r > 0) {
        out.append(buf, static_cast<std::size_t>(r));
        continue;
      }
      if (r == 0) return Got::kClosed;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Got::kClosed;
      pollfd p{fd_, POLLIN, 0};
      const int rc = ::poll(&p, 1, remaining_ms(until));
      if (rc == 0) return Got::kTimeout;
      if (rc < 0 && errno != EINTR) return Got::kClosed;
    }
    return Got::kAll;
  }

 private:
  int fd_ = -1;
};

inline std::string where(const std::string& host, uint16_t port) {
  return host + ":" + std::to_string(port);
}

// connect_until retries refused connections until `until` (a server may not listen yet).
inline Socket connect_until(const std::string& host, uint16_t port, Clock::time_point until,
                     std::chrono::milliseconds budget) {
  for (;;) {
    auto [s, why] = Socket::connect(host, port, until);
    if (s.open()) return std::move(s);
    if (why.rfind("cannot resolve", 0) == 0) throw Unavailable("store " + where(host, port) + ": " + why);
    if (Clock::now() >= until) {
      throw Unavailable("store: cannot connect to " + where(host, port) + " within " +
                        std::to_string(budget.count()) + " ms: " + why);
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::milliseconds>(std::chrono::milliseconds(20), std::chrono::milliseconds(remaining_ms(until))));
  }
}

// numeric_host is `host` as an IP address (a name such as torchrun's "localhost" or the agent's
// host name resolved, IPv4 first), since meshsim's store binds and connects by address.
inline std::string numeric_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
    throw Unavailable("store address " + quote_input(host) +
                      " cannot be resolved: " + ::gai_strerror(rc));
  }
  const addrinfo* pick = res;
  for (const addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  }
  char buf[NI_MAXHOST];
  const int rc =
      ::getnameinfo(pick->ai_addr, pick->ai_addrlen, buf, sizeof buf, nullptr, 0, NI_NUMERICHOST);
  ::freeaddrinfo(res);
  if (rc != 0)
    throw Unavailable("store address " + quote_input(host) +
                      " cannot be resolved: " + ::gai_strerror(rc));
  return buf;
}


}  // namespace meshsim::detail
