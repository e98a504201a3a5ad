#include "meshsim/step_command.hpp"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/schedule.hpp"
#include "meshsim/step_program.hpp"
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
step::Schedule schedule_of(const Options& o, int64_t microbatches) {
  if (microbatches < 1) throw InvalidArgument("--microbatches " + std::to_string(microbatches) + " is not >= 1");
  const std::string name = lower_case(o.schedule);
  if (name == "gpipe" || name == "1f1b") {
    if (!o.pp) throw InvalidArgument("--schedule " + o.schedule + " needs --pp (the pipeline's ranks)");
    if (o.stages && *o.stages != *o.pp) {
      throw InvalidArgument("--schedule " + o.schedule + " runs one stage per rank: --stages " + std::to_string(*o.stages) +
                            " is not --pp " + std::to_string(*o.pp));
    }
    return step::lower(name == "gpipe" ? step::gpipe(*o.pp, microbatches) : step::one_f_one_b(*o.pp, microbatches));
  }
  if (name == "interleaved1f1b") {
    if (!o.pp) throw InvalidArgument("--schedule " + o.schedule + " needs --pp (the pipeline's ranks)");
    if (!o.stages) throw InvalidArgument("--schedule " + o.schedule + " needs --stages (a multiple of --pp)");
    return step::lower(step::interleaved_1f1b(*o.pp, *o.stages, microbatches));
  }
  if (name.empty()) throw InvalidArgument("--schedule is required: GPipe, 1F1B, Interleaved1F1B or a CSV file");
  const std::string text = read_text_file(o.schedule, std::size_t{16} << 20, "--schedule");
  // A CSV holds sends and receives (compute_comms) or not (compute_only, lowered here).
  step::Schedule probe = step::read_csv(text, 1, microbatches, true);
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
  step::Schedule s = step::read_csv(text, stages, microbatches, lowered);
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

// human prints bytes as a person reads them: "512 B", "1.50 MiB", "3.25 TiB".
std::string human(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string thousands(int64_t v) {
  std::string d = std::to_string(v), out;
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0 && d[i - 1] != '-') out += ',';
    out += d[i];
  }
  return out;
}

// parse_ranks reads --ranks: "all", or comma-separated ranks and ranges A-B.
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

step::Model model_of(const std::string& name) {
  if (name.empty()) throw InvalidArgument("--model is required with --preset: a built-in name or a .toml file");
  const bool file = name.size() > 5 && name.substr(name.size() - 5) == ".toml";
  return file ? step::model_from_toml(name) : step::builtin_model(name);
}

std::string members_of(const step::Parallel& p, step::Dim d, int64_t rank) {
  const auto m = step::group_members(p, d, rank);
  std::string s = std::string(step::dim_name(d)) + " [";
  for (std::size_t i = 0; i < m.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(m[i]);
  if (m.size() > 16) s += ", ... (" + std::to_string(m.size()) + " ranks)";
  return s + "]";
}

// write_trace writes Chrome/Perfetto trace JSON: a track per rank, a slice per event in program
// order (1 us each), args naming the group, bytes and tags.
void write_trace(const std::string& path, const step::Job& job, const step::StageLayout& l,
                 const std::vector<step::Fault>& faults, const std::vector<int64_t>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  for (int64_t rank : ranks) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", rank},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    auto prog = step::program(job, l, step::pp_coordinate(job.parallel, rank));
    for (const step::Fault& f : faults) {
      if (f.rank == rank) step::apply_fault(job, f, prog);
    }
    int64_t ts = 0;
    for (const step::Event& e : prog) {
      nlohmann::json args{{"group", members_of(job.parallel, e.dim, rank)}, {"bytes", e.bytes},
                          {"dtype", std::string(step::dtype_name(e.dtype))}, {"phase", std::string(step::phase_name(e.phase))},
                          {"what", e.what}};
      if (e.stage >= 0) args["stage"] = e.stage;
      if (e.layer >= 0) args["layer"] = e.layer;
      if (e.microbatch >= 0) args["microbatch"] = e.microbatch;
      if (e.peer >= 0) {
        args["peer"] = step::group_members(job.parallel, step::Dim::kPp, rank)[static_cast<std::size_t>(e.peer)];
      }
      events.push_back({{"name", std::string(step::op_name(e.op)) + " " + std::string(step::dim_name(e.dim))},
                        {"cat", std::string(step::phase_name(e.phase))}, {"ph", "X"}, {"ts", ts++}, {"dur", 1},
                        {"pid", 0}, {"tid", rank}, {"args", std::move(args)}});
    }
  }
  nlohmann::json doc{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  write_file_whole(path, doc.dump() + "\n", "--trace");
}

int run_job(const Options& o, std::ostream& out) {
  if (o.send_semantics != "rendezvous" && o.send_semantics != "eager") {
    throw InvalidArgument("--send-semantics must be rendezvous or eager, not " + quote_input(o.send_semantics));
  }
  if (o.format != "text" && o.format != "json") throw InvalidArgument("--format must be text or json, not " + quote_input(o.format));
  if (o.pp) throw InvalidArgument("--pp comes from --preset (its pp degree)");
  preset::Torchtitan t = preset::torchtitan_spec(o.preset);
  (void)preset::torchtitan_recipe(t, o.world_size);  // torchtitan's checks of the degrees
  if (t.dp_shard == -1) t.dp_shard = *o.world_size / (t.pp * t.dp_replicate * t.cp * t.tp);
  if (t.ep != 1) {
    throw InvalidArgument("--preset " + quote_input(o.preset) + ": ep=" + std::to_string(t.ep) +
                          ": expert parallelism needs an MoE model; meshsim step models torchtitan's dense llama3 so far");
  }
  step::Job job;
  job.parallel = {t.pp, t.dp_replicate, t.dp_shard, t.cp, t.tp};
  job.model = model_of(o.model);
  if (!o.seq_len) throw InvalidArgument("--seq-len is required with --preset");
  if (!o.local_batch_size) throw InvalidArgument("--local-batch-size is required with --preset");
  job.seq_len = *o.seq_len;
  job.local_batch_size = *o.local_batch_size;
  job.microbatches = o.microbatches.value_or(1);
  job.reshard_after_forward = o.reshard_after_forward;
  job.log_metrics = !o.no_metrics;
  const std::string name = lower_case(o.schedule.empty() ? "1F1B" : o.schedule);
  if (name == "gpipe" || name == "1f1b" || name == "interleaved1f1b") {
    job.schedule = o.schedule.empty() ? "1F1B" : o.schedule;
    if (o.stages) {
      if (*o.stages < 1 || *o.stages % t.pp != 0) {
        throw InvalidArgument("--stages " + std::to_string(*o.stages) + " is not a positive multiple of pp " + std::to_string(t.pp));
      }
      job.stages_per_rank = *o.stages / t.pp;
    }
  } else if (t.pp > 1) {
    Options csv = o;
    csv.pp = t.pp;
    job.schedule = o.schedule;
    job.schedule_override = schedule_of(csv, job.microbatches);
  } else {
    throw InvalidArgument("--schedule " + quote_input(o.schedule) + " needs pp > 1 in --preset");
  }
  step::Options so;
  so.semantics = o.send_semantics == "eager" ? step::SendSemantics::kEager : step::SendSemantics::kRendezvous;
  so.gpus_per_host = o.gpus_per_host;
  so.rank = o.rank;
  for (const auto& f : o.faults) so.faults.push_back(step::parse_fault(f));
  const int64_t world = step::world_size(job.parallel);
  if (o.ranks == "all") so.all_ranks = true;
  else if (!o.ranks.empty()) so.ranks = parse_ranks(o.ranks, world);
  const step::Report r = step::check_step(job, so);
  if (!o.dump_schedule.empty() && t.pp > 1) write_file_whole(o.dump_schedule, step::write_csv(r.layout.schedule), "--dump-schedule");
  if (!o.trace.empty()) {
    std::vector<int64_t> traced = so.ranks;
    if (so.all_ranks) {
      if (world > 4096) throw ResourceExhausted("--trace with --ranks all over " + std::to_string(world) + " ranks: name at most 4096");
      for (int64_t i = 0; i < world; ++i) traced.push_back(i);
    }
    if (traced.empty()) traced.push_back(o.rank);
    write_trace(o.trace, job, r.layout, so.faults, traced);
  }
  const int64_t params = step::parameter_count(job.model);
  std::vector<int64_t> layers;
  for (int64_t c : r.layout.layer_count) layers.push_back(c);
  if (o.format == "json") {
    nlohmann::json by_dim = nlohmann::json::object();
    for (const auto& [dim, ops] : r.by_dim) {
      for (const auto& [op, total] : ops) by_dim[dim][op] = {{"calls", total.calls}, {"bytes", total.bytes}};
    }
    nlohmann::json j{{"ok", r.ok},
                     {"diagnosis", r.ok ? nlohmann::json(nullptr) : nlohmann::json(r.diagnosis)},
                     {"ranks", r.ranks},
                     {"world_size", r.world_size},
                     {"rank", r.rank},
                     {"by_dim", by_dim},
                     {"model", {{"name", job.model.name}, {"parameters", params}, {"layers", job.model.layers}}},
                     {"parallel", {{"pp", t.pp}, {"dp_replicate", t.dp_replicate}, {"dp_shard", t.dp_shard}, {"cp", t.cp}, {"tp", t.tp}}},
                     {"schedule", t.pp > 1 ? nlohmann::json(job.schedule) : nlohmann::json(nullptr)},
                     {"stages", r.layout.stages},
                     {"layers_per_stage", layers},
                     {"microbatches", t.pp > 1 ? job.microbatches : 1},
                     {"send_semantics", o.send_semantics},
                     {"events", r.program.size()},
                     {"programs", r.programs},
                     {"groups_checked", r.groups_checked},
                     {"ranks_simulated", r.ranks_simulated}};
    if (r.by_link) {
      j["by_link"] = {{"intra_host", r.by_link->intra_host}, {"inter_host", r.by_link->inter_host}};
      j["gpus_per_host"] = *o.gpus_per_host;
      nlohmann::json per = nlohmann::json::object();
      for (const auto& [dim, l] : r.link_by_dim) per[dim] = {{"intra_host", l.intra_host}, {"inter_host", l.inter_host}};
      j["link_by_dim"] = per;
    } else {
      j["by_link"] = nullptr;
    }
    out << j.dump() << "\n";
    return r.ok ? 0 : 1;
  }
  out << "step: torchtitan pp=" << t.pp << " dp_replicate=" << t.dp_replicate << " dp_shard=" << t.dp_shard
      << " cp=" << t.cp << " tp=" << t.tp << " (" << thousands(world) << " ranks); " << job.model.name << " ("
      << thousands(params) << " parameters), seq " << job.seq_len << ", local batch " << job.local_batch_size << "\n";
  if (t.pp > 1) {
    std::string split;
    for (std::size_t i = 0; i < layers.size() && i < 16; ++i) split += (i ? "+" : "") + std::to_string(layers[i]);
    if (layers.size() > 16) split += "+...";
    out << "pipeline: " << job.schedule << ", " << r.layout.stages << " stages (" << split << " layers), "
        << job.microbatches << " microbatches, " << o.send_semantics << " sends\n";
  }
  out << "rank " << r.rank << ": " << r.program.size() << " events in one step\n\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-13s %6s  %-15s %7s %14s %14s", "dim", "size", "op", "calls", "bytes/rank",
                r.by_link ? "across hosts" : "");
  out << line << "\n";
  for (int d = 0; d < step::kDims; ++d) {
    const std::string dim(step::dim_name(static_cast<step::Dim>(d)));
    const auto it = r.by_dim.find(dim);
    if (it == r.by_dim.end()) continue;
    bool first = true;
    for (const auto& [op, total] : it->second) {
      std::string share;
      if (first && r.by_link) {
        const auto l = r.link_by_dim.find(dim);
        if (l != r.link_by_dim.end() && l->second.intra_host + l->second.inter_host > 0) {
          char b[32];
          std::snprintf(b, sizeof b, "%.1f%%",
                        100.0 * static_cast<double>(l->second.inter_host) /
                            static_cast<double>(l->second.intra_host + l->second.inter_host));
          share = b;
        }
      }
      std::snprintf(line, sizeof line, "%-13s %6s  %-15s %7lld %14s %14s", first ? dim.c_str() : "",
                    first ? std::to_string(step::dim_size(job.parallel, static_cast<step::Dim>(d))).c_str() : "",
                    op.c_str(), static_cast<long long>(total.calls), human(total.bytes).c_str(), share.c_str());
      out << line << "\n";
      first = false;
    }
  }
  if (r.by_link) {
    out << "\nlinks (every rank, " << *o.gpus_per_host << " GPUs per host; ring all_gather/reduce_scatter/all_reduce, "
        << "pairwise all_to_all): intra-host " << human(r.by_link->intra_host) << ", inter-host "
        << human(r.by_link->inter_host) << "\n";
  }
  out << "\n";
  if (r.ok) {
    out << "OK: " << thousands(world) << " ranks: every group's members issue the same collectives and the step "
        << "makes progress under " << o.send_semantics << " sends (" << r.programs << " programs, " << r.groups_checked
        << " groups compared, " << r.ranks_simulated << " ranks simulated)\n";
    return 0;
  }
  out << r.diagnosis << "\n";
  return 1;
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  if (!o.preset.empty()) return run_job(o, out);
  for (const auto& [set, flag] : std::vector<std::pair<bool, const char*>>{
           {!o.model.empty(), "--model"}, {o.seq_len.has_value(), "--seq-len"},
           {o.local_batch_size.has_value(), "--local-batch-size"}, {o.gpus_per_host.has_value(), "--gpus-per-host"},
           {!o.faults.empty(), "--fault"}, {!o.trace.empty(), "--trace"}, {!o.ranks.empty(), "--ranks"},
           {o.world_size.has_value(), "--world-size"}}) {
    if (set) throw InvalidArgument(std::string(flag) + " needs --preset (a torchtitan job's step)");
  }
  if (!o.microbatches) throw InvalidArgument("--microbatches is required with --schedule alone");
  const int64_t microbatches = *o.microbatches;
  if (o.send_semantics != "rendezvous" && o.send_semantics != "eager") {
    throw InvalidArgument("--send-semantics must be rendezvous or eager, not " + quote_input(o.send_semantics));
  }
  if (o.format != "text" && o.format != "json") throw InvalidArgument("--format must be text or json, not " + quote_input(o.format));
  if (o.max_rows < 0) throw OutOfRange("--max-rows " + std::to_string(o.max_rows) + " is negative");
  const step::Schedule s = schedule_of(o, microbatches);
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
