// meshsim/torch_store.hpp — a client of PyTorch's TCPStore (`torch.distributed.TCPStore`, the
// store torchrun's agent serves its workers at MASTER_ADDR:MASTER_PORT) behind meshsim's Store.
//
//   TorchStoreClient store({.host = "127.0.0.1", .port = 29500});   // probes the protocol
//   store.set("k", "v");
//   store.get("k", std::chrono::seconds(5)) == "v"
//   store.protocol() == StoreProtocol::kTorch2   // or kTorch113
//
// Protocols: PyTorch 1.13 (Debian 12's python3-torch: query codes SET=0 .. DELETE_KEY=8, no
// handshake) and 2.x from the VALIDATE handshake on (2.1+: VALIDATE=0, SET=1 .. GETNUMKEYS=7,
// DELETE_KEY=8, CANCEL_WAIT=12, PING=13; the libuv server, the default since 2.4, and the legacy
// one). Integers are little-endian, strings a u64 length then bytes, no frame header.
//
// Telling them apart (probe_store): one write of VALIDATE + magic + PING + nonce, the only probe
// that is safe against every server. A 2.x server echoes the nonce; a 1.13 server reads the bytes
// as a SET whose key length is over 2^56, fails to allocate it and closes the connection at once;
// meshsim's own store answers an error frame (its 4-byte length header is out of range); anything
// else, or silence past the deadline, is Unavailable naming the address.
// MESHSIM_TORCH_STORE_PROTOCOL (parse_store_protocol: "1.13" or "2") skips the probe; a wrong
// choice ends in an error naming the server (a 1.13 server closes on the handshake; a 2.x server
// never answers a 1.13 query and the reply deadline passes), never a hang.
//
// Semantics are meshsim's Store contract, with these mappings:
// - get/wait with a timeout: WAIT, then GET. A zero timeout is CHECK (no wait). On a 2.x server an
//   expired wait is cancelled (CANCEL_WAIT); on 1.13, which cannot cancel one, the connection is
//   dropped and the next call reconnects (else the server's late STOP_WAITING byte would be read
//   as the answer to the next query).
// - compare_set on an absent key with a non-empty `expected`: PyTorch answers `expected` without
//   storing anything; this client returns "" (the value after the call), as every meshsim store.
// - add on a value that is not an integer: PyTorch's server closes the connection; this client
//   reports InvalidArgument naming the key and the server, and reconnects on the next call.
// Every reply has a deadline (reply_timeout; a wait's own timeout plus reply_timeout); a server
// that closes, resets or goes silent is Unavailable / DeadlineExceeded naming host:port.
//
// Thread safety: one connection; requests from several threads are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshsim/store.hpp"

namespace meshsim {

// StoreProtocol is what a store server speaks.
enum class StoreProtocol { kMeshsim, kTorch113, kTorch2 };

// to_string names a protocol as users spell it: "meshsim", "torch-1.13", "torch-2".
std::string to_string(StoreProtocol p);

// parse_store_protocol reads MESHSIM_TORCH_STORE_PROTOCOL's value: "1.13" or "2" (InvalidArgument
// naming the value otherwise).
StoreProtocol parse_store_protocol(const std::string& text);

// probe_store connects to host:port (retrying a refused connection until `timeout`) and says which
// protocol answers there; Unavailable naming the address when none does within `timeout`.
StoreProtocol probe_store(const std::string& host, uint16_t port,
                          std::chrono::milliseconds timeout);

struct TorchStoreOptions {
  std::string host = "127.0.0.1";  // an IP address or a host name
  uint16_t port = 0;
  std::optional<StoreProtocol> protocol;             // kTorch113 or kTorch2; nullopt: probe
  std::chrono::milliseconds connect_timeout{10000};  // retry a refused connection until then
  std::chrono::milliseconds reply_timeout{30000};    // each answer from the server
};

// TorchStoreClient: one connection to a PyTorch TCPStore server.
class TorchStoreClient final : public Store {
 public:
  explicit TorchStoreClient(TorchStoreOptions options);
  ~TorchStoreClient() override;
  TorchStoreClient(const TorchStoreClient&) = delete;
  TorchStoreClient& operator=(const TorchStoreClient&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool remove(const std::string& key) override;

  // check says whether every key exists now (PyTorch's CHECK).
  bool check(const std::vector<std::string>& keys);
  // num_keys is the server's key count: every client's keys, torchrun's own included.
  int64_t num_keys();
  // protocol is the protocol spoken (probed or given).
  StoreProtocol protocol() const;
  // address is "host:port".
  std::string address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshsim
