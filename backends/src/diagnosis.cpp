#include <algorithm>

#include "meshsim/error.hpp"
#include "meshsim/spmd_backend.hpp"

namespace meshsim {

namespace {

constexpr std::pair<DiagnosisKind, std::string_view> kKindNames[] = {
    {DiagnosisKind::kError, "error"},     {DiagnosisKind::kMismatch, "mismatch"}, {DiagnosisKind::kStall, "stall"},
    {DiagnosisKind::kMesh, "mesh"},       {DiagnosisKind::kDeparted, "departed"}, {DiagnosisKind::kCheck, "check"},
    {DiagnosisKind::kExit, "exit"},       {DiagnosisKind::kStore, "store"},       {DiagnosisKind::kConnect, "connect"},
    {DiagnosisKind::kAssertion, "assertion"}};

}  // namespace

std::string_view to_string(DiagnosisKind kind) {
  for (const auto& [k, name] : kKindNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

std::optional<DiagnosisKind> diagnosis_kind(std::string_view name) {
  for (const auto& [k, n] : kKindNames) {
    if (n == name) return k;
  }
  return std::nullopt;
}

std::string format_ranks(std::span<const int64_t> ranks, std::size_t limit) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size() && i < limit; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > limit) s += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return s + "]";
}

std::string collective_label(const std::string& call, uint64_t number) { return call + " #" + std::to_string(number); }

std::string collective_label(const CollectiveDesc& d, uint64_t number) { return collective_label(d.to_string(), number); }

namespace {

std::string ranks_phrase(const std::vector<int64_t>& r) {
  return r.size() == 1 ? "rank " + std::to_string(r[0]) : "ranks " + format_ranks(r);
}

}  // namespace

Diagnosis departed_diagnosis(std::vector<int64_t> gone, const std::string& collective, std::span<const int64_t> group,
                             std::vector<int64_t> waiting) {
  std::sort(gone.begin(), gone.end());
  gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
  if (waiting.empty()) {
    for (int64_t g : group) {
      if (!std::binary_search(gone.begin(), gone.end(), g)) waiting.push_back(g);
    }
  }
  std::sort(waiting.begin(), waiting.end());
  std::string msg = ranks_phrase(gone) + " ended " + (gone.size() == 1 ? "its program" : "their programs") +
                    " without joining " + collective + " of group " + format_ranks(group);
  if (!waiting.empty()) msg += " (" + ranks_phrase(waiting) + (waiting.size() == 1 ? " waits" : " wait") + " for it)";
  return Diagnosis{DiagnosisKind::kDeparted, std::move(gone), std::move(msg), {}, {}};
}

Diagnosis mismatch_diagnosis(const std::string& at, std::span<const int64_t> group,
                             std::vector<std::pair<std::string, std::vector<int64_t>>> calls) {
  // One order whoever writes it: each call's ranks sorted, the calls by their lowest rank.
  for (auto& c : calls) std::sort(c.second.begin(), c.second.end());
  std::sort(calls.begin(), calls.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  std::size_t most = 0;
  for (const auto& c : calls) most = std::max(most, c.second.size());
  std::size_t holders = 0;
  for (const auto& c : calls) holders += c.second.size() == most;
  std::vector<int64_t> culprits;
  std::string msg = "collective mismatch at " + at + " of group " + format_ranks(group) + ":";
  for (const auto& [call, ranks] : calls) {
    msg += " " + ranks_phrase(ranks) + " called " + call + ";";
    if (ranks.size() < most || holders > 1) culprits.insert(culprits.end(), ranks.begin(), ranks.end());
  }
  msg.pop_back();
  std::sort(culprits.begin(), culprits.end());
  return Diagnosis{DiagnosisKind::kMismatch, culprits, msg, {}, {}};
}

void SpmdBackend::run_ranks(const std::function<void(int64_t)>&) {
  throw InvalidArgument("backend '" + name() + "' does not run ranks itself (its runner starts a thread per rank)");
}

}  // namespace meshsim
