#include "rank_map.hpp"

#include <algorithm>
#include <string>

#include "meshsim/error.hpp"

namespace meshsim {

RankMap RankMap::affine(int64_t start, int64_t n) {
  RankMap m;
  m.start_ = start;
  m.n_ = n;
  return m;
}

RankMap RankMap::explicit_ranks(std::span<const int64_t> ranks, std::optional<int64_t> world) {
  const auto n = static_cast<int64_t>(ranks.size());
  int64_t lo = INT64_MAX;
  int64_t hi = -1;
  bool run = true;
  for (std::size_t p = 0; p < ranks.size(); ++p) {
    const int64_t r = ranks[p];
    if (r < 0) {
      throw InvalidArgument("rank " + std::to_string(r) + " at mesh position " +
                            std::to_string(p) + " is negative: global ranks must be >= 0");
    }
    if (world && r >= *world) {
      throw OutOfRange("rank " + std::to_string(r) + " at mesh position " + std::to_string(p) +
                       " is out of range [0, " + std::to_string(*world) + ") of the world size");
    }
    lo = std::min(lo, r);
    hi = std::max(hi, r);
    if (p > 0 && (ranks[p - 1] == INT64_MAX || r != ranks[p - 1] + 1)) run = false;
  }
  if (run) return affine(ranks.empty() ? 0 : ranks[0], n);
  RankMap m;
  m.n_ = n;
  m.values_.assign(ranks.begin(), ranks.end());
  auto duplicate = [&](int64_t r) {
    return InvalidArgument("rank " + std::to_string(r) +
                           " appears twice in the mesh (PyTorch finds it later: "
                           "rank_coords.size(0) must be 0 or 1, got 2)");
  };
  if (hi - lo < 4 * n + 1024) {
    m.dense_lo_ = lo;
    m.dense_.assign(static_cast<std::size_t>(hi - lo + 1), -1);
    for (int64_t p = 0; p < n; ++p) {
      int64_t& slot = m.dense_[static_cast<std::size_t>(ranks[p] - lo)];
      if (slot >= 0) throw duplicate(ranks[p]);
      slot = p;
    }
  } else {
    m.sorted_.reserve(ranks.size());
    for (int64_t p = 0; p < n; ++p) m.sorted_.emplace_back(ranks[p], p);
    std::sort(m.sorted_.begin(), m.sorted_.end());
    for (std::size_t i = 1; i < m.sorted_.size(); ++i) {
      if (m.sorted_[i].first == m.sorted_[i - 1].first) throw duplicate(m.sorted_[i].first);
    }
  }
  return m;
}

std::optional<int64_t> RankMap::position(int64_t rank) const {
  if (values_.empty()) {
    if (rank < start_ || rank - start_ >= n_) return std::nullopt;
    return rank - start_;
  }
  if (!dense_.empty()) {
    if (rank < dense_lo_ || rank - dense_lo_ >= static_cast<int64_t>(dense_.size())) {
      return std::nullopt;
    }
    const int64_t p = dense_[static_cast<std::size_t>(rank - dense_lo_)];
    return p < 0 ? std::nullopt : std::optional<int64_t>(p);
  }
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), std::make_pair(rank, int64_t{0}));
  if (it == sorted_.end() || it->first != rank) return std::nullopt;
  return it->second;
}

bool operator==(const RankMap& a, const RankMap& b) {
  if (a.n_ != b.n_) return false;
  if (a.values_.empty() && b.values_.empty()) return a.start_ == b.start_;
  for (int64_t p = 0; p < a.n_; ++p) {
    if (a.at(p) != b.at(p)) return false;
  }
  return true;
}

}  // namespace meshsim
