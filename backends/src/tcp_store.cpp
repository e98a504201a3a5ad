// The TCP store: a single-threaded Boost.Asio server (one coroutine per connection) and a
// blocking client. Frames: u32 LE body length, then the body: an op byte and fields (strings
// as u32 LE length + bytes, integers as i64 LE). Responses: u32 LE length, a status byte, and
// the payload.
#include <utility>  // before asio (std::exchange in Boost 1.74's awaitable.hpp)

#include <boost/asio.hpp>

#include <atomic>
#include <cstring>
#include <optional>
#include <set>
#include <thread>

#include "meshsim/error.hpp"
#include "socket.hpp"
#include "meshsim/store.hpp"
#include "store_ops.hpp"

namespace meshsim {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

enum Op : uint8_t { kHello = 1, kSet, kGet, kWait, kAdd, kCompareSet, kRemove, kWill };
enum Status : uint8_t { kOk = 0, kNotFound, kTimeout, kError };

// Writer builds a frame body.
struct Writer {
  std::string out;
  void u8(uint8_t v) { out.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  void i64(int64_t v) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out += s;
  }
  std::string frame() const {
    Writer w;
    w.u32(static_cast<uint32_t>(out.size()));
    return w.out + out;
  }
};

// Reader parses a frame body; every read is bounds-checked (ParseError on a short body).
struct Reader {
  const std::string& in;
  std::size_t at = 0;
  void need(std::size_t n) const {
    if (in.size() - at < n) {
      throw ParseError("store frame: truncated body (needs " + std::to_string(n) + " more bytes at " +
                       std::to_string(at) + " of " + std::to_string(in.size()) + ")");
    }
  }
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(in[at++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at++])) << (8 * i);
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at++])) << (8 * i);
    return static_cast<int64_t>(v);
  }
  std::string str(std::size_t limit) {
    const uint32_t n = u32();
    if (n > limit) {
      throw ParseError("store frame: a field of " + std::to_string(n) + " bytes exceeds " +
                       std::to_string(limit));
    }
    need(n);
    std::string s = in.substr(at, n);
    at += n;
    return s;
  }
  void done() const {
    if (at != in.size()) {
      throw ParseError("store frame: " + std::to_string(in.size() - at) + " trailing bytes");
    }
  }
};

uint32_t le32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

std::string response(Status s, const std::string& payload = {}) {
  Writer w;
  w.u8(s);
  w.out += payload;
  return w.frame();
}

}  // namespace

// ---- server ---------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  TcpStoreOptions opt;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  std::atomic<std::size_t> open{0};
  std::set<tcp::socket*> sockets;          // io thread only
  std::set<asio::steady_timer*> waiters;   // io thread only
  std::map<std::string, std::string> kv;   // io thread only
  std::size_t bytes = 0;                   // keys plus values held

  void notify() {
    for (asio::steady_timer* t : waiters) t->cancel();
  }

  void charge(const std::string& key, std::size_t old_value, std::size_t new_value, bool is_new) {
    const std::size_t after = bytes - old_value + new_value + (is_new ? key.size() : 0);
    if (is_new && kv.size() >= opt.max_keys) {
      throw ResourceExhausted("store: the server holds its limit of " + std::to_string(opt.max_keys) + " keys");
    }
    if (after > opt.max_bytes) {
      throw ResourceExhausted("store: the server would hold " + std::to_string(after) +
                              " bytes, over its limit of " + std::to_string(opt.max_bytes));
    }
    bytes = after;
  }

  void put(const std::string& key, const std::string& value) {
    auto it = kv.find(key);
    charge(key, it == kv.end() ? 0 : it->second.size(), value.size(), it == kv.end());
    kv[key] = value;
  }

  // handle answers one request (all but WAIT, which needs the session's timer).
  std::string handle(uint8_t op, Reader& r) {
    switch (op) {
      case kSet: {
        std::string key = r.str(kMaxStoreKey), value = r.str(kMaxStoreFrame);
        r.done();
        put(key, value);
        notify();
        return response(kOk);
      }
      case kGet: {
        std::string key = r.str(kMaxStoreKey);
        r.done();
        auto it = kv.find(key);
        if (it == kv.end()) return response(kNotFound);
        Writer w;
        w.str(it->second);
        return response(kOk, w.out);
      }
      case kAdd: {
        std::string key = r.str(kMaxStoreKey);
        const int64_t delta = r.i64();
        r.done();
        std::map<std::string, std::string> one;
        auto it = kv.find(key);
        if (it != kv.end()) one[key] = it->second;
        const int64_t v = detail::add_to(one, key, delta);
        put(key, one[key]);
        notify();
        Writer w;
        w.i64(v);
        return response(kOk, w.out);
      }
      case kCompareSet: {
        std::string key = r.str(kMaxStoreKey), expected = r.str(kMaxStoreFrame),
                    desired = r.str(kMaxStoreFrame);
        r.done();
        std::map<std::string, std::string> one;
        auto it = kv.find(key);
        if (it != kv.end()) one[key] = it->second;
        const std::string v = detail::compare_set_in(one, key, expected, desired);
        if (one.count(key) && (it == kv.end() || it->second != one[key])) put(key, one[key]);
        notify();
        Writer w;
        w.str(v);
        return response(kOk, w.out);
      }
      case kRemove: {
        std::string key = r.str(kMaxStoreKey);
        r.done();
        auto it = kv.find(key);
        const bool existed = it != kv.end();
        if (existed) {
          bytes -= it->first.size() + it->second.size();
          kv.erase(it);
        }
        Writer w;
        w.u8(existed ? 1 : 0);
        return response(kOk, w.out);
      }
      default:
        throw ParseError("store frame: unknown op " + std::to_string(op));
    }
  }

  asio::awaitable<void> session(tcp::socket sock) {
    sockets.insert(&sock);
    ++open;
    struct Leave {
      Impl* s;
      tcp::socket* k;
      std::optional<std::pair<std::string, std::string>> will;
      ~Leave() {
        s->sockets.erase(k);
        --s->open;
        // The connection ended without clearing its will: publish it (a crashed process).
        if (will && s->acceptor.is_open()) {
          try {
            s->put(will->first, will->second);
            s->notify();
          } catch (const std::exception&) {
            // Over the store's caps: the will is dropped, never the server.
          }
        }
      }
    } leave{this, &sock, std::nullopt};
    asio::steady_timer timer(io);
    bool authenticated = opt.token.empty();
    // A store with a token: the token must arrive within frame_timeout of connecting, else the
    // connection closes (one that connects and sends nothing cannot hold a slot forever).
    asio::steady_timer hello_guard(io);
    if (!authenticated) {
      hello_guard.expires_after(opt.frame_timeout);
      hello_guard.async_wait([&sock](const boost::system::error_code& ec) {
        if (!ec) {
          boost::system::error_code ignored;
          sock.close(ignored);
        }
      });
    }
    try {
      for (;;) {
        unsigned char head[4];
        co_await asio::async_read(sock, asio::buffer(head), asio::use_awaitable);
        const uint32_t len = le32(head);
        if (len == 0 || len > kMaxStoreFrame) {
          co_await asio::async_write(
              sock, asio::buffer(response(kError, "OutOfRange: frame of " + std::to_string(len) +
                                                       " bytes outside [1, " + std::to_string(kMaxStoreFrame) + "]")),
              asio::use_awaitable);
          co_return;  // the stream cannot be resynchronised: drop the connection
        }
        std::string body;
        {
          // The rest of the frame must follow within frame_timeout, else the connection closes.
          asio::steady_timer guard(io);
          guard.expires_after(opt.frame_timeout);
          guard.async_wait([&sock](const boost::system::error_code& ec) {
            if (!ec) {
              boost::system::error_code ignored;
              sock.close(ignored);
            }
          });
          // The body grows as its bytes arrive, doubling from 4 KiB, so memory follows what clients
          // sent (at most twice it plus 4 KiB), not what their headers claim.
          while (body.size() < len) {
            const std::size_t at = body.size(),
                              step = std::min<std::size_t>(len - at, std::max<std::size_t>(at, std::size_t{4} << 10));
            body.resize(at + step);
            co_await asio::async_read(sock, asio::buffer(body.data() + at, step), asio::use_awaitable);
          }
          guard.cancel();
        }
        std::string out;
        bool close = false;
        try {
          Reader r{body};
          const uint8_t op = r.u8();
          if (op == kHello) {
            const std::string token = r.str(kMaxStoreKey);
            r.done();
            if (!opt.token.empty() && token != opt.token) {
              out = response(kError, "FailedPrecondition: wrong store token");
              close = true;
            } else {
              authenticated = true;
              hello_guard.cancel();
              out = response(kOk);
            }
          } else if (!authenticated) {
            out = response(kError, "FailedPrecondition: this store needs a token first");
            close = true;
          } else if (op == kWill) {
            // A will: (key, value) to set when this connection drops; an empty key clears it.
            std::string key = r.str(kMaxStoreKey), value = r.str(kMaxStoreKey);
            r.done();
            if (key.empty()) leave.will.reset();
            else leave.will.emplace(std::move(key), std::move(value));
            out = response(kOk);
          } else if (op == kWait) {
            const uint32_t n = r.u32();
            if (n > kMaxStoreFrame / 4) throw ParseError("store frame: " + std::to_string(n) + " keys");
            std::vector<std::string> keys;
            for (uint32_t i = 0; i < n; ++i) keys.push_back(r.str(kMaxStoreKey));
            const int64_t ms = r.i64();
            r.done();
            if (ms < 0) throw InvalidArgument("store wait: timeout " + std::to_string(ms) + " ms is negative");
            const auto deadline = std::chrono::steady_clock::now() +
                                  std::chrono::milliseconds(std::min<int64_t>(ms, int64_t{1} << 40));
            for (;;) {
              std::vector<std::string> missing;
              for (const auto& k : keys) {
                if (!kv.count(k)) missing.push_back(k);
              }
              if (missing.empty()) {
                out = response(kOk);
                break;
              }
              if (std::chrono::steady_clock::now() >= deadline) {
                Writer w;
                w.u32(static_cast<uint32_t>(missing.size()));
                for (const auto& k : missing) w.str(k);
                out = response(kTimeout, w.out);
                break;
              }
              timer.expires_at(deadline);
              waiters.insert(&timer);
              boost::system::error_code ec;
              co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
              waiters.erase(&timer);
              if (!acceptor.is_open()) co_return;  // stopping
            }
          } else {
            out = handle(op, r);
          }
        } catch (const ParseError& e) {
          out = response(kError, std::string(e.type_name()) + ": " + e.what());
          close = true;  // a malformed frame: answer, then drop the connection
        } catch (const Error& e) {
          out = response(kError, std::string(e.type_name()) + ": " + e.what());
        }
        co_await asio::async_write(sock, asio::buffer(out), asio::use_awaitable);
        if (close) co_return;
      }
    } catch (const std::exception&) {
      // The peer went away (EOF, reset) or the server is stopping: end the session.
    }
  }

  asio::awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket sock = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        continue;
      }
      if (open.load() >= opt.max_connections) {
        boost::system::error_code ignored;
        const std::string busy = response(kError, "ResourceExhausted: the store serves its limit of " +
                                                      std::to_string(opt.max_connections) + " connections");
        asio::write(sock, asio::buffer(busy), ignored);
        sock.close(ignored);
        continue;
      }
      sock.set_option(tcp::no_delay(true), ec);
      asio::co_spawn(io, session(std::move(sock)), asio::detached);
    }
  }
};

TcpStoreServer::TcpStoreServer(TcpStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  boost::system::error_code ec;
  auto addr = asio::ip::make_address(impl_->opt.host, ec);
  if (ec) {
    // A host name ("localhost", this node's name) binds the address it resolves to.
    std::string numeric;
    try {
      numeric = detail::numeric_host(impl_->opt.host);
    } catch (const Unavailable&) {
      throw InvalidArgument("store: " + quote_input(impl_->opt.host) +
                            " is neither an IP address nor a host name that resolves");
    }
    addr = asio::ip::make_address(numeric, ec);
  }
  const tcp::endpoint ep(addr, impl_->opt.port);
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw Unavailable("store: cannot listen on " + impl_->opt.host + ":" +
                      std::to_string(impl_->opt.port) + ": " + ec.message());
  }
  asio::co_spawn(impl_->io, impl_->accept_loop(), asio::detached);
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::stop() {
  if (!impl_->thread.joinable()) return;
  asio::post(impl_->io, [this] {
    boost::system::error_code ec;
    impl_->acceptor.close(ec);
    for (tcp::socket* s : impl_->sockets) s->close(ec);
    impl_->notify();
  });
  impl_->thread.join();
}

uint16_t TcpStoreServer::port() const {
  boost::system::error_code ec;
  const auto ep = impl_->acceptor.local_endpoint(ec);
  return ec ? impl_->opt.port : ep.port();
}

std::string TcpStoreServer::address() const { return impl_->opt.host + ":" + std::to_string(port()); }

std::size_t TcpStoreServer::connections() const { return impl_->open.load(); }

// ---- client ---------------------------------------------------------------------------------

struct TcpStoreClient::Impl {
  TcpStoreOptions opt;
  detail::Socket sock;
  std::mutex mu;

  std::string where() const { return opt.host + ":" + std::to_string(opt.port); }

  static const char* name_of(uint8_t op) {
    switch (op) {
      case kHello: return "hello";
      case kSet: return "set";
      case kGet: return "get";
      case kWait: return "wait";
      case kAdd: return "add";
      case kCompareSet: return "compare_set";
      case kRemove: return "remove";
      case kWill: return "will";
      default: return "request";
    }
  }

  // call sends one request and returns (status, payload). Every step ends by a deadline: the
  // wait's own time plus reply_timeout. A lost, silent or malformed server is Unavailable or
  // DeadlineExceeded naming its address, the request and how long it waited; the connection is
  // then closed (its stream cannot be trusted) and later calls fail at once.
  std::pair<Status, std::string> call(const Writer& req, std::chrono::milliseconds wait = std::chrono::milliseconds(0)) {
    std::lock_guard lk(mu);
    const std::string what = name_of(static_cast<uint8_t>(req.out.at(0)));
    if (req.out.size() > kMaxStoreFrame) {
      throw InvalidArgument("store: a request of " + std::to_string(req.out.size()) +
                            " bytes exceeds the frame limit of " + std::to_string(kMaxStoreFrame));
    }
    if (!sock.open()) throw Unavailable("store " + where() + ": the connection was lost earlier");
    const auto budget = wait + opt.reply_timeout;
    const auto start = detail::Clock::now();
    const auto until = start + budget;
    auto fail = [&](detail::Socket::Got got) {
      sock.close();
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(detail::Clock::now() - start).count();
      if (got == detail::Socket::Got::kTimeout) {
        throw DeadlineExceeded("store " + where() + ": no answer to " + what + " within " +
                               std::to_string(budget.count()) + " ms (the server is silent or overloaded)");
      }
      throw Unavailable("store " + where() + ": connection lost during " + what + " after " + std::to_string(waited) +
                        " ms; the server stopped or restarted");
    };
    if (!sock.send_all(req.frame(), until)) fail(detail::Socket::Got::kClosed);
    std::string head;
    if (auto got = sock.recv_exact(4, head, until); got != detail::Socket::Got::kAll) fail(got);
    const uint32_t len = le32(reinterpret_cast<const unsigned char*>(head.data()));
    if (len == 0 || len > kMaxStoreFrame + 64) {
      sock.close();
      throw Unavailable("store " + where() + ": sent a malformed answer to " + what + " (a frame of " +
                        std::to_string(len) + " bytes)");
    }
    std::string body;
    if (auto got = sock.recv_exact(len, body, until); got != detail::Socket::Got::kAll) fail(got);
    const auto code = static_cast<uint8_t>(body[0]);
    if (code > kError) {
      sock.close();
      throw Unavailable("store " + where() + ": sent a malformed answer to " + what + " (unknown status " +
                        std::to_string(code) + ")");
    }
    const auto status = static_cast<Status>(code);
    std::string payload = body.substr(1);
    if (status == kError) {
      // "Type: message" from the server, rethrown as the same class.
      const auto colon = payload.find(": ");
      const std::string type = payload.substr(0, colon), msg = "store " + where() + ": " + payload;
      if (type == "ResourceExhausted") throw ResourceExhausted(msg);
      if (type == "OverflowError") throw OverflowError(msg);
      if (type == "OutOfRange") throw OutOfRange(msg);
      if (type == "FailedPrecondition") throw FailedPrecondition(msg);
      if (type == "ParseError") throw ParseError(msg);
      throw InvalidArgument(msg);
    }
    return {status, std::move(payload)};
  }

  // parse reads an answer's payload; a short or long one is the server's fault, named as such.
  template <class F>
  auto parse(const std::string& payload, const char* what, F&& read) {
    try {
      Reader r{payload};
      auto v = read(r);
      r.done();
      return v;
    } catch (const ParseError& e) {
      std::lock_guard lk(mu);
      sock.close();
      throw Unavailable("store " + where() + ": sent a malformed answer to " + what + " (" + e.what() + ")");
    }
  }
};

TcpStoreClient::TcpStoreClient(TcpStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  const auto until = detail::Clock::now() + impl_->opt.connect_timeout;
  impl_->sock = detail::connect_until(impl_->opt.host, impl_->opt.port, until, impl_->opt.connect_timeout);
  if (!impl_->opt.token.empty()) {
    Writer w;
    w.u8(kHello);
    w.str(impl_->opt.token);
    impl_->call(w);
  }
}

TcpStoreClient::~TcpStoreClient() = default;

namespace {
void check_key(const std::string& key) {
  if (key.size() > kMaxStoreKey) {
    throw InvalidArgument("store: a key of " + std::to_string(key.size()) + " bytes exceeds " +
                          std::to_string(kMaxStoreKey));
  }
}
}  // namespace

void TcpStoreClient::set(const std::string& key, const std::string& value) {
  check_key(key);
  Writer w;
  w.u8(kSet);
  w.str(key);
  w.str(value);
  impl_->call(w);
}

std::string TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  Writer w;
  w.u8(kGet);
  w.str(key);
  auto [status, payload] = impl_->call(w);
  if (status == kNotFound) throw NotFound("store: key '" + key + "' was removed while it was read");
  return impl_->parse(payload, "get", [](Reader& r) { return r.str(kMaxStoreFrame); });
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Writer w;
  w.u8(kWait);
  w.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& k : keys) {
    check_key(k);
    w.str(k);
  }
  w.i64(timeout.count());
  auto [status, payload] = impl_->call(w, timeout);
  if (status == kTimeout) {
    const std::string names = impl_->parse(payload, "wait", [](Reader& r) {
      const uint32_t n = r.u32();
      std::string out;
      for (uint32_t i = 0; i < n; ++i) {
        const std::string k = r.str(kMaxStoreKey);
        if (i < 8) out += (i ? ", '" : "'") + k + "'";
      }
      return out;
    });
    throw DeadlineExceeded("store " + impl_->where() + ": waited " + std::to_string(timeout.count()) +
                           " ms for keys " + names);
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  check_key(key);
  Writer w;
  w.u8(kAdd);
  w.str(key);
  w.i64(delta);
  auto [status, payload] = impl_->call(w);
  return impl_->parse(payload, "add", [](Reader& r) { return r.i64(); });
}

std::string TcpStoreClient::compare_set(const std::string& key, const std::string& expected,
                                        const std::string& desired) {
  check_key(key);
  Writer w;
  w.u8(kCompareSet);
  w.str(key);
  w.str(expected);
  w.str(desired);
  auto [status, payload] = impl_->call(w);
  return impl_->parse(payload, "compare_set", [](Reader& r) { return r.str(kMaxStoreFrame); });
}

void TcpStoreClient::set_will(const std::string& key, const std::string& value) {
  check_key(key);
  if (key.empty()) throw InvalidArgument("store will: the key is empty");
  if (value.size() > kMaxStoreKey) {
    throw InvalidArgument("store will: a value of " + std::to_string(value.size()) + " bytes exceeds " +
                          std::to_string(kMaxStoreKey));
  }
  Writer w;
  w.u8(kWill);
  w.str(key);
  w.str(value);
  impl_->call(w);
}

void TcpStoreClient::clear_will() {
  Writer w;
  w.u8(kWill);
  w.str("");
  w.str("");
  impl_->call(w);
}

bool TcpStoreClient::remove(const std::string& key) {
  check_key(key);
  Writer w;
  w.u8(kRemove);
  w.str(key);
  auto [status, payload] = impl_->call(w);
  return impl_->parse(payload, "remove", [](Reader& r) { return r.u8() != 0; });
}

}  // namespace meshsim
