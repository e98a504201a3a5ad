// alloc_counter.hpp — counts heap allocations and bytes by replacing global operator new.
// Include it in exactly one translation unit of a benchmark binary.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

namespace meshsim::bench {
inline std::atomic<long> g_allocs{0};
inline std::atomic<long> g_bytes{0};
}  // namespace meshsim::bench

void* operator new(std::size_t n) {
  meshsim::bench::g_allocs.fetch_add(1, std::memory_order_relaxed);
  meshsim::bench::g_bytes.fetch_add(static_cast<long>(n), std::memory_order_relaxed);
  if (void* p = std::malloc(n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
