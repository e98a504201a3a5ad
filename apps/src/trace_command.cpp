#include "meshsim/trace_command.hpp"
#include "meshsim/json_codec.hpp"

#include <optional>
#include <algorithm>
#include <memory>
#include <vector>
#include <ostream>
#include <set>
#include <sstream>

#include "meshsim/error.hpp"
#include "meshsim/flight_recorder.hpp"
#include "meshsim/plan_check.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::trace_command {

namespace {

// plan_spec reads `meshsim step`'s flags that define a step.
step::StepSpec plan_spec(const std::string& against) {
  std::string text = against;
  if (!text.empty() && text[0] == '@') text = read_text_file(text.substr(1), 1 << 16, "--against");
  const std::vector<std::string> words = text::shell_words(text, "--against", std::size_t{1} << 14);
  if (words.empty()) {
    throw InvalidArgument("--against " + quote_input(against) + " holds" +
                          " no flags: give the step's flags (--preset or --job, ...), or leave --against out to "
                          "check the dumps alone");
  }
  step::StepSpec spec;
  // The flags that define a step, from the one table of a step's fields.
  std::string known;
  for (const step::StepField& f : step::step_fields()) {
    if (f.defines_step) known += (known.empty() ? "" : ", ") + std::string(f.flag);
  }
  for (std::size_t i = 0; i < words.size(); ++i) {
    std::string flag = words[i], value;
    const auto eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    const step::StepField* f = flag.rfind("--", 0) == 0 ? step::find_step_field(flag) : nullptr;
    if (!f || !f->defines_step) {
      throw InvalidArgument("--against: " + quote_input(flag) + " is not one of the flags that define a step (" + known + ")");
    }
    const bool takes_value = !std::holds_alternative<bool step::StepSpec::*>(f->member);
    if (takes_value && eq == std::string::npos) {
      if (i + 1 >= words.size()) throw InvalidArgument("--against: " + flag + " has no value");
      value = words[++i];
    }
    step::set_step_field(spec, *f, value, "--against: ");
  }
  if (spec.preset.empty() && spec.job.empty() && spec.megatron_args.empty()) {
    throw InvalidArgument("--against needs --preset or --job (the step's job), as `meshsim step` takes it");
  }
  return spec;
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  text::check_format(o.format);
  if (o.jobs && (*o.jobs < 1 || *o.jobs > 4096)) {
    throw InvalidArgument("trace check: --jobs " + std::to_string(*o.jobs) + " is out of range [1, 4096]");
  }
  const unsigned jobs = o.jobs ? static_cast<unsigned>(*o.jobs) : 0;
  std::optional<step::StepRun> plan;
  std::optional<trace::DumpSet> early;
  std::string world_note;
  if (o.against) {
    step::StepSpec spec = plan_spec(*o.against);  // bad flags fail before the dumps are read
    try {
      plan = step::run_step(spec);
    } catch (const InvalidArgument& e) {
      // A job that leaves dp_shard to the world size (torchtitan's -1, a saved config's
      // default): the world is the ranks the dumps know of.
      if (spec.world_size || std::string(e.what()).find("dp_shard=-1") == std::string::npos) throw;
      early = trace::read_dump_dir(o.dir, o.prefix, {}, jobs);
      int64_t world = 0;
      for (const auto& d : early->dumps) world = std::max(world, d.rank + 1);
      spec.world_size = world;
      plan = step::run_step(spec);
      world_note = "the plan's world size " + std::to_string(world) +
                   " is the ranks the dumps know of (the job leaves dp_shard to it; --world-size in --against sets it)";
    }
  }
  // The dumps are left to the process's exit (the tool ends after this report): freeing every
  // record's sizes and dtypes one allocation at a time cost 6% of checking 1,024 dumps. Held
  // from a static that is never destroyed, so leak checkers see them reachable.
  static auto* const kept_to_exit = new std::vector<std::unique_ptr<trace::DumpSet>>;
  auto& held = kept_to_exit->emplace_back(std::make_unique<trace::DumpSet>(early ? std::move(*early)
                                                                                 : trace::read_dump_dir(o.dir, o.prefix, {}, jobs)));
  const trace::DumpSet& set = *held;
  trace::CheckReport r = trace::check_dumps(set.dumps);
  std::optional<trace::PlanReport> p;
  if (plan) {
    p = trace::check_against_plan(set.dumps, *plan);
    if (!world_note.empty()) p->notes.insert(p->notes.begin(), world_note);
    // The plan breaks a mismatch's tie (a two-rank group, say): of the sides, the ranks that
    // leave the plan stay culprits, the ones that keep to it do not.
    std::set<int64_t> leaving;
    for (const auto& d : p->divergences) leaving.insert(d.rank);
    const bool any = std::any_of(r.culprits.begin(), r.culprits.end(), [&](const trace::Culprit& c) {
      return c.why.rfind("one side of ", 0) == 0 && leaving.count(c.rank);
    });
    if (any) {
      std::erase_if(r.culprits, [&](const trace::Culprit& c) { return c.why.rfind("one side of ", 0) == 0 && !leaving.count(c.rank); });
      for (auto& c : r.culprits) {
        if (c.why.rfind("one side of ", 0) == 0) c.why += "; it leaves the plan, its peers keep to it";
      }
    }
  }
  const bool ok = r.ok && (!p || p->ok);
  if (o.format == "json") {
    nlohmann::json j = trace::report_json(r, set);
    if (p) {
      nlohmann::json d = nlohmann::json::array();
      for (const auto& x : p->divergences) d.push_back({{"rank", x.rank}, {"record_id", x.record_id}, {"message", x.message}});
      j["plan"] = {{"ok", p->ok}, {"ranks_compared", p->ranks_compared}, {"records_compared", p->records_compared},
                   {"divergences", d}, {"notes", p->notes}};
      j["ok"] = ok;
    }
    out << json::output_text(j, 2) << "\n";
    return ok ? 0 : 1;
  }
  std::string text = trace::report_text(r, set);
  if (p) {
    // The plan's lines go before the verdict, which then covers both.
    const std::size_t verdict = text.rfind(r.ok ? "OK\n" : "FAILED: ");
    std::string verdict_line = text.substr(verdict);
    text.resize(verdict);
    out << text;
    out << "plan: " << p->ranks_compared << " ranks' " << p->records_compared << " records held to the step planned by --against\n";
    constexpr std::size_t kShown = 64;
    for (std::size_t k = 0; k < p->divergences.size() && k < kShown; ++k) out << "FAILED plan: " << p->divergences[k].message << "\n";
    if (p->divergences.size() > kShown) {
      out << "... and " << p->divergences.size() - kShown << " more ranks leave the plan (--format json lists them all)\n";
    }
    for (std::size_t k = 0; k < p->notes.size() && k < 8; ++k) out << "note: " << p->notes[k] << "\n";
    if (p->notes.size() > 8) out << "note: ... and " << p->notes.size() - 8 << " more like it\n";
    const std::string leave = std::to_string(p->divergences.size()) + (p->divergences.size() == 1 ? " rank leaves" : " ranks leave") + " the plan";
    if (ok) {
      out << "OK\n";
    } else if (r.ok) {
      out << "FAILED: " << leave << "\n";
    } else {
      out << verdict_line.substr(0, verdict_line.size() - 1) << "; " << leave << "\n";
    }
  } else {
    out << text;
  }
  return ok ? 0 : 1;
}

}  // namespace meshsim::trace_command
