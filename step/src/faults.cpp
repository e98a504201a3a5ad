// Faults planted in a rank's program (`--fault KIND@RANK`): what each kind changes, and its text.
#include <algorithm>
#include <string>
#include <vector>

#include "meshsim/error.hpp"
#include "meshsim/step_program.hpp"
#include "meshsim/text_fields.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

using namespace detail;

Fault parse_fault(std::string_view text) {
  constexpr const char* kKinds = "skip, swap, wrong-group, wrong-peer";
  const text::KindAtRank kr = text::kind_at_rank(text, "--fault", kKinds);
  Fault f;
  if (kr.kind == "skip") f.kind = FaultKind::kSkip;
  else if (kr.kind == "swap") f.kind = FaultKind::kSwap;
  else if (kr.kind == "wrong-group") f.kind = FaultKind::kWrongGroup;
  else if (kr.kind == "wrong-peer") f.kind = FaultKind::kWrongPeer;
  else throw InvalidArgument("--fault " + quote_input(text) + ": unknown kind " + quote_input(kr.kind) + " (" + kKinds + ")");
  f.rank = kr.rank;
  return f;
}

void apply_fault(const Job& job, const Fault& f, std::vector<Event>& events) {
  const Parallel& p = job.parallel;
  const std::string who = "rank " + std::to_string(f.rank);
  switch (f.kind) {
    case FaultKind::kSkip: {
      int32_t last = -1;
      for (const Event& e : events) last = std::max(last, e.microbatch);
      if (last < 0) throw InvalidArgument("skip@" + std::to_string(f.rank) + ": " + who + " runs no microbatch");
      std::erase_if(events, [&](const Event& e) {
        return e.microbatch == last && (e.phase == Phase::kFwd || e.phase == Phase::kBwd);
      });
      return;
    }
    case FaultKind::kSwap: {
      for (std::size_t i = 0; i < events.size(); ++i) {
        if (is_p2p(events[i].op)) continue;
        for (std::size_t j = i + 1; j < events.size(); ++j) {
          if (events[j].dim != events[i].dim || is_p2p(events[j].op)) continue;
          if (!same_collective(events[i], events[j])) {
            std::swap(events[i], events[j]);
            return;
          }
          break;
        }
      }
      throw InvalidArgument("swap@" + std::to_string(f.rank) + ": " + who +
                            "'s program has no two different collectives in a row on one group");
    }
    case FaultKind::kWrongGroup: {
      auto it = std::find_if(events.begin(), events.end(), [](const Event& e) { return e.dim == Dim::kTp && !is_p2p(e.op); });
      if (it == events.end()) it = std::find_if(events.begin(), events.end(), [](const Event& e) { return !is_p2p(e.op); });
      if (it == events.end()) throw InvalidArgument("wrong-group@" + std::to_string(f.rank) + ": " + who + " issues no collective");
      for (Dim d : {Dim::kFsdp, Dim::kDpReplicate, Dim::kCp, Dim::kTp, Dim::kPp}) {
        if (d != it->dim && dim_size(p, d) > 1) {
          it->dim = d;
          return;
        }
      }
      throw InvalidArgument("wrong-group@" + std::to_string(f.rank) +
                            ": the mesh has no second dim of size > 1 to issue a collective on");
    }
    case FaultKind::kWrongPeer: {
      auto it = std::find_if(events.begin(), events.end(), [](const Event& e) { return e.op == Op::kSend; });
      if (it == events.end()) {
        throw InvalidArgument("wrong-peer@" + std::to_string(f.rank) + ": " + who + " sends nothing (pp is " +
                              std::to_string(p.pp) + ")");
      }
      it->peer = (it->peer + 1) % p.pp;
      return;
    }
  }
}

}  // namespace meshsim::step
