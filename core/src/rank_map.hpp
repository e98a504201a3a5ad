// rank_map.hpp (core-private) — the root's global ranks by rank-map position.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace meshsim {

// RankMap holds the root's global ranks by position: an affine run (start + p) stored in O(1),
// or an explicit list with an inverse index (dense when the ranks are compact, sorted otherwise).
// Immutable once built; safe to read from many threads.
class RankMap {
 public:
  // affine is the run start, start+1, ..., start+n-1.
  static RankMap affine(int64_t start, int64_t n);
  // explicit_ranks checks the ranks (>= 0, below `world` when given, distinct: InvalidArgument /
  // OutOfRange naming the rank and its position) and keeps a contiguous run in O(1).
  static RankMap explicit_ranks(std::span<const int64_t> ranks, std::optional<int64_t> world);

  int64_t size() const { return n_; }
  // start is the first rank of an affine map; nullopt for an explicit one.
  std::optional<int64_t> start() const {
    return values_.empty() ? std::optional<int64_t>(start_) : std::nullopt;
  }
  // at is the rank at position p (0 <= p < size()).
  int64_t at(int64_t p) const {
    return values_.empty() ? start_ + p : values_[static_cast<std::size_t>(p)];
  }
  // position is where `rank` sits, or nullopt when it is not in the map.
  std::optional<int64_t> position(int64_t rank) const;
  friend bool operator==(const RankMap& a, const RankMap& b);

 private:
  int64_t start_ = 0;
  int64_t n_ = 0;
  std::vector<int64_t> values_;
  int64_t dense_lo_ = 0;
  std::vector<int64_t> dense_;
  std::vector<std::pair<int64_t, int64_t>> sorted_;
};

}  // namespace meshsim
