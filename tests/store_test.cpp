// Rendezvous stores: the in-process and TCP stores keep the same semantics; the TCP server
// survives malformed, truncated and oversized frames, dropped clients, a wrong token and many
// concurrent clients, and a client sees a stopped server as Unavailable.
#include "meshsim/store.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "meshsim/error.hpp"
#include "meshsim/launch_env.hpp"

namespace meshsim {
namespace {

using namespace std::chrono_literals;

// The semantics every store shares.
void check_semantics(Store& s, Store& other) {
  s.set("a", "1");
  EXPECT_EQ(other.get("a", 1s), "1");
  s.set("a", "2");
  EXPECT_EQ(other.get("a", 1s), "2");
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(other.add("n", -7), -2);
  EXPECT_THROW(s.add("a", INT64_MAX), OverflowError);
  s.set("text", "x1");
  EXPECT_THROW(s.add("text", 1), InvalidArgument);
  EXPECT_EQ(s.compare_set("c", "", "first"), "first");     // absent matches ""
  EXPECT_EQ(s.compare_set("c", "nope", "second"), "first");  // mismatch: unchanged
  EXPECT_EQ(s.compare_set("c", "first", "second"), "second");
  EXPECT_EQ(s.compare_set("absent", "x", "y"), "");
  EXPECT_TRUE(s.remove("c"));
  EXPECT_FALSE(s.remove("c"));
  try {
    s.wait({"a", "never", "nor"}, 50ms);
    ADD_FAILURE() << "wait must time out";
  } catch (const DeadlineExceeded& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("'a'"), std::string::npos) << e.what();
  }
  // A waiter is released by a later set from elsewhere.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    other.set("late", "v");
  });
  EXPECT_EQ(s.get("late", 5s), "v");
  setter.join();
  // Binary values round-trip.
  const std::string bin("\0\xff\n\x01", 4);
  s.set("bin", bin);
  EXPECT_EQ(other.get("bin", 1s), bin);
}

TEST(Store, InProcessAndPrefixSemantics) {
  auto base = std::make_shared<InProcessStore>();
  check_semantics(*base, *base);
  PrefixStore p(std::string("group1"), base), q(std::string("group1"), base), r(std::string("group2"), base);
  p.set("k", "v");
  EXPECT_EQ(q.get("k", 1s), "v");
  EXPECT_EQ(base->get("group1/k", 1s), "v");
  EXPECT_THROW(r.get("k", 20ms), DeadlineExceeded);
}

TEST(TcpStore, SameSemanticsOverTcp) {
  TcpStoreServer server({});
  EXPECT_EQ(server.address(), "127.0.0.1:" + std::to_string(server.port()));
  TcpStoreClient a({.port = server.port()}), b({.port = server.port()});
  check_semantics(a, b);
  EXPECT_THROW(a.set(std::string(kMaxStoreKey + 1, 'k'), "v"), InvalidArgument);
  EXPECT_THROW(a.set("big", std::string(kMaxStoreFrame, 'v')), InvalidArgument);
}

// raw opens a plain socket to the server, for frames no client would send.
int raw(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// reply reads what the server sends until it closes (or 5 s pass).
std::string reply(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  return out;
}

std::string frame(const std::string& body) {
  std::string f(4, '\0');
  const auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) f[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return f + body;
}

TEST(TcpStore, AWillIsPublishedWhenItsConnectionDropsAndNotWhenCleared) {
  TcpStoreServer server({});
  TcpStoreClient watcher({.port = server.port()});
  {
    TcpStoreClient doomed({.port = server.port()});
    doomed.set_will("exit/3", "gone");
    doomed.set_will("exit/2", "gone too");  // replaces the first
    EXPECT_THROW(doomed.get("exit/2", std::chrono::milliseconds(0)), DeadlineExceeded);
  }  // the connection drops, as when a process dies
  EXPECT_EQ(watcher.get("exit/2", std::chrono::seconds(5)), "gone too");
  EXPECT_THROW(watcher.get("exit/3", std::chrono::milliseconds(50)), DeadlineExceeded);
  {
    TcpStoreClient tidy({.port = server.port()});
    tidy.set_will("exit/5", "gone");
    tidy.clear_will();
  }
  EXPECT_THROW(watcher.get("exit/5", std::chrono::milliseconds(300)), DeadlineExceeded);
  EXPECT_THROW(watcher.set_will("", "x"), InvalidArgument);
  EXPECT_THROW(watcher.set_will("k", std::string(kMaxStoreKey + 1, 'v')), InvalidArgument);
}

TEST(TcpStore, HostileFramesAreAnsweredAndDroppedWithoutHarm) {
  TcpStoreServer server({});
  TcpStoreClient good({.port = server.port()});
  good.set("kept", "yes");
  const std::vector<std::pair<std::string, std::string>> cases{
      {"oversized length", std::string("\xff\xff\xff\x7f", 4)},
      {"zero length", std::string("\0\0\0\0", 4)},
      {"unknown op", frame(std::string("\x63", 1))},
      {"field past the body", frame(std::string("\x02\xff\xff\xff\xff", 5))},
      {"trailing bytes", frame(std::string("\x03\x01\0\0\0k\x00", 7))},
      {"garbage", std::string("GET kept HTTP/1.1\r\n\r\n")},
  };
  for (const auto& [what, bytes] : cases) {
    const int fd = raw(server.port());
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size())) << what;
    const std::string r = reply(fd);  // an error answer, then the server closes the connection
    ::close(fd);
    ASSERT_GE(r.size(), 5u) << what;
    EXPECT_EQ(static_cast<uint8_t>(r[4]), 3u) << what;  // kError
  }
  // Truncated frames and clients that vanish mid-request.
  for (const std::string partial : {std::string("\x10\0\0\0\x02", 5), std::string("\x05", 1)}) {
    const int fd = raw(server.port());
    ::send(fd, partial.data(), partial.size(), 0);
    ::close(fd);
  }
  // The server still serves, and nothing leaked a connection.
  EXPECT_EQ(good.get("kept", 1s), "yes");
  for (int i = 0; i < 100 && server.connections() > 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.connections(), 1u);
}

TEST(TcpStore, AClientStalledMidFrameIsDropped) {
  TcpStoreServer server({.frame_timeout = 200ms});
  const int fd = raw(server.port());
  const std::string partial("\x64\0\0\0\x02\x01\0\0\0", 9);  // claims 100 bytes, sends 5
  ASSERT_EQ(::send(fd, partial.data(), partial.size(), 0), static_cast<ssize_t>(partial.size()));
  for (int i = 0; i < 100 && server.connections() == 0; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(server.connections(), 1u);
  // The client keeps its end open; the server drops the connection after frame_timeout.
  for (int i = 0; i < 200 && server.connections() > 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.connections(), 0u);
  EXPECT_EQ(reply(fd), "");  // closed without an answer
  ::close(fd);
  TcpStoreClient ok({.port = server.port()});
  ok.set("still", "serving");
  EXPECT_EQ(ok.get("still", 1s), "serving");
}

// rss_kib is this process's resident memory (the server runs in it).
int64_t rss_kib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

TEST(TcpStore, HeadersThatClaimLargeBodiesHoldNoMemoryUntilTheBytesCome) {
  // 300 connections each claim a 1 MiB frame and send 5 bytes of it: the server must not hold
  // 300 MiB for them (it allocated and zeroed each claimed body when its header arrived).
  TcpStoreServer server({.frame_timeout = 5s});
  const int64_t before = rss_kib();
  std::vector<int> fds;
  const std::string head("\x00\x00\x10\x00\x02\x01\x00\x00\x00", 9);  // 1 MiB claimed
  for (int i = 0; i < 300; ++i) {
    fds.push_back(raw(server.port()));
    ASSERT_EQ(::send(fds.back(), head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
  }
  for (int i = 0; i < 200 && server.connections() < fds.size(); ++i) std::this_thread::sleep_for(5ms);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(server.connections(), fds.size());
  // Under ThreadSanitizer every byte has shadow memory too: the bound leaves room for it.
  EXPECT_LT(rss_kib() - before, 48 * 1024) << "KiB held for bodies not sent";
  for (int fd : fds) ::close(fd);
  TcpStoreClient ok({.port = server.port()});
  ok.set("still", "serving");
  EXPECT_EQ(ok.get("still", 1s), "serving");
}

TEST(TcpStore, TokenIsRequired) {
  TcpStoreServer server({.token = "s3cret"});
  TcpStoreClient ok({.port = server.port(), .token = "s3cret"});
  ok.set("k", "v");
  EXPECT_THROW(TcpStoreClient({.port = server.port(), .token = "wrong"}), FailedPrecondition);
  TcpStoreClient none({.port = server.port()});
  EXPECT_THROW(none.get("k", 1s), FailedPrecondition);
  EXPECT_EQ(ok.get("k", 1s), "v");
}

TEST(TcpStore, WithATokenASilentConnectionIsDroppedAndAnIdleClientIsNot) {
  TcpStoreServer server({.token = "s3cret", .frame_timeout = 200ms});
  TcpStoreClient idle({.port = server.port(), .token = "s3cret"});  // presents its token at once
  const int fd = raw(server.port());                                // sends nothing at all
  for (int i = 0; i < 100 && server.connections() < 2; ++i) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(server.connections(), 2u);
  // The silent connection goes after frame_timeout; the client that presented its token stays,
  // however long it idles.
  for (int i = 0; i < 200 && server.connections() > 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server.connections(), 1u);
  EXPECT_EQ(reply(fd), "");  // closed without an answer
  ::close(fd);
  std::this_thread::sleep_for(300ms);
  idle.set("k", "v");
  EXPECT_EQ(idle.get("k", 1s), "v");
  EXPECT_EQ(server.connections(), 1u);
}

TEST(TcpStore, ManyConcurrentClientsAddExactly) {
  TcpStoreServer server({});
  std::vector<std::thread> ts;
  std::atomic<int> failures{0};
  for (int c = 0; c < 256; ++c) {
    ts.emplace_back([&, c] {
      try {
        TcpStoreClient cl({.port = server.port()});
        for (int i = 0; i < 20; ++i) cl.add("counter", 1);
        cl.set("done/" + std::to_string(c), "1");
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(failures.load(), 0);
  TcpStoreClient check({.port = server.port()});
  EXPECT_EQ(check.add("counter", 0), 256 * 20);
  std::vector<std::string> keys;
  for (int c = 0; c < 256; ++c) keys.push_back("done/" + std::to_string(c));
  EXPECT_NO_THROW(check.wait(keys, 1s));
}

TEST(TcpStore, LimitsHoldAgainstAFloodOfData) {
  TcpStoreServer server({.max_connections = 4, .max_keys = 100, .max_bytes = 64 << 10});
  TcpStoreClient a({.port = server.port()});
  EXPECT_THROW(a.set("big", std::string(100 << 10, 'x')), ResourceExhausted);
  for (int i = 0; i < 100; ++i) a.set("k" + std::to_string(i), "v");
  EXPECT_THROW(a.set("one-too-many", "v"), ResourceExhausted);
  EXPECT_TRUE(a.remove("k0"));
  EXPECT_NO_THROW(a.set("one-too-many", "v"));
  // Past the connection cap a client is refused, not queued.
  std::vector<std::unique_ptr<TcpStoreClient>> more;
  for (int i = 0; i < 3; ++i) more.push_back(std::make_unique<TcpStoreClient>(TcpStoreOptions{.port = server.port()}));
  TcpStoreClient over({.port = server.port()});
  try {
    over.set("x", "y");
    ADD_FAILURE() << "a connection past the cap must be refused";
  } catch (const ResourceExhausted& e) {  // the server's answer, read before it closed
    EXPECT_NE(std::string(e.what()).find("limit of 4 connections"), std::string::npos) << e.what();
  } catch (const Unavailable&) {  // or the close, when it came first
  }
}

TEST(TcpStore, AStoppedServerIsUnavailableNotAHang) {
  auto server = std::make_unique<TcpStoreServer>(TcpStoreOptions{});
  const uint16_t port = server->port();
  TcpStoreClient c({.port = port});
  c.set("k", "v");
  std::thread waiter([&] {
    TcpStoreClient w({.port = port});
    EXPECT_THROW(w.wait({"never"}, 30s), Unavailable);  // released by the stop, not the deadline
  });
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  server.reset();
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_THROW(c.get("k", 1s), Unavailable);
  EXPECT_THROW(c.set("k", "v"), Unavailable);
  // A server restarted on the same port: an old client stays failed; a new client works.
  TcpStoreServer again({.port = port});
  TcpStoreClient fresh({.port = port});
  fresh.set("k", "again");
  EXPECT_EQ(fresh.get("k", 1s), "again");
  EXPECT_THROW(TcpStoreClient({.port = 1, .connect_timeout = 100ms}), Unavailable);
  EXPECT_THROW(TcpStoreServer({.host = "not-an-ip"}), InvalidArgument);
}


// FakeServer accepts connections on loopback and answers each request's bytes with `answer`
// (nothing at all when it is empty and `close_after` is false): a store that is silent,
// speaks garbage or drops the connection.
class FakeServer {
 public:
  FakeServer(std::string answer, bool close_after) : answer_(std::move(answer)), close_after_(close_after) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        conns_.push_back(c);
        char buf[4096];
        if (::recv(c, buf, sizeof buf, 0) <= 0) continue;
        if (!answer_.empty()) (void)!::send(c, answer_.data(), answer_.size(), MSG_NOSIGNAL);
        if (close_after_) ::shutdown(c, SHUT_RDWR);
      }
    });
  }
  ~FakeServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (int c : conns_) ::close(c);
  }
  uint16_t port() const { return port_; }

 private:
  std::string answer_;
  bool close_after_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::vector<int> conns_;
};


template <class E, class F>
std::string expect_throw_within(F&& f, std::chrono::milliseconds bound) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const E& e) {
    EXPECT_LT(std::chrono::steady_clock::now() - t0, bound) << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "unexpected " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(TcpStoreClientFaults, ASilentServerEndsAtTheReplyDeadlineNamingItAndTheRequest) {
  FakeServer silent("", false);
  TcpStoreClient c({.port = silent.port(), .reply_timeout = 300ms});
  const std::string port = std::to_string(silent.port());
  std::string m = expect_throw_within<DeadlineExceeded>([&] { c.add("k", 1); }, 10s);
  EXPECT_NE(m.find("127.0.0.1:" + port), std::string::npos) << m;
  EXPECT_NE(m.find("no answer to add within 300 ms"), std::string::npos) << m;
  // A wait's deadline is its own timeout plus the reply deadline, not forever.
  TcpStoreClient w({.port = silent.port(), .reply_timeout = 300ms});
  m = expect_throw_within<DeadlineExceeded>([&] { w.wait({"k"}, 200ms); }, 10s);
  EXPECT_NE(m.find("within 500 ms"), std::string::npos) << m;
  // The stream is not trusted again: the next call fails at once.
  expect_throw_within<Unavailable>([&] { c.set("k", "v"); }, 1s);
  // With a token, the hello itself has the deadline.
  expect_throw_within<DeadlineExceeded>(
      [&] { TcpStoreClient({.port = silent.port(), .token = "t", .reply_timeout = 300ms}); }, 10s);
}

TEST(TcpStoreClientFaults, MalformedAnswersAreUnavailableNamingTheServer) {
  const std::vector<std::pair<std::string, std::string>> answers{
      {std::string(4, '\0'), "a frame of 0 bytes"},
      {frame("\x07"), "unknown status 7"},
      {frame(std::string("\x00\x01", 2)), "malformed answer to add"},  // ok, but 1 byte where 8 are due
      {std::string("\xff\xff\xff\x7f", 4), "a frame of 2147483647 bytes"},
  };
  for (const auto& [answer, needle] : answers) {
    FakeServer bad(answer, false);
    TcpStoreClient c({.port = bad.port(), .reply_timeout = 2s});
    const std::string m = expect_throw_within<Unavailable>([&] { c.add("k", 1); }, 5s);
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(bad.port())), std::string::npos) << m;
  }
}

TEST(TcpStoreClientFaults, AConnectionDroppedMidRequestIsUnavailable) {
  FakeServer dropper("", true);
  TcpStoreClient c({.port = dropper.port(), .reply_timeout = 5s});
  const std::string m = expect_throw_within<Unavailable>([&] { c.get("k", 10s); }, 4s);
  EXPECT_NE(m.find("connection lost during wait"), std::string::npos) << m;
}

TEST(TcpStoreClientFaults, AServerWhoseAcceptQueueIsFullEndsAtTheConnectDeadline) {
  // A listener that never accepts, its queue filled: the kernel drops further SYNs, as a
  // firewall would (a blocking connect waited about 130 s).
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 0), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const uint16_t port = ntohs(a.sin_port);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a);
    fillers.push_back(c);
  }
  std::this_thread::sleep_for(100ms);
  const std::string m = expect_throw_within<Error>(
      [&] { TcpStoreClient({.port = port, .connect_timeout = 1s, .reply_timeout = 1s}); }, 10s);
  EXPECT_NE(m.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << m;
  for (int c : fillers) ::close(c);
  ::close(fd);
}

TEST(TcpStoreClientFaults, HostNamesResolveAndAnUnknownOneIsRefusedAtOnce) {
  TcpStoreServer server({.host = "localhost"});  // binds what the name resolves to
  TcpStoreClient byname({.host = "localhost", .port = server.port()});
  byname.set("k", "v");
  EXPECT_EQ(byname.get("k", 1s), "v");
  const std::string m = expect_throw_within<Unavailable>(
      [&] { TcpStoreClient({.host = "no-such-host.invalid", .port = 1, .connect_timeout = 20s}); }, 15s);
  EXPECT_NE(m.find("'no-such-host.invalid'"), std::string::npos) << m;
}

using Env = std::map<std::string, std::string>;

std::optional<LaunchEnv> from(const Env& env) {
  return launch_env_from([&](const char* k) -> const char* {
    auto it = env.find(k);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchEnv, ReadsEachLaunchersVariables) {
  EXPECT_FALSE(from({}).has_value());
  auto m = from({{"MESHSIM_RANK", "3"}, {"MESHSIM_WORLD_SIZE", "8"}, {"MESHSIM_LOCAL_RANK", "1"},
                 {"MESHSIM_STORE", "10.0.0.1:29500"}, {"RANK", "0"}, {"WORLD_SIZE", "1"}});
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->launcher, "meshsim");
  EXPECT_EQ(m->rank, 3);
  EXPECT_EQ(m->world_size, 8);
  EXPECT_EQ(m->local_rank, 1);
  EXPECT_EQ(m->store_host, "10.0.0.1");
  EXPECT_EQ(m->store_port, 29500);
  auto t = from({{"RANK", "5"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "5"}, {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->launcher, "torchrun");
  EXPECT_EQ(t->rank, 5);
  EXPECT_EQ(t->store_host, "node0");
  EXPECT_EQ(t->store_port, 1234);
  auto o = from({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->launcher, "openmpi");
  EXPECT_EQ(o->world_size, 4);
  EXPECT_TRUE(o->store_host.empty());
}

TEST(LaunchEnv, ReadsTorchelasticsAgentStoreAttemptAndErrorFile) {
  auto t = from({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"GROUP_RANK", "1"},
                 {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                 {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_RUN_ID", "job7"},
                 {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"}});
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->launcher, "torchrun");
  EXPECT_EQ(t->node_rank, 1);
  EXPECT_TRUE(t->agent_store);
  EXPECT_EQ(t->restart_count, 2);
  EXPECT_EQ(t->run_id, "job7");
  EXPECT_EQ(t->error_file, "/tmp/x/error.json");
  auto standalone = from({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"}});
  ASSERT_TRUE(standalone.has_value());
  EXPECT_FALSE(standalone->agent_store);
}

TEST(LaunchEnv, ReadsSlurmsVariablesAfterTheOtherLaunchers) {
  const Env slurm{{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
                  {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}};
  auto s = from(slurm);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->launcher, "slurm");
  EXPECT_EQ(s->rank, 5);
  EXPECT_EQ(s->world_size, 8);
  EXPECT_EQ(s->local_rank, 1);
  EXPECT_EQ(s->node_rank, 2);
  EXPECT_EQ(s->store_host, "10.1.2.3");
  EXPECT_EQ(s->store_port, 29500);
  // torchrun or mpirun inside a Slurm allocation: their own variables win.
  Env both = slurm;
  both.insert({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(from(both)->launcher, "torchrun");
}

TEST(LaunchEnv, MalformedValuesNameTheVariable) {
  const std::vector<std::pair<Env, std::string>> bad{
      {{{"RANK", "1"}}, "WORLD_SIZE is unset"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x'"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is out of range [0, 1]"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK=-1"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999999999999"}}, "WORLD_SIZE='99999999999999999999'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0"},
      {{{"MESHSIM_RANK", "0"}, {"MESHSIM_WORLD_SIZE", "2"}, {"MESHSIM_STORE", "nohost"}}, "MESHSIM_STORE='nohost'"},
      {{{"MESHSIM_RANK", "0"}, {"MESHSIM_WORLD_SIZE", "2"}, {"MESHSIM_STORE", "h:70000"}}, "MESHSIM_STORE=70000"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}, "MASTER_PORT is unset"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}}, "MASTER_ADDR is unset"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "yes"}},
       "TORCHELASTIC_USE_AGENT_STORE='yes' is neither True nor False"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "-3"}}, "TORCHELASTIC_RESTART_COUNT=-3"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "two"}}, "GROUP_RANK='two'"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_NTASKS is unset"},
      {{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID=4 is out of range [0, 3]"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4x"}}, "SLURM_NTASKS='4x'"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "-1"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
       "SLURM_LOCALID=-1"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", ""}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
       "SLURM_NODEID=''"},
      {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}, "launched by srun (SLURM_PROCID=1, SLURM_NTASKS=4) but no store"},
  };
  for (const auto& [env, needle] : bad) {
    try {
      from(env);
      ADD_FAILURE() << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshsim
