// meshsim/inline_vector.hpp — InlineVector<T, N>: a vector of trivially copyable T that keeps up
// to N elements inline and spills to the heap beyond. The storage of IntTuple and of the flat
// leaf arrays the algebra computes on.
//
// Why not boost::container::small_vector: measured on the algebra's hot path (callgrind, -O2),
// its push_back / resize / assign are out-of-line calls of 30-60 instructions each and took
// over half of a coalesce; here every operation on the inline case is a few inline
// instructions (element values travel in registers, never as a whole-struct temporary reloaded
// from memory, which stalls on store forwarding).
//
//   InlineVector<int64_t, 8> v; v.push_back(3); v.append(p, p + n); v.size();
//
// Thread-safety: as std::vector. Elements are never value-initialised by resize_uninit.
#pragma once

#include <cstddef>
#include <cstring>
#include <iterator>
#include <new>
#include <initializer_list>
#include <type_traits>

namespace meshsim::detail {

template <typename T, std::size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>);
  static_assert(N > 0);

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  // User-provided on purpose: a defaulted constructor makes `InlineVector v{}` (and aggregate
  // members initialised with {}) zero the whole inline buffer first.
  InlineVector() noexcept {}  // NOLINT(modernize-use-equals-default)
  InlineVector(std::size_t n, T v) { resize(n, v); }
  InlineVector(std::initializer_list<T> l) { append(l.begin(), l.end()); }
  InlineVector(const InlineVector& o) { append(o.begin(), o.end()); }
  InlineVector(InlineVector&& o) noexcept { steal(o); }
  InlineVector& operator=(const InlineVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  InlineVector& operator=(InlineVector&& o) noexcept {
    if (this != &o) {
      release();
      steal(o);
    }
    return *this;
  }
  ~InlineVector() { release(); }

  T* data() { return heap_ ? heap_ : inline_data(); }
  const T* data() const { return heap_ ? heap_ : inline_data(); }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t capacity() const { return cap_; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  std::reverse_iterator<const T*> rbegin() const { return std::reverse_iterator<const T*>(end()); }
  std::reverse_iterator<const T*> rend() const { return std::reverse_iterator<const T*>(begin()); }
  T& operator[](std::size_t i) { return data()[i]; }
  const T& operator[](std::size_t i) const { return data()[i]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void clear() { size_ = 0; }
  void pop_back() { --size_; }
  // push_back takes the value by copy: it may alias an element that a growth would free.
  void push_back(T v) { *grow_by(1) = v; }
  // grow_by appends n uninitialised elements and returns the first.
  [[gnu::always_inline]] T* grow_by(std::size_t n) {
    if (cap_ - size_ < n) reserve_more(n);
    T* p = data() + size_;
    size_ += n;
    return p;
  }
  // append copies [first, last), which must not alias this vector.
  void append(const T* first, const T* last) {
    const auto n = static_cast<std::size_t>(last - first);
    if (n) std::memcpy(static_cast<void*>(grow_by(n)), first, n * sizeof(T));
  }
  void assign(const T* first, const T* last) {
    clear();
    append(first, last);
  }
  void assign(std::size_t n, T v) {
    clear();
    resize(n, v);
  }
  void resize(std::size_t n, T v) {
    if (n <= size_) {
      size_ = n;
      return;
    }
    const std::size_t old = size_;
    T* p = grow_by(n - old);
    for (std::size_t i = 0; i < n - old; ++i) p[i] = v;
  }
  void resize_uninit(std::size_t n) {
    if (n <= size_) {
      size_ = n;
    } else {
      grow_by(n - size_);
    }
  }

 private:
  T* inline_data() { return std::launder(reinterpret_cast<T*>(buf_)); }
  const T* inline_data() const { return std::launder(reinterpret_cast<const T*>(buf_)); }

  void reserve_more(std::size_t n) {
    std::size_t cap = cap_ * 2;
    if (cap < size_ + n) cap = size_ + n;
    T* p = static_cast<T*>(::operator new(cap * sizeof(T)));
    if (size_) std::memcpy(static_cast<void*>(p), data(), size_ * sizeof(T));
    release();
    heap_ = p;
    cap_ = cap;
  }
  void release() {
    if (heap_) ::operator delete(heap_);
    heap_ = nullptr;
    cap_ = N;
  }
  // steal takes o's elements (its heap block, or a copy of its inline ones) and empties o.
  void steal(InlineVector& o) {
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      size_ = o.size_;
      o.heap_ = nullptr;
      o.cap_ = N;
    } else {
      size_ = o.size_;
      if (size_) std::memcpy(buf_, o.buf_, size_ * sizeof(T));
    }
    o.size_ = 0;
  }

  T* heap_ = nullptr;
  std::size_t size_ = 0;
  std::size_t cap_ = N;
  alignas(T) unsigned char buf_[N * sizeof(T)];
};

}  // namespace meshsim::detail
