// meshsim/rank_text.hpp — the house's one home for writing a set of ranks, in its two forms:
//
//   format_ranks({0, 1, 2, 3})                 == "[0, 1, 2, 3]"   (diagnoses, run, show)
//   format_ranks(first 64 of 1024, 2, 1024)    == "[0, 1, ... (1024 ranks)]"
//   format_rank_runs({0, 1, 2, 3, 5, 7, 8})    == "0-3,5,7-8"      (trace check)
//   format_rank_runs({5, 13, 21, 29, 37, 45})  == "5,13,...,45 (6 ranks, stride 8)"
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace meshsim {

// format_ranks lists `ranks` as "[a, b, c]", at most `limit` of them, then the count
// ("[0, 1, ... (64 ranks)]"); `total`, when given, is the group's size where `ranks` holds only
// its first members.
std::string format_ranks(std::span<const int64_t> ranks, std::size_t limit = 16, std::optional<int64_t> total = {});

// format_rank_runs writes ascending ranks as runs of consecutive ranks ("0-7,16,18-19"), at
// most `max_runs` runs then ",... (N ranks)"; six or more ranks a constant stride > 1 apart as
// their first two, "...", the last, the count and the stride.
std::string format_rank_runs(const std::vector<int64_t>& sorted_ranks, std::size_t max_runs = 64);

}  // namespace meshsim
