#include "meshsim/step_job.hpp"

#include <algorithm>
#include <cctype>
#include <map>

#include "meshsim/error.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::step {

namespace {

std::string lower_case(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool has_comms(const Schedule& s) {
  for (const auto& r : s.ranks) {
    for (const auto& a : r) {
      if (a && (a->type == ActionType::kSendF || a->type == ActionType::kRecvF || a->type == ActionType::kSendB ||
                a->type == ActionType::kRecvB)) {
        return true;
      }
    }
  }
  return false;
}

Model model_of(const std::string& name) {
  if (name.empty()) throw InvalidArgument("--model is required with --preset: a built-in name or a .toml file");
  const bool file = name.size() > 5 && name.substr(name.size() - 5) == ".toml";
  return file ? model_from_toml(name) : builtin_model(name);
}

std::string members_of(const Job& job, Dim d, int64_t rank) {
  const Parallel& p = job.parallel;
  const int64_t n = dim_size(p, d);
  std::string s = std::string(dim_label(job, d)) + " [";
  for (int64_t k = 0; k < n && k < 16; ++k) s += (k ? ", " : "") + std::to_string(group_member(p, d, rank, k));
  if (n > 16) s += ", ... (" + std::to_string(n) + " ranks)";
  return s + "]";
}

}  // namespace

std::vector<int64_t> parse_ranks(const std::string& text, int64_t world) {
  std::vector<int64_t> out;
  std::size_t at = 0;
  auto number = [&](std::size_t& i) {
    const std::size_t start = i;
    int64_t v = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, text[i] - '0', &v)) {
        throw OverflowError("--ranks " + quote_input(text) + ": a rank does not fit in 64 bits");
      }
      ++i;
    }
    if (i == start) throw InvalidArgument("--ranks " + quote_input(text) + ": expected 'all' or ranks like 0,3,8-15");
    return v;
  };
  while (at < text.size()) {
    const int64_t a = number(at);
    int64_t b = a;
    if (at < text.size() && text[at] == '-') b = number(++at);
    if (b < a) throw InvalidArgument("--ranks " + quote_input(text) + ": the range " + std::to_string(a) + "-" + std::to_string(b) + " is empty");
    if (b >= world) {
      throw OutOfRange("--ranks " + quote_input(text) + ": rank " + std::to_string(b) + " is out of range [0, " +
                       std::to_string(world) + ")");
    }
    if (b - a + static_cast<int64_t>(out.size()) > (int64_t{1} << 20)) {
      throw ResourceExhausted("--ranks " + quote_input(text) + " names over 2^20 ranks: use --ranks all");
    }
    for (int64_t r = a; r <= b; ++r) out.push_back(r);
    if (at < text.size()) {
      if (text[at] != ',') throw InvalidArgument("--ranks " + quote_input(text) + ": expected 'all' or ranks like 0,3,8-15");
      ++at;
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Schedule read_schedule_file(const std::string& path, std::optional<int64_t> pp, std::optional<int64_t> stages,
                            int64_t microbatches, const std::string& what, Lowering how, bool* as_written) {
  const std::string text = read_text_file(path, std::size_t{16} << 20, "--schedule");
  // A CSV holds sends and receives (compute_comms) or not (compute_only, lowered here).
  const Schedule probe = read_csv(text, 1, microbatches, true);
  const int64_t rows = static_cast<int64_t>(probe.ranks.size());
  if (pp && *pp != rows) {
    throw InvalidArgument(what + " has " + std::to_string(rows) + " rows (one per pp rank) but pp is " + std::to_string(*pp));
  }
  int64_t n = stages.value_or(0);
  if (!stages) {
    for (const auto& r : probe.ranks) {
      for (const auto& a : r) {
        if (a) n = std::max<int64_t>(n, a->stage + 1);
      }
    }
  }
  const bool lowered = has_comms(probe);
  if (as_written) *as_written = lowered;
  Schedule s = read_csv(text, n, microbatches, lowered);
  if (!lowered) return lower(s, how);
  validate_lowered(s);  // with or without --preset: a compute action twice, a stage on the wrong rank
  return s;
}

StepRun run_step(const StepSpec& spec) {
  if (spec.send_semantics != "rendezvous" && spec.send_semantics != "eager") {
    throw InvalidArgument("--send-semantics must be rendezvous or eager, not " + quote_input(spec.send_semantics));
  }
  StepRun run;
  preset::Torchtitan& t = run.degrees;
  Job& job = run.job;
  const bool megatron = spec.preset.rfind("megatron", 0) == 0;
  if (megatron) {
    // Megatron-core's sizes, checked by its own rules (the preset's RankGenerators), laid out in
    // its default order tp-cp-ep-dp-pp: the dense ranks as (pp, dp, cp, tp), the expert ranks as
    // (pp, edp, ep) with expert tp 1 — torchtitan's dense and sparse views.
    const preset::Megatron mg = preset::megatron_spec(spec.preset);
    (void)preset::megatron_recipe(mg, spec.world_size);
    if (mg.order != "tp-cp-ep-dp-pp") {
      throw InvalidArgument("--preset megatron: order=" + quote_input(mg.order) +
                            ": meshsim step lays out Megatron's default order tp-cp-ep-dp-pp only");
    }
    const int64_t etp = mg.etp.value_or(mg.tp);
    if (mg.ep > 1 && etp != 1) {
      throw InvalidArgument("--preset megatron: etp=" + std::to_string(etp) +
                            " (Megatron's default is tp): meshsim step models MoE with expert tensor parallel size 1; "
                            "give etp=1");
    }
    const int64_t dp = mg.dp ? *mg.dp : *spec.world_size / (mg.tp * mg.pp * mg.cp);
    t = preset::Torchtitan{mg.pp, 1, dp, mg.cp, mg.tp, mg.ep};
    job.framework = "megatron";
    job.activation_checkpoint = "none";
  } else {
    t = preset::torchtitan_spec(spec.preset);
    (void)preset::torchtitan_recipe(t, spec.world_size);  // torchtitan's checks of the degrees
    if (t.dp_shard == -1) t.dp_shard = *spec.world_size / (t.pp * t.dp_replicate * t.cp * t.tp);
  }
  job.parallel = {t.pp, t.dp_replicate, t.dp_shard, t.cp, t.tp, t.ep};
  job.model = model_of(spec.model);
  if (!spec.seq_len) throw InvalidArgument("--seq-len is required with --preset");
  if (!spec.local_batch_size) throw InvalidArgument("--local-batch-size is required with --preset");
  job.seq_len = *spec.seq_len;
  job.local_batch_size = *spec.local_batch_size;
  job.microbatches = spec.microbatches.value_or(1);
  job.lowering = parse_lowering(spec.lowering);
  job.reshard_after_forward = spec.reshard_after_forward;
  if (!megatron || spec.activation_checkpoint != "selective") job.activation_checkpoint = spec.activation_checkpoint;
  job.log_metrics = spec.log_metrics;
  const std::string name = lower_case(spec.schedule.empty() ? "1F1B" : spec.schedule);
  if (megatron) {
    // 1F1B, or Megatron's interleaved schedule when --stages puts more than one stage on a rank.
    if (spec.stages && (*spec.stages < 1 || *spec.stages % t.pp != 0)) {
      throw InvalidArgument("--stages " + std::to_string(*spec.stages) + " is not a positive multiple of pp " +
                            std::to_string(t.pp));
    }
    job.stages_per_rank = spec.stages ? *spec.stages / t.pp : 1;
    job.schedule = job.stages_per_rank > 1 ? "MegatronInterleaved" : spec.schedule.empty() ? "1F1B" : spec.schedule;
  } else if (known_schedule(name)) {
    job.schedule = spec.schedule.empty() ? "1F1B" : spec.schedule;
    if (spec.stages) {
      if (*spec.stages < 1 || *spec.stages % t.pp != 0) {
        throw InvalidArgument("--stages " + std::to_string(*spec.stages) + " is not a positive multiple of pp " +
                              std::to_string(t.pp));
      }
      job.stages_per_rank = *spec.stages / t.pp;
    }
  } else if (t.pp > 1) {
    if (job.microbatches < 1) throw InvalidArgument("--microbatches " + std::to_string(job.microbatches) + " is not >= 1");
    job.schedule = spec.schedule;
    job.schedule_override =
        read_schedule_file(spec.schedule, t.pp, spec.stages, job.microbatches, "--schedule " + quote_input(spec.schedule),
                           job.lowering, &job.override_as_written);
  } else {
    throw InvalidArgument("--schedule " + quote_input(spec.schedule) + " needs pp > 1 in --preset");
  }
  Options& so = run.options;
  so.semantics = spec.send_semantics == "eager" ? SendSemantics::kEager : SendSemantics::kRendezvous;
  so.gpus_per_host = spec.gpus_per_host;
  so.rank = spec.rank;
  const int64_t world = world_size(job.parallel);
  std::vector<int64_t> parity_ranks;
  for (const auto& f : spec.faults) {
    if (f.rfind("no-parity@", 0) == 0) {
      // Megatron's even/odd p2p rule turned off: a property of the code, so of every pipeline;
      // rank R's pipeline is simulated, so the cycle it closes names R.
      if (!megatron || job.stages_per_rank < 2) {
        throw InvalidArgument("--fault " + quote_input(f) + ": the even/odd rule is Megatron's interleaved schedule's "
                              "(--preset megatron:... with --stages > pp; 1F1B batches each call)");
      }
      const int64_t r = text::parse_int(f.substr(10), "--fault " + quote_input(f) + ": the rank");
      if (r < 0 || r >= world) {
        throw OutOfRange("--fault " + quote_input(f) + ": rank " + std::to_string(r) + " is out of range [0, " +
                         std::to_string(world) + ")");
      }
      job.megatron_parity = false;
      parity_ranks.push_back(r);
      continue;
    }
    so.faults.push_back(parse_fault(f));
  }
  if (spec.ranks == "all") so.all_ranks = true;
  else if (!spec.ranks.empty()) so.ranks = parse_ranks(spec.ranks, world);
  for (int64_t r : parity_ranks) so.ranks.push_back(r);
  run.report = check_step(job, so);
  return run;
}

nlohmann::json step_json(const StepRun& run) {
  const Report& r = run.report;
  const preset::Torchtitan& t = run.degrees;
  nlohmann::json by_dim = nlohmann::json::object();
  for (const auto& [dim, ops] : r.by_dim) {
    for (const auto& [op, total] : ops) by_dim[dim][op] = {{"calls", total.calls}, {"bytes", total.bytes}};
  }
  const bool pp = t.pp > 1;
  nlohmann::json j{{"ok", r.ok},
                   {"diagnosis", r.ok ? nlohmann::json(nullptr) : nlohmann::json(r.diagnosis)},
                   {"ranks", r.ranks},
                   {"world_size", r.world_size},
                   {"rank", r.rank},
                   {"by_dim", by_dim},
                   {"model", {{"name", run.job.model.name}, {"parameters", parameter_count(run.job.model)},
                              {"layers", run.job.model.layers}}},
                   {"framework", run.job.framework},
                   {"parallel", run.job.framework == "megatron"
                                    ? nlohmann::json{{"pp", t.pp}, {"dp", t.dp_shard}, {"cp", t.cp}, {"tp", t.tp}, {"ep", t.ep}, {"etp", 1}}
                                    : nlohmann::json{{"pp", t.pp}, {"dp_replicate", t.dp_replicate}, {"dp_shard", t.dp_shard},
                                                     {"cp", t.cp}, {"tp", t.tp}, {"ep", t.ep}}},
                   {"schedule", pp ? nlohmann::json(run.job.schedule) : nlohmann::json(nullptr)},
                   {"stages", r.layout.stages},
                   {"layers_per_stage", r.layout.layer_count},
                   {"microbatches", pp ? run.job.microbatches : 1},
                   {"send_semantics", run.options.semantics == SendSemantics::kEager ? "eager" : "rendezvous"},
                   {"lowering", pp ? nlohmann::json(r.layout.lowering) : nlohmann::json(nullptr)},
                   {"activation_checkpoint", run.job.activation_checkpoint},
                   {"events", r.program.size()},
                   {"programs", r.programs},
                   {"groups_checked", r.groups_checked},
                   {"ranks_simulated", r.ranks_simulated},
                   {"by_link", nullptr}};
  if (r.by_link) {
    j["by_link"] = {{"intra_host", r.by_link->intra_host}, {"inter_host", r.by_link->inter_host}};
    j["gpus_per_host"] = *run.options.gpus_per_host;
    nlohmann::json per = nlohmann::json::object();
    for (const auto& [dim, l] : r.link_by_dim) per[dim] = {{"intra_host", l.intra_host}, {"inter_host", l.inter_host}};
    j["link_by_dim"] = per;
  }
  return j;
}

std::vector<int64_t> traced_ranks(const StepRun& run) {
  std::vector<int64_t> traced = run.options.ranks;
  const int64_t world = run.report.world_size;
  if (run.options.all_ranks) {
    if (world > kMaxTracedRanks) {
      throw ResourceExhausted("--trace with --ranks all over " + std::to_string(world) + " ranks: name at most " +
                              std::to_string(kMaxTracedRanks));
    }
    for (int64_t i = 0; i < world; ++i) traced.push_back(i);
  }
  if (traced.empty()) traced.push_back(run.options.rank);
  return traced;
}

nlohmann::json trace_json(const StepRun& run, const std::vector<int64_t>& ranks) {
  if (static_cast<int64_t>(ranks.size()) > kMaxTracedRanks) {
    throw ResourceExhausted("--trace of " + std::to_string(ranks.size()) + " ranks: name at most " +
                            std::to_string(kMaxTracedRanks));
  }
  const Job& job = run.job;
  // The programs by pp coordinate (a rank's is its coordinate's, a fault aside), counted first.
  std::map<int64_t, std::vector<Event>> by_pp;
  int64_t total = 0;
  for (int64_t rank : ranks) {
    if (rank < 0 || rank >= run.report.world_size) {
      throw OutOfRange("traced rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(run.report.world_size) + ")");
    }
    const int64_t pp = pp_coordinate(job.parallel, rank);
    auto it = by_pp.find(pp);
    if (it == by_pp.end()) it = by_pp.emplace(pp, program(job, run.report.layout, pp)).first;
    total += static_cast<int64_t>(it->second.size());
    if (total > kMaxTracedEvents) {
      throw ResourceExhausted("--trace of " + std::to_string(ranks.size()) + " ranks holds over " +
                              std::to_string(kMaxTracedEvents) + " events: trace fewer ranks");
    }
  }
  nlohmann::json events = nlohmann::json::array();
  for (int64_t rank : ranks) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    std::vector<Event> prog = by_pp.at(pp_coordinate(job.parallel, rank));
    for (const Fault& f : run.options.faults) {
      if (f.rank == rank) apply_fault(job, f, prog);
    }
    const auto pipeline = group_members(job.parallel, Dim::kPp, rank);
    std::map<Dim, std::string> group_text;  // this rank's group on each dim, named once
    auto group_of = [&](Dim d) -> const std::string& {
      auto it = group_text.find(d);
      if (it == group_text.end()) it = group_text.emplace(d, members_of(job, d, rank)).first;
      return it->second;
    };
    int64_t ts = 0;
    for (const Event& e : prog) {
      nlohmann::json args{{"group", group_of(e.dim)}, {"view", std::string(view_name(e.dim))},
                          {"dim", std::string(dim_label(job, e.dim))}, {"bytes", e.bytes},
                          {"dtype", std::string(dtype_name(e.dtype))}, {"phase", std::string(phase_name(e.phase))},
                          {"what", e.what}};
      if (e.stage >= 0) args["stage"] = e.stage;
      if (e.layer >= 0) args["layer"] = e.layer;
      if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
      if (e.peer >= 0) args["peer"] = pipeline[static_cast<std::size_t>(e.peer)];
      if (e.recompute) args["recompute"] = true;
      events.push_back({{"name", std::string(op_name(e.op)) + " " + std::string(dim_label(job, e.dim))},
                        {"cat", std::string(phase_name(e.phase))}, {"ph", "X"}, {"ts", ts++}, {"dur", 1},
                        {"pid", 0}, {"tid", rank}, {"args", std::move(args)}});
    }
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

}  // namespace meshsim::step
