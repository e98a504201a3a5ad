// meshsim/digest.hpp — the one stable 64-bit digest meshsim keys things with across processes
// (a group config's fingerprint, a mesh's parts, a group's store keys): FNV-1a over a byte
// stream in which every value is fixed-width or length-prefixed, so different sequences of
// fields never make the same stream.
//
//   Fnv1a f;
//   f.str("tp");
//   f.u64(4);
//   uint64_t key = f.value();
//
// Thread safety: a plain value.
#pragma once

#include <cstdint>
#include <string_view>

namespace meshsim {

class Fnv1a {
 public:
  void byte(unsigned char b) {
    h_ ^= b;
    h_ *= 0x100000001b3ULL;
  }
  // u64 adds 8 bytes, least significant first.
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
  }
  // str adds the length (u64), then the bytes.
  void str(std::string_view s) {
    u64(s.size());
    for (char c : s) byte(static_cast<unsigned char>(c));
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

}  // namespace meshsim
