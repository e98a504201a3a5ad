// torch_store_peer: meshsim's TorchStoreClient driven from the command line, so a Python test
// can put it opposite a real torch.distributed.TCPStore.
//
//   torch_store_peer HOST PORT OP [ARGS...] [; OP [ARGS...]]...
//
// OPs (one connection for the whole list, run in order; each prints one line):
//   probe                      -> the protocol at HOST:PORT (meshsim, torch-1.13, torch-2)
//   set KEY VALUE              -> ok
//   get KEY TIMEOUT_MS         -> the value
//   wait KEY TIMEOUT_MS        -> ok
//   add KEY DELTA              -> the new value
//   cas KEY EXPECTED DESIRED   -> the value after the call ("-" stands for an empty string)
//   check KEY                  -> ready | not-ready
//   del KEY                    -> 1 | 0
//   numkeys                    -> the count
//   protocol                   -> the protocol this connection speaks
// An op's error prints "error <Class>: <message>" and the next op runs; the exit status is then 1.
// MESHSIM_TORCH_STORE_PROTOCOL=1.13|2 skips the probe; MESHSIM_REPLY_TIMEOUT_MS bounds answers.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/torch_store.hpp"

namespace {

std::string arg(const std::string& s) { return s == "-" ? "" : s; }

}  // namespace

int main(int argc, char** argv) {
  using namespace meshsim;
  using std::chrono::milliseconds;
  if (argc < 4) {
    std::cerr << "usage: torch_store_peer HOST PORT OP [ARGS...] [; OP [ARGS...]]...\n";
    return 2;
  }
  const std::string host = argv[1];
  std::vector<std::string> words(argv + 3, argv + argc);
  try {
    const auto port = static_cast<uint16_t>(std::stoi(argv[2]));
    if (words[0] == "probe") {
      std::cout << to_string(probe_store(host, port, milliseconds(5000))) << std::endl;
      return 0;
    }
    TorchStoreOptions opt{.host = host, .port = port};
    if (const char* p = std::getenv("MESHSIM_TORCH_STORE_PROTOCOL"))
      opt.protocol = parse_store_protocol(p);
    if (const char* t = std::getenv("MESHSIM_REPLY_TIMEOUT_MS"))
      opt.reply_timeout = milliseconds(std::stoll(t));
    opt.connect_timeout = milliseconds(5000);
    TorchStoreClient store(opt);
    std::size_t i = 0;
    int status = 0;
    auto next = [&]() -> std::string {
      if (i >= words.size()) throw InvalidArgument("torch_store_peer: missing an argument");
      return words[i++];
    };
    while (i < words.size()) {
      const std::string op = next();
      if (op == ";") continue;
      try {
        if (op == "set") {
          const std::string k = next(), v = arg(next());
          store.set(k, v);
          std::cout << "ok\n";
        } else if (op == "get") {
          const std::string k = next();
          std::cout << store.get(k, milliseconds(std::stoll(next()))) << "\n";
        } else if (op == "wait") {
          const std::string k = next();
          store.wait({k}, milliseconds(std::stoll(next())));
          std::cout << "ok\n";
        } else if (op == "add") {
          const std::string k = next();
          std::cout << store.add(k, std::stoll(next())) << "\n";
        } else if (op == "cas") {
          const std::string k = next(), e = arg(next()), d = arg(next());
          const std::string now = store.compare_set(k, e, d);
          std::cout << (now.empty() ? "-" : now) << "\n";
        } else if (op == "check") {
          std::cout << (store.check({next()}) ? "ready" : "not-ready") << "\n";
        } else if (op == "del") {
          std::cout << (store.remove(next()) ? 1 : 0) << "\n";
        } else if (op == "numkeys") {
          std::cout << store.num_keys() << "\n";
        } else if (op == "protocol") {
          std::cout << to_string(store.protocol()) << "\n";
        } else {
          throw InvalidArgument("torch_store_peer: unknown op '" + op + "'");
        }
      } catch (const Error& e) {
        std::cout << "error " << e.type_name() << ": " << e.what() << "\n";
        status = 1;
        while (i < words.size() && words[i] != ";") ++i;  // skip the failed op's arguments
      }
      std::cout.flush();
    }
    return status;
  } catch (const Error& e) {
    std::cout << "error " << e.type_name() << ": " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cout << "error std: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
