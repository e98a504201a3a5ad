#include "meshsim/rank_text.hpp"

#include <algorithm>

namespace meshsim {

std::string format_ranks(std::span<const int64_t> ranks, std::size_t limit, std::optional<int64_t> total) {
  const int64_t n = std::max(total.value_or(0), static_cast<int64_t>(ranks.size()));
  std::string s = "[";
  std::size_t shown = 0;
  for (; shown < ranks.size() && shown < limit; ++shown) s += (shown ? ", " : "") + std::to_string(ranks[shown]);
  if (n > static_cast<int64_t>(shown)) s += ", ... (" + std::to_string(n) + " ranks)";
  return s + "]";
}

std::string format_rank_runs(const std::vector<int64_t>& r, std::size_t max_runs) {
  // A strided group (a DP group of a TP x DP mesh, say): its ends and its stride.
  if (r.size() >= 6 && r[1] - r[0] > 1) {
    const int64_t step = r[1] - r[0];
    bool even = true;
    for (std::size_t k = 2; k < r.size() && even; ++k) even = r[k] - r[k - 1] == step;
    if (even) {
      return std::to_string(r[0]) + "," + std::to_string(r[1]) + ",...," + std::to_string(r.back()) + " (" +
             std::to_string(r.size()) + " ranks, stride " + std::to_string(step) + ")";
    }
  }
  std::string out;
  std::size_t runs = 0;
  for (std::size_t i = 0; i < r.size();) {
    std::size_t j = i;
    while (j + 1 < r.size() && r[j + 1] == r[j] + 1) ++j;
    if (runs == max_runs) {
      out += ",... (" + std::to_string(r.size()) + " ranks)";
      return out;
    }
    if (!out.empty()) out += ',';
    out += std::to_string(r[i]);
    if (j > i) out += "-" + std::to_string(r[j]);
    ++runs;
    i = j + 1;
  }
  return out;
}

}  // namespace meshsim
