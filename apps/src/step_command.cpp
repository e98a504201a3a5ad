#include "meshsim/step_command.hpp"

#include <algorithm>
#include <cctype>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshsim/error.hpp"
#include "meshsim/schedule.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::step_command {

namespace {

std::string lower_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has_comms(const step::Schedule& s) {
  for (const auto& r : s.ranks) {
    for (const auto& a : r) {
      if (a && (a->type == step::ActionType::kSendF || a->type == step::ActionType::kRecvF ||
                a->type == step::ActionType::kSendB || a->type == step::ActionType::kRecvB)) {
        return true;
      }
    }
  }
  return false;
}

// schedule_of builds or reads the schedule the options name, lowered.
step::Schedule schedule_of(const Options& o) {
  if (o.microbatches < 1) throw InvalidArgument("--microbatches " + std::to_string(o.microbatches) + " is not >= 1");
  const std::string name = lower_case(o.schedule);
  if (name == "gpipe" || name == "1f1b") {
    if (!o.pp) throw InvalidArgument("--schedule " + o.schedule + " needs --pp (the pipeline's ranks)");
    if (o.stages && *o.stages != *o.pp) {
      throw InvalidArgument("--schedule " + o.schedule + " runs one stage per rank: --stages " + std::to_string(*o.stages) +
                            " is not --pp " + std::to_string(*o.pp));
    }
    return step::lower(name == "gpipe" ? step::gpipe(*o.pp, o.microbatches) : step::one_f_one_b(*o.pp, o.microbatches));
  }
  if (name == "interleaved1f1b") {
    if (!o.pp) throw InvalidArgument("--schedule " + o.schedule + " needs --pp (the pipeline's ranks)");
    if (!o.stages) throw InvalidArgument("--schedule " + o.schedule + " needs --stages (a multiple of --pp)");
    return step::lower(step::interleaved_1f1b(*o.pp, *o.stages, o.microbatches));
  }
  if (name.empty()) throw InvalidArgument("--schedule is required: GPipe, 1F1B, Interleaved1F1B or a CSV file");
  const std::string text = read_text_file(o.schedule, std::size_t{16} << 20, "--schedule");
  // A CSV holds sends and receives (compute_comms) or not (compute_only, lowered here).
  step::Schedule probe = step::read_csv(text, 1, o.microbatches, true);
  const int64_t rows = static_cast<int64_t>(probe.ranks.size());
  if (o.pp && *o.pp != rows) {
    throw InvalidArgument("--schedule '" + o.schedule + "' has " + std::to_string(rows) + " rows (one per pp rank) but --pp is " +
                          std::to_string(*o.pp));
  }
  int64_t stages = o.stages.value_or(0);
  if (!o.stages) {
    for (const auto& r : probe.ranks) {
      for (const auto& a : r) {
        if (a) stages = std::max(stages, a->stage + 1);
      }
    }
  }
  const bool lowered = has_comms(probe);
  step::Schedule s = step::read_csv(text, stages, o.microbatches, lowered);
  if (lowered) return s;
  return step::lower(s);
}

// print_grid prints the schedule as PyTorch's _format_pipeline_order does (a column per rank, a
// row per step, "Step NN:" zero-filled to the last step's width, columns as wide as their
// longest entry, one space apart), each row where a rank waits forever ending
// " <-- ERROR HERE: rank R waits" as PyTorch marks its error step.
void print_grid(const step::Schedule& s, const step::Progress& p, int64_t max_rows, std::ostream& out) {
  std::size_t steps = 0;
  for (const auto& r : s.ranks) steps = std::max(steps, r.size());
  const std::size_t digits = std::to_string(steps == 0 ? 0 : steps - 1).size();
  std::vector<std::size_t> width;
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    std::size_t w = ("Rank " + std::to_string(r)).size();
    for (const auto& a : s.ranks[r]) w = std::max(w, a ? step::to_string(*a).size() : 0);
    width.push_back(w);
  }
  auto padded = [](const std::string& t, std::size_t w) { return t + std::string(w > t.size() ? w - t.size() : 0, ' '); };
  std::string header(5 + digits + 2, ' ');
  for (std::size_t r = 0; r < s.ranks.size(); ++r) header += (r ? " " : "") + padded("Rank " + std::to_string(r), width[r]);
  out << header << "\n";
  for (std::size_t k = 0; k < steps; ++k) {
    if (static_cast<int64_t>(k) >= max_rows) {
      out << "... " << (steps - k) << " more steps (raise --max-rows)\n";
      break;
    }
    std::string label = std::to_string(k);
    label = "Step " + std::string(digits - label.size(), '0') + label + ": ";
    std::string line = label;
    std::string stuck;
    for (std::size_t r = 0; r < s.ranks.size(); ++r) {
      const auto& l = s.ranks[r];
      line += (r ? " " : "") + padded(k < l.size() && l[k] ? step::to_string(*l[k]) : "", width[r]);
      if (!p.ok && r < p.stopped_at.size() && p.stopped_at[r] == static_cast<int64_t>(k)) {
        stuck += (stuck.empty() ? "rank " : ", rank ") + std::to_string(r);
      }
    }
    if (!stuck.empty()) line += " <-- ERROR HERE: " + stuck + (stuck.find(',') == std::string::npos ? " waits" : " wait");
    out << line << "\n";
  }
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  if (o.send_semantics != "rendezvous" && o.send_semantics != "eager") {
    throw InvalidArgument("--send-semantics must be rendezvous or eager, not " + quote_input(o.send_semantics));
  }
  if (o.format != "text" && o.format != "json") throw InvalidArgument("--format must be text or json, not " + quote_input(o.format));
  if (o.max_rows < 0) throw OutOfRange("--max-rows " + std::to_string(o.max_rows) + " is negative");
  const step::Schedule s = schedule_of(o);
  const step::SendSemantics sem =
      o.send_semantics == "eager" ? step::SendSemantics::kEager : step::SendSemantics::kRendezvous;
  const step::Progress p = step::check_progress(s, sem);
  if (!o.dump_schedule.empty()) write_file_whole(o.dump_schedule, step::write_csv(s), "--dump-schedule");
  if (o.format == "json") {
    nlohmann::json j{{"ok", p.ok}, {"pp", s.ranks.size()}, {"stages", s.stages}, {"microbatches", s.microbatches},
                     {"send_semantics", o.send_semantics}, {"diagnosis", p.ok ? nlohmann::json(nullptr) : nlohmann::json(p.diagnosis)},
                     {"ranks", p.ranks}};
    out << j.dump() << "\n";
    return p.ok ? 0 : 1;
  }
  print_grid(s, p, o.max_rows, out);
  if (p.ok) {
    out << "OK: " << s.ranks.size() << " pipeline ranks, " << s.stages << " stages, " << s.microbatches
        << " microbatches: every send meets its receive under " << o.send_semantics << " sends\n";
    return 0;
  }
  std::string ranks;
  for (int64_t r : p.ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  out << "FAILED ranks [" << ranks << "]: " << p.diagnosis << "\n";
  return 1;
}

}  // namespace meshsim::step_command
