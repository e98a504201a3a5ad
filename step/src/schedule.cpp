// Pipeline schedules as data: PyTorch's action grammar (parse_action, to_string), a schedule's
// checks (validate, validate_lowered) and its CSV form (read_csv, write_csv). The built-in
// schedules are in schedule_table.cpp, the lowering in schedule_lowering.cpp, the progress check
// in schedule_progress.cpp.
#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/schedule.hpp"
#include "schedule_internal.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

namespace {

struct TypeName {
  ActionType type;
  std::string_view name;
};
// Longest names first, so "SEND_F" is not read as a stage followed by junk.
constexpr TypeName kTypes[] = {{ActionType::kReduceGrad, "REDUCE_GRAD"}, {ActionType::kUnshard, "UNSHARD"},
                               {ActionType::kReshard, "RESHARD"},        {ActionType::kSendF, "SEND_F"},
                               {ActionType::kRecvF, "RECV_F"},           {ActionType::kSendB, "SEND_B"},
                               {ActionType::kRecvB, "RECV_B"},           {ActionType::kF, "F"},
                               {ActionType::kI, "I"},                    {ActionType::kW, "W"},
                               {ActionType::kB, "B"}};

// digits reads a decimal number at `at` (advancing it), at most `max`; nullopt when none.
std::optional<int64_t> digits(std::string_view s, std::size_t& at, int64_t max, std::string_view what) {
  const std::size_t start = at;
  int64_t v = 0;
  while (at < s.size() && s[at] >= '0' && s[at] <= '9') {
    v = v * 10 + (s[at] - '0');
    if (v > max) {
      throw OutOfRange("action " + quote_input(s) + ": its " + std::string(what) + " is over the limit of " +
                       std::to_string(max));
    }
    ++at;
  }
  if (at == start) return std::nullopt;
  return v;
}

}  // namespace

int64_t stage_rank(const Schedule& s, int64_t stage) {
  const auto pp = static_cast<int64_t>(s.ranks.size());
  if (s.style == StageStyle::kV) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}

std::string_view type_name(ActionType t) {
  for (const TypeName& n : kTypes) {
    if (n.type == t) return n.name;
  }
  return "?";
}

std::string to_string(const Action& a) {
  std::string out = std::to_string(a.stage) + std::string(type_name(a.type));
  if (a.microbatch) out += std::to_string(*a.microbatch);
  return out;
}

Action parse_action(std::string_view text) {
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  std::size_t at = 0;
  const std::optional<int64_t> stage = digits(s, at, kMaxStages - 1, "stage");
  if (!stage) {
    throw InvalidArgument("action " + quote_input(text) + " does not start with a stage number "
                          "(PyTorch's form: <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD><microbatch>)");
  }
  Action a;
  a.stage = static_cast<int32_t>(*stage);  // below kMaxStages
  bool found = false;
  for (const TypeName& n : kTypes) {
    if (s.substr(at, n.name.size()) == n.name) {
      a.type = n.type;
      at += n.name.size();
      found = true;
      break;
    }
  }
  if (!found) {
    throw InvalidArgument("action " + quote_input(text) + ": no action type after the stage (F, I, W, B, SEND_F, RECV_F, "
                          "SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD)");
  }
  if (const auto mb = digits(s, at, kMaxMicrobatches - 1, "microbatch")) a.microbatch = static_cast<int32_t>(*mb);
  if (at != s.size()) throw InvalidArgument("action " + quote_input(text) + " has text after its microbatch");
  if (has_microbatch(a.type) && !a.microbatch) {
    throw InvalidArgument("action " + quote_input(text) + ": " + std::string(type_name(a.type)) + " needs a microbatch");
  }
  if (!has_microbatch(a.type) && a.microbatch) {
    throw InvalidArgument("action " + quote_input(text) + ": " + std::string(type_name(a.type)) + " takes no microbatch");
  }
  return a;
}

void validate(const Schedule& s) {
  const int64_t pp = static_cast<int64_t>(s.ranks.size());
  if (pp < 1) throw InvalidArgument("a schedule needs at least one rank");
  if (s.stages < pp || s.stages % pp != 0) {
    throw InvalidArgument("a schedule of " + std::to_string(s.stages) + " stages over " + std::to_string(pp) +
                          " ranks: the stages must be a multiple of the ranks (stage s on rank s mod pp)");
  }
  // Per (stage, microbatch): forwards, full backwards, input backwards, weight backwards seen
  // (a flat table: a (stage, microbatch) holds at least two actions, so it is bounded by them).
  // A CSV may name far more (stage, microbatch) pairs than it holds actions: then a map.
  const auto m_count = static_cast<std::size_t>(s.microbatches);
  std::size_t actions = 0;
  for (const auto& l : s.ranks) actions += l.size();
  const std::size_t cells = static_cast<std::size_t>(s.stages) * m_count;
  const bool flat = s.microbatches > 0 && static_cast<std::size_t>(s.stages) <= SIZE_MAX / m_count && cells <= 2 * actions + 64;
  std::vector<std::array<int, 4>> table(flat ? cells : 0, std::array<int, 4>{});
  std::map<std::size_t, std::array<int, 4>> sparse;
  auto seen = [&](int64_t stage, int64_t mb) -> std::array<int, 4>& {
    const std::size_t at = static_cast<std::size_t>(stage) * m_count + static_cast<std::size_t>(mb);
    return flat ? table[at] : sparse[at];
  };
  for (int64_t r = 0; r < pp; ++r) {
    const auto& l = s.ranks[static_cast<std::size_t>(r)];
    for (std::size_t k = 0; k < l.size(); ++k) {
      if (!l[k]) continue;
      const Action& a = *l[k];
      const std::string where = "rank " + std::to_string(r) + " action " + std::to_string(k) + " (" + to_string(a) + ")";
      if (a.stage >= s.stages) throw InvalidArgument(where + ": stage " + std::to_string(a.stage) + " is past the last stage");
      if (rank_of(s, a.stage) != r) {
        throw InvalidArgument(where + ": stage " + std::to_string(a.stage) + " lives on rank " + std::to_string(rank_of(s, a.stage)));
      }
      if (a.microbatch && *a.microbatch >= s.microbatches) {
        throw InvalidArgument(where + ": microbatch " + std::to_string(*a.microbatch) + " is past the last of " +
                              std::to_string(s.microbatches));
      }
      if (a.type != ActionType::kF && a.type != ActionType::kB && a.type != ActionType::kI && a.type != ActionType::kW) continue;
      auto& c = seen(a.stage, *a.microbatch);
      const int idx = a.type == ActionType::kF ? 0 : a.type == ActionType::kB ? 1 : a.type == ActionType::kI ? 2 : 3;
      if (c[static_cast<std::size_t>(idx)]++) throw InvalidArgument(where + ": runs a second time");
      if (idx != 0 && !c[0]) throw InvalidArgument(where + ": a backward before its forward");
      if (idx == 3 && !c[2] && !c[1]) throw InvalidArgument(where + ": a weight backward before its input backward");
    }
  }
  for (int64_t st = 0; st < s.stages; ++st) {
    for (int64_t m = 0; m < s.microbatches; ++m) {
      const std::array<int, 4> c = seen(st, m);
      const bool backward = c[1] == 1 ? c[2] == 0 && c[3] == 0 : c[2] == 1 && c[3] == 1;
      if (c[0] != 1 || !backward) {
        throw InvalidArgument("stage " + std::to_string(st) + " microbatch " + std::to_string(m) + " runs " +
                              std::to_string(c[0]) + " forwards and " + (backward ? "its" : "not exactly one") +
                              " backward (B, or I then W)");
      }
    }
  }
}

void validate_lowered(const Schedule& s) {
  // validate passes over sends and receives (it checks their stage's rank only), so the lowered
  // schedule is checked as it is: an action is named by its place in the CSV's row.
  validate(s);
}

Schedule read_csv(std::string_view text, int64_t stages, int64_t microbatches, bool lowered) {
  if (text.size() > (std::size_t{16} << 20)) throw ResourceExhausted("a schedule CSV is over 16 MiB");
  Schedule s;
  s.stages = stages;
  s.microbatches = microbatches;
  s.lowered = lowered;
  int64_t total = 0;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() && text.empty()) break;  // the final newline
    if (static_cast<int64_t>(s.ranks.size()) >= kMaxStages) throw ResourceExhausted("a schedule CSV has over " + std::to_string(kMaxStages) + " rows");
    auto& row = s.ranks.emplace_back();
    std::size_t cell = 0;
    while (true) {
      const std::size_t comma = line.find(',');
      const std::string_view c = line.substr(0, comma);
      ++cell;
      if (++total > kMaxActions) throw ResourceExhausted("a schedule CSV holds over " + std::to_string(kMaxActions) + " cells");
      if (c.find_first_not_of(' ') == std::string_view::npos) {
        row.emplace_back();
      } else {
        try {
          row.push_back(parse_action(c));
        } catch (const Error& e) {
          throw InvalidArgument("schedule CSV line " + std::to_string(line_no) + " cell " + std::to_string(cell) + ": " + e.what());
        }
        const Action& a = *row.back();
        if (!lowered && (is_send(a.type) || is_recv(a.type))) {
          throw InvalidArgument("schedule CSV line " + std::to_string(line_no) + " cell " + std::to_string(cell) + ": " +
                                to_string(a) + " is a send or receive in a compute_only schedule");
        }
      }
      if (comma == std::string_view::npos) break;
      line.remove_prefix(comma + 1);
    }
  }
  if (s.ranks.empty()) throw InvalidArgument("a schedule CSV has no rows (one per pp rank)");
  // Two stages per rank whose rows hold stages r and 2 pp - 1 - r (and not r and r + pp) are
  // PyTorch's "v" placement (ZBVZeroBubble, DualPipeV).
  const auto pp = static_cast<int64_t>(s.ranks.size());
  if (pp > 1 && s.stages == 2 * pp) {
    auto fits = [&](StageStyle style) {
      Schedule probe;
      probe.ranks.resize(s.ranks.size());
      probe.style = style;
      for (int64_t r = 0; r < pp; ++r) {
        for (const auto& a : s.ranks[static_cast<std::size_t>(r)]) {
          if (a && stage_rank(probe, a->stage) != r) return false;
        }
      }
      return true;
    };
    if (!fits(StageStyle::kLoop) && fits(StageStyle::kV)) s.style = StageStyle::kV;
  }
  return s;
}

std::string write_csv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.ranks) {
    for (std::size_t k = 0; k < row.size(); ++k) {
      if (k) out += ',';
      if (row[k]) out += to_string(*row[k]);
    }
    out += '\n';
  }
  return out;
}

std::string_view send_semantics_name(SendSemantics s) { return s == SendSemantics::kEager ? "eager" : "rendezvous"; }

SendSemantics parse_send_semantics(std::string_view text) {
  if (text == "rendezvous") return SendSemantics::kRendezvous;
  if (text == "eager") return SendSemantics::kEager;
  throw InvalidArgument("--send-semantics must be rendezvous or eager, not " + quote_input(text));
}

}  // namespace meshsim::step
