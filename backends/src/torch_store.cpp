// The PyTorch TCPStore client: blocking-free POSIX sockets, every connect, send and receive
// bounded by a deadline through poll(2). The wire format is documented in torch_store.hpp.
#include "meshsim/torch_store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>

#include "meshsim/error.hpp"
#include "socket.hpp"

namespace meshsim {

namespace {

using detail::Clock;
using detail::Socket;
using detail::connect_until;
using detail::where;
using std::chrono::milliseconds;

constexpr uint32_t kValidateMagic = 0x3C85F7CE;
// The nonce's third byte is not zero: a 1.13 server reading the probe as a SET sees a key
// length of at least 2^56 bytes and closes at once instead of trying to allocate and await it.
constexpr uint32_t kNonceHigh = 0x004D0000;
// The largest value this client accepts in an answer (PyTorch's libuv server caps values at
// 8 MiB; 1.13 has no cap): a longer one is a confused or hostile server.
constexpr uint64_t kMaxReply = uint64_t{64} << 20;

// Query codes per protocol, by meaning.
enum class Q {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kNumKeys,
  kDelete,
  kCancelWait,
  kPing
};

uint8_t code(Q q, StoreProtocol p) {
  if (p == StoreProtocol::kTorch2) {
    switch (q) {
      case Q::kValidate:
        return 0;
      case Q::kSet:
        return 1;
      case Q::kCompareSet:
        return 2;
      case Q::kGet:
        return 3;
      case Q::kAdd:
        return 4;
      case Q::kCheck:
        return 5;
      case Q::kWait:
        return 6;
      case Q::kNumKeys:
        return 7;
      case Q::kDelete:
        return 8;
      case Q::kCancelWait:
        return 12;
      case Q::kPing:
        return 13;
    }
  }
  switch (q) {
    case Q::kSet:
      return 0;
    case Q::kCompareSet:
      return 1;
    case Q::kGet:
      return 2;
    case Q::kAdd:
      return 3;
    case Q::kCheck:
      return 4;
    case Q::kWait:
      return 5;
    case Q::kNumKeys:
      return 6;
    case Q::kDelete:
      return 8;
    default:
      break;
  }
  throw Internal("torch store: query " + std::to_string(static_cast<int>(q)) +
                 " does not exist in PyTorch 1.13");
}

// Request builds one query: native little-endian integers, u64-length-prefixed strings.
struct Request {
  std::string out;
  Request(Q q, StoreProtocol p) { out.push_back(static_cast<char>(code(q, p))); }
  Request& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return *this;
  }
  Request& u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    return *this;
  }
  Request& str(const std::string& s) {
    u64(s.size());
    out += s;
    return *this;
  }
  Request& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) str(k);
    return *this;
  }
};

uint64_t le64(const std::string& b) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(b[static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}

uint32_t le32(const std::string& b) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<uint8_t>(b[static_cast<std::size_t>(i)])) << (8 * i);
  return v;
}

std::string handshake() {
  Request r(Q::kValidate, StoreProtocol::kTorch2);
  r.u32(kValidateMagic);
  r.out.push_back(static_cast<char>(code(Q::kPing, StoreProtocol::kTorch2)));
  const uint32_t nonce = kNonceHigh | (static_cast<uint32_t>(::getpid()) & 0xFFFF);
  r.u32(nonce);
  return r.out;
}

uint32_t handshake_nonce(const std::string& h) { return le32(h.substr(6, 4)); }

// Probed is what one probe connection learned; `sock` stays open for a 2.x server.
struct Probed {
  std::optional<StoreProtocol> protocol;
  Socket sock;
  std::string why;  // when protocol is empty
};

Probed probe_on(Socket s, const std::string& host, uint16_t port, Clock::time_point until) {
  const std::string h = handshake();
  Probed out;
  if (!s.send_all(h, until)) {
    out.protocol = StoreProtocol::kTorch113;  // closed before reading: a 1.13 server's answer
    return out;
  }
  std::string got;
  const auto r = s.recv_exact(4, got, until);
  if (r == Socket::Got::kAll && le32(got) == handshake_nonce(h)) {
    out.protocol = StoreProtocol::kTorch2;
    out.sock = std::move(s);
    return out;
  }
  if (r == Socket::Got::kClosed && got.empty()) {
    out.protocol = StoreProtocol::kTorch113;
    return out;
  }
  if (r == Socket::Got::kTimeout && got.empty()) {
    out.why = "no answer to PyTorch's VALIDATE/PING handshake from " + where(host, port) +
              " (a server that speaks neither PyTorch's TCPStore protocol nor meshsim's)";
    return out;
  }
  // meshsim's store answers an error frame: u32 length, status byte 3, "OutOfRange: frame of".
  const uint32_t len = got.size() == 4 ? le32(got) : 0;
  if (len > 0 && len < 4096) {
    std::string body;
    s.recv_exact(std::min<std::size_t>(len, 12), body, until);
    if (body.size() >= 11 && body[0] == 3 && body.compare(1, 10, "OutOfRange") == 0) {
      out.protocol = StoreProtocol::kMeshsim;
      return out;
    }
  }
  out.why = where(host, port) + " answered PyTorch's VALIDATE/PING handshake with " +
            std::to_string(got.size()) +
            " unexpected byte(s); it is not a PyTorch TCPStore (1.13 or 2.x) nor meshsim's store";
  return out;
}

}  // namespace

std::string to_string(StoreProtocol p) {
  switch (p) {
    case StoreProtocol::kMeshsim:
      return "meshsim";
    case StoreProtocol::kTorch113:
      return "torch-1.13";
    case StoreProtocol::kTorch2:
      return "torch-2";
  }
  return "?";
}

StoreProtocol parse_store_protocol(const std::string& text) {
  if (text == "1.13") return StoreProtocol::kTorch113;
  if (text == "2") return StoreProtocol::kTorch2;
  throw InvalidArgument("MESHSIM_TORCH_STORE_PROTOCOL=" + quote_input(text) +
                        " is not a PyTorch TCPStore protocol (known: 1.13, 2)");
}

StoreProtocol probe_store(const std::string& host, uint16_t port, milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  Probed p = probe_on(connect_until(host, port, until, timeout), host, port, until);
  if (!p.protocol) throw Unavailable("store: " + p.why);
  return *p.protocol;
}

struct TorchStoreClient::Impl {
  TorchStoreOptions opt;
  StoreProtocol proto = StoreProtocol::kTorch2;
  Socket sock;
  bool lost = false;  // the server closed on us: later calls fail at once
  std::mutex mu;

  std::string addr() const { return where(opt.host, opt.port); }

  // connect opens a connection in the known protocol (2.x: the handshake answered).
  void connect() {
    const auto until = Clock::now() + opt.connect_timeout;
    Socket s = connect_until(opt.host, opt.port, until, opt.connect_timeout);
    if (proto == StoreProtocol::kTorch2) {
      Probed p = probe_on(std::move(s), opt.host, opt.port,
                          std::min(until, Clock::now() + opt.reply_timeout));
      if (p.protocol != StoreProtocol::kTorch2) {
        throw Unavailable("torch store " + addr() +
                          ": the server did not complete PyTorch 2.x's VALIDATE/PING "
                          "handshake (" +
                          (p.protocol ? "it speaks " + to_string(*p.protocol) : p.why) +
                          "); MESHSIM_TORCH_STORE_PROTOCOL=2 may be wrong for this server");
      }
      s = std::move(p.sock);
    }
    sock = std::move(s);
  }

  void ensure() {
    if (sock.open()) return;
    if (lost) throw Unavailable("torch store " + addr() + ": the connection was lost earlier");
    connect();
  }

  [[noreturn]] void fail_closed(const std::string& what) {
    sock.close();
    lost = true;
    std::string hint;
    if (proto == StoreProtocol::kTorch113)
      hint =
          " (a PyTorch 2.x server closes a 1.13 query: MESHSIM_TORCH_STORE_PROTOCOL=1.13 may be "
          "wrong)";
    throw Unavailable("torch store " + addr() + ": the server closed the connection during " +
                      what + "; it stopped, restarted or refused the query" + hint);
  }

  [[noreturn]] void fail_silent(const std::string& what, milliseconds waited) {
    sock.close();
    lost = true;
    std::string hint;
    if (proto == StoreProtocol::kTorch113)
      hint =
          " (a PyTorch 2.x server never answers a 1.13 query: MESHSIM_TORCH_STORE_PROTOCOL=1.13 "
          "may be wrong)";
    throw DeadlineExceeded("torch store " + addr() + ": no answer to " + what + " within " +
                           std::to_string(waited.count()) + " ms" + hint);
  }

  void send(const Request& r, const std::string& what) {
    ensure();
    if (!sock.send_all(r.out, Clock::now() + opt.reply_timeout)) fail_closed(what);
  }

  std::string recv(std::size_t n, const std::string& what, milliseconds extra = milliseconds(0)) {
    std::string out;
    const auto waited = opt.reply_timeout + extra;
    switch (sock.recv_exact(n, out, Clock::now() + waited)) {
      case Socket::Got::kAll:
        return out;
      case Socket::Got::kClosed:
        fail_closed(what);
      case Socket::Got::kTimeout:
        fail_silent(what, waited);
    }
    return out;
  }

  std::string recv_vector(const std::string& what) {
    const uint64_t n = le64(recv(8, what));
    if (n > kMaxReply) {
      sock.close();
      lost = true;
      throw Unavailable("torch store " + addr() + ": answered " + what + " with a value of " +
                        std::to_string(n) + " bytes, over the " + std::to_string(kMaxReply) +
                        "-byte limit");
    }
    return recv(static_cast<std::size_t>(n), what);
  }

  uint8_t recv_byte(const std::string& what, milliseconds extra = milliseconds(0)) {
    return static_cast<uint8_t>(recv(1, what, extra)[0]);
  }

  bool check(const std::vector<std::string>& keys) {
    send(Request(Q::kCheck, proto).keys(keys), "CHECK");
    const uint8_t b = recv_byte("CHECK");
    if (b > 1) fail_protocol("CHECK", b);
    return b == 0;  // READY
  }

  [[noreturn]] void fail_protocol(const std::string& what, int byte) {
    sock.close();
    lost = true;
    throw Unavailable("torch store " + addr() + ": answered " + what + " with status byte " +
                      std::to_string(byte) + ", which PyTorch's protocol does not define");
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) {
    if (timeout.count() <= 0) {
      if (check(keys)) return;
      throw DeadlineExceeded("torch store " + addr() + ": " + missing(keys) +
                             " not set (no wait asked)");
    }
    send(Request(Q::kWait, proto).keys(keys), "WAIT");
    std::string got;
    const auto r = sock.recv_exact(1, got, Clock::now() + timeout);
    if (r == Socket::Got::kClosed) fail_closed("WAIT");
    if (r == Socket::Got::kAll) {
      if (got[0] != 0) fail_protocol("WAIT", static_cast<uint8_t>(got[0]));
      return;
    }
    // The deadline passed with the wait registered on the server.
    if (proto == StoreProtocol::kTorch2) {
      send(Request(Q::kCancelWait, proto), "CANCEL_WAIT");
      uint8_t b = recv_byte("CANCEL_WAIT");
      if (b == 0)
        b = recv_byte("CANCEL_WAIT");  // the keys came first: STOP_WAITING, then the cancel
      if (b != 1) fail_protocol("CANCEL_WAIT", b);
    } else {
      sock.close();  // 1.13 cannot cancel: a fresh connection on the next call
    }
    throw DeadlineExceeded("torch store " + addr() + ": " + missing(keys) + " not set within " +
                           std::to_string(timeout.count()) + " ms");
  }

  static std::string missing(const std::vector<std::string>& keys) {
    std::string s = keys.size() == 1 ? "key " : "keys ";
    for (std::size_t i = 0; i < keys.size() && i < 8; ++i)
      s += (i ? ", " : "") + quote_input(keys[i]);
    if (keys.size() > 8) s += ", ... (" + std::to_string(keys.size()) + " keys)";
    return s;
  }
};

namespace {
void check_key(const std::string& key) {
  if (key.size() > kMaxStoreKey) {
    throw InvalidArgument("torch store: a key of " + std::to_string(key.size()) +
                          " bytes exceeds " + std::to_string(kMaxStoreKey));
  }
}
}  // namespace

TorchStoreClient::TorchStoreClient(TorchStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  if (impl_->opt.protocol == StoreProtocol::kMeshsim) {
    throw InvalidArgument(
        "TorchStoreClient speaks PyTorch's protocols only (torch-1.13, torch-2), not meshsim");
  }
  if (impl_->opt.protocol) {
    impl_->proto = *impl_->opt.protocol;
    impl_->connect();
    return;
  }
  const auto until = Clock::now() + impl_->opt.connect_timeout;
  Probed p =
      probe_on(connect_until(impl_->opt.host, impl_->opt.port, until, impl_->opt.connect_timeout),
               impl_->opt.host, impl_->opt.port, until);
  if (!p.protocol) throw Unavailable("torch store: " + p.why);
  if (*p.protocol == StoreProtocol::kMeshsim) {
    throw FailedPrecondition(
        "torch store: " + impl_->addr() +
        " is meshsim's own store, not a PyTorch TCPStore (use TcpStoreClient)");
  }
  impl_->proto = *p.protocol;
  if (impl_->proto == StoreProtocol::kTorch2) {
    impl_->sock = std::move(p.sock);
  } else {
    impl_->connect();
  }
}

TorchStoreClient::~TorchStoreClient() = default;

StoreProtocol TorchStoreClient::protocol() const { return impl_->proto; }
std::string TorchStoreClient::address() const { return impl_->addr(); }

void TorchStoreClient::set(const std::string& key, const std::string& value) {
  check_key(key);
  std::lock_guard lk(impl_->mu);
  impl_->send(Request(Q::kSet, impl_->proto).str(key).str(value), "SET");
}

std::string TorchStoreClient::get(const std::string& key, milliseconds timeout) {
  check_key(key);
  std::lock_guard lk(impl_->mu);
  impl_->wait({key}, timeout);
  impl_->send(Request(Q::kGet, impl_->proto).str(key), "GET");
  return impl_->recv_vector("GET of " + quote_input(key));
}

void TorchStoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& k : keys) check_key(k);
  std::lock_guard lk(impl_->mu);
  impl_->wait(keys, timeout);
}

int64_t TorchStoreClient::add(const std::string& key, int64_t delta) {
  check_key(key);
  std::lock_guard lk(impl_->mu);
  impl_->send(Request(Q::kAdd, impl_->proto).str(key).u64(static_cast<uint64_t>(delta)), "ADD");
  std::string out;
  switch (impl_->sock.recv_exact(8, out, Clock::now() + impl_->opt.reply_timeout)) {
    case Socket::Got::kAll:
      return static_cast<int64_t>(le64(out));
    case Socket::Got::kClosed:
      // PyTorch's server closes a connection whose ADD meets a value that is not an integer;
      // 2.13's legacy server also closes one whose first query is not VALIDATE (a 1.13 query).
      impl_->sock.close();
      throw InvalidArgument(
          "torch store " + impl_->addr() + ": ADD to " + quote_input(key) +
          " was refused (the server closed the connection: the value is not a decimal "
          "int64, or the server stopped" +
          (impl_->proto == StoreProtocol::kTorch113
               ? std::string(", or it is a PyTorch 2.x server, which closes a 1.13 query: "
                             "MESHSIM_TORCH_STORE_PROTOCOL=1.13 may be wrong)")
               : std::string(")")));
    case Socket::Got::kTimeout:
      impl_->fail_silent("ADD", impl_->opt.reply_timeout);
  }
  return 0;
}

std::string TorchStoreClient::compare_set(const std::string& key, const std::string& expected,
                                          const std::string& desired) {
  check_key(key);
  std::lock_guard lk(impl_->mu);
  impl_->send(Request(Q::kCompareSet, impl_->proto).str(key).str(expected).str(desired),
              "COMPARE_SET");
  std::string now = impl_->recv_vector("COMPARE_SET");
  // An absent key with a non-empty `expected` stores nothing and answers `expected`; a present
  // key equal to `expected` answers `desired`. So `expected` back, when it differs from
  // `desired`, means the key is absent.
  if (!expected.empty() && now == expected && expected != desired) return "";
  return now;
}

bool TorchStoreClient::remove(const std::string& key) {
  check_key(key);
  std::lock_guard lk(impl_->mu);
  impl_->send(Request(Q::kDelete, impl_->proto).str(key), "DELETE_KEY");
  return le64(impl_->recv(8, "DELETE_KEY")) != 0;
}

bool TorchStoreClient::check(const std::vector<std::string>& keys) {
  for (const auto& k : keys) check_key(k);
  std::lock_guard lk(impl_->mu);
  return impl_->check(keys);
}

int64_t TorchStoreClient::num_keys() {
  std::lock_guard lk(impl_->mu);
  impl_->send(Request(Q::kNumKeys, impl_->proto), "GETNUMKEYS");
  return static_cast<int64_t>(le64(impl_->recv(8, "GETNUMKEYS")));
}

}  // namespace meshsim
