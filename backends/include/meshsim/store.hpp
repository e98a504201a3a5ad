// meshsim/store.hpp — rendezvous stores: a key-value store ranks meet through (Gloo addresses,
// NCCL unique ids, launch bookkeeping). In-process for rank threads, TCP for processes and hosts.
//
//   TcpStoreServer server({.host = "127.0.0.1", .port = 0});      // port 0: any free port
//   TcpStoreClient a({.host = "127.0.0.1", .port = server.port()});
//   a.set("rank_0", "addr");
//   TcpStoreClient b({.host = "127.0.0.1", .port = server.port()});
//   b.get("rank_0", std::chrono::seconds(5)) == "addr"          // waits for the key
//   b.add("arrived", 1);                                       // a counter, returns the new value
//
// Semantics (every store): set overwrites; get waits until the key exists or the deadline passes
// (DeadlineExceeded naming the key); wait waits for every key (DeadlineExceeded naming the
// missing ones); add treats the value as a decimal int64 (absent = 0) and returns the sum
// (InvalidArgument when the value is not an integer, OverflowError past int64); compare_set
// writes `desired` when the current value equals `expected` (an absent key matches an empty
// `expected`) and returns the value after the call; remove returns whether the key existed.
//
// The TCP protocol: length-prefixed binary frames (u32 little-endian body length, then an op
// byte and length-prefixed fields), at most kMaxStoreFrame bytes; keys at most kMaxStoreKey
// bytes. The server binds loopback unless told otherwise, may require a shared token (the first
// frame of a connection), caps connections, keys and stored bytes, and drops a connection that
// sends a malformed, truncated or oversized frame, answering it with an error first when it can.
// Nothing a client sends crashes the server or grows its memory past those caps. A client sees a
// lost connection (server gone or restarted) or a malformed answer as meshsim::Unavailable, and a
// server silent past its deadline (connect_timeout, reply_timeout) as DeadlineExceeded, each
// naming the address; a client connects by host name or address.
//
// Thread safety: every store may be used from many threads (a client serialises its requests).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace meshsim {

inline constexpr std::size_t kMaxStoreFrame = std::size_t{1} << 20;  // 1 MiB
inline constexpr std::size_t kMaxStoreKey = std::size_t{4} << 10;    // 4 KiB

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  virtual bool remove(const std::string& key) = 0;
};

// InProcessStore: a map under a mutex; waiters sleep on a condition variable.
class InProcessStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

// PrefixStore puts every key of `base` under "prefix/" (one namespace per group or job).
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";  // the address to bind (server) or reach (client)
  uint16_t port = 0;               // server: 0 picks a free port
  std::string token;               // shared secret; empty: none
  std::size_t max_connections = 1024;
  std::size_t max_keys = 1 << 20;
  std::size_t max_bytes = std::size_t{256} << 20;  // keys plus values held
  std::chrono::milliseconds connect_timeout{10000};  // client: retry until then
  // server: a frame must arrive whole within this time once its header has (a client that
  // stalls mid-frame is dropped, so it cannot hold a connection slot and a buffer forever); and,
  // with a token, the token must arrive within this time of connecting.
  std::chrono::milliseconds frame_timeout{10000};
  // client: each answer must arrive within this time (a wait's: its own timeout plus this);
  // a silent server is DeadlineExceeded naming it, never a hang.
  std::chrono::milliseconds reply_timeout{30000};
};

// TcpStoreServer serves the store on its own thread until destroyed (or stop()).
class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  uint16_t port() const;
  std::string address() const;  // "host:port"
  void stop();
  // connections is the number of open client connections (for tests and monitoring).
  std::size_t connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// TcpStoreClient: one connection to a TcpStoreServer.
class TcpStoreClient final : public Store {
 public:
  explicit TcpStoreClient(TcpStoreOptions options);
  ~TcpStoreClient() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;

  // set_will asks the server to set `key` to `value` (each at most kMaxStoreKey bytes) when this
  // connection drops before clear_will — how the peers of a process that crashed or was killed
  // learn which rank it was. One will per connection; a new one replaces the old. A server
  // stopping does not publish wills.
  void set_will(const std::string& key, const std::string& value);
  void clear_will();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshsim
