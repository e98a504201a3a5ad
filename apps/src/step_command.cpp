#include "meshsim/step_command.hpp"
#include "meshsim/json_codec.hpp"

#include <filesystem>
#include <algorithm>
#include <iostream>
#include <cctype>
#include <cstdio>
#include <set>
#include <optional>
#include <ostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "meshsim/chakra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/preset.hpp"
#include "meshsim/schedule.hpp"
#include "meshsim/step_job.hpp"
#include "meshsim/step_program.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::step_command {

namespace {

using text::lower_case;

// schedule_of builds or reads the schedule the options name, lowered, and names how in `lowering`
// ("runtime", "add_send_recv", "megatron" or "as written").
step::Schedule schedule_of(const Options& o, int64_t microbatches, std::string& lowering) {
  step::parse_lowering(o.spec.lowering);  // refused whatever the schedule
  lowering = o.spec.lowering;
  if (microbatches < 1) throw InvalidArgument("--microbatches " + std::to_string(microbatches) + " is not >= 1");
  const std::string name = lower_case(o.spec.schedule);
  const step::ScheduleInfo* info = step::find_schedule(name);
  if (info && info->single_stage) {
    if (!o.pp) throw InvalidArgument("--schedule " + o.spec.schedule + " needs --pp (the pipeline's ranks)");
    if (o.spec.stages && *o.spec.stages != *o.pp) {
      throw InvalidArgument("--schedule " + o.spec.schedule + " runs one stage per rank: --stages " + std::to_string(*o.spec.stages) +
                            " is not --pp " + std::to_string(*o.pp));
    }
    step::Schedule s = step::single_stage_lowered(name, *o.pp, microbatches);
    lowering = s.batches.empty() ? "add_send_recv" : "step_microbatches";
    return s;
  }
  if (info && info->kind == step::ScheduleKind::kMegatronInterleaved) {
    if (!o.pp) throw InvalidArgument("--schedule " + o.spec.schedule + " needs --pp (the pipeline's ranks)");
    if (!o.spec.stages) throw InvalidArgument("--schedule " + o.spec.schedule + " needs --stages (a multiple of --pp)");
    std::vector<int64_t> off;
    for (const std::string& f : o.spec.faults) {
      // no-parity@R: the pipeline issues its sends and receives without Megatron's even/odd rule.
      const text::KindAtRank kr = text::kind_at_rank(f, "--fault", "no-parity with --schedule alone");
      if (kr.kind != "no-parity") {
        throw InvalidArgument("--fault " + quote_input(f) + " with --schedule alone: only no-parity@R (R a pp rank)");
      }
      if (kr.rank >= *o.pp) {
        throw OutOfRange("--fault " + quote_input(f) + ": pp rank " + std::to_string(kr.rank) + " is not below --pp " +
                         std::to_string(*o.pp));
      }
      for (int64_t k = 0; k < *o.pp; ++k) off.push_back(k);  // the rule is the code's: off on every rank
    }
    lowering = "megatron";
    return step::megatron_interleaved(*o.pp, *o.spec.stages, microbatches, 0, off);
  }
  if (info && info->pytorch) {
    if (!o.pp) throw InvalidArgument("--schedule " + o.spec.schedule + " needs --pp (the pipeline's ranks)");
    const bool v = info->kind == step::ScheduleKind::kZBVZeroBubble;
    if (!o.spec.stages && !v) throw InvalidArgument("--schedule " + o.spec.schedule + " needs --stages (a multiple of --pp)");
    return step::lower(step::schedule_by_name(name, *o.pp, o.spec.stages.value_or(2 * *o.pp), microbatches),
                       step::parse_lowering(o.spec.lowering));
  }
  if (name.empty()) throw InvalidArgument("--schedule is required: " + step::schedule_names() + ", MegatronInterleaved or a CSV file");
  bool as_written = false;
  step::Schedule s = step::read_schedule_file(o.spec.schedule, o.pp, o.spec.stages, microbatches, "--schedule '" + o.spec.schedule + "'",
                                              step::parse_lowering(o.spec.lowering), &as_written);
  if (as_written) lowering = "as written";
  return s;
}

// print_grid prints the schedule as PyTorch's _format_pipeline_order does (a column per rank, a
// row per step, "Step NN:" zero-filled to the last step's width, one space between columns),
// each row where a rank waits forever ending " <-- ERROR HERE: rank R waits" as PyTorch marks its
// error step. A column's width is PyTorch's too: its longest entry or the label of the step of
// the same index ("Step 03" for rank 3), never its "Rank R" label (a zip over the step labels
// and the columns), so the grid is byte-equal to PyTorch's. At most `max_cols` rank columns and
// `max_rows` steps are printed, saying how many more.
void print_grid(const step::Schedule& s, const step::Progress& p, int64_t max_rows, int64_t max_cols, std::ostream& out) {
  std::size_t steps = 0;
  for (const auto& r : s.ranks) steps = std::max(steps, r.size());
  const std::size_t digits = std::to_string(steps == 0 ? 0 : steps - 1).size();
  const std::size_t cols = std::min(s.ranks.size(), static_cast<std::size_t>(std::max<int64_t>(max_cols, 0)));
  std::vector<std::size_t> width;
  for (std::size_t r = 0; r < cols; ++r) {
    std::size_t w = r < steps ? 5 + digits : 0;
    for (const auto& a : s.ranks[r]) w = std::max(w, a ? step::to_string(*a).size() : 0);
    width.push_back(w);
  }
  auto padded = [](const std::string& t, std::size_t w) { return t + std::string(w > t.size() ? w - t.size() : 0, ' '); };
  const std::string more_cols =
      cols < s.ranks.size() ? " ... " + std::to_string(s.ranks.size() - cols) + " more ranks (raise --max-cols)" : "";
  std::string header(5 + digits + 2, ' ');
  for (std::size_t r = 0; r < cols; ++r) header += (r ? " " : "") + padded("Rank " + std::to_string(r), width[r]);
  out << header << more_cols << "\n";
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
      if (r < cols) line += (r ? " " : "") + padded(k < l.size() && l[k] ? step::to_string(*l[k]) : "", width[r]);
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

// input_files are the files a step's flags read (those that name an existing file).
std::vector<NamedPath> input_files(const step::StepSpec& s) {
  std::vector<NamedPath> in;
  auto file = [&in](const std::string& path, const char* what) {
    std::error_code ec;
    if (!path.empty() && std::filesystem::is_regular_file(path, ec)) in.push_back({path, what});
  };
  file(s.job, "--job");
  if (s.preset.rfind("torchtitan:", 0) == 0) file(s.preset.substr(11), "--preset");
  if (!s.megatron_args.empty() && s.megatron_args[0] == '@') file(s.megatron_args.substr(1), "--megatron-args");
  file(s.model, "--model");
  file(s.schedule, "--schedule");
  return in;
}

int run_job(const Options& o, std::ostream& out) {
  text::check_format(o.format);
  if (o.pp) throw InvalidArgument("--pp comes from --preset (its pp degree)");
  const step::StepRun run = step::run_step(o.spec);
  for (const std::string& n : run.notes) std::cerr << "meshsim step: note: " << n << "\n";
  const step::Report& r = run.report;
  const step::Job& job = run.job;
  const preset::Torchtitan& t = run.degrees;
  const int64_t world = r.world_size;
  // Every output is made and its place checked before the first is written: a refused run
  // writes nothing.
  if (!o.dump_schedule.empty() && t.pp == 1) {
    throw InvalidArgument("--dump-schedule writes the lowered pipeline schedule, and this job has no pipeline "
                          "parallelism (pp=1)");
  }
  const std::string trace_text =
      o.trace.empty() ? "" : json::output_text(step::trace_json(run, step::traced_ranks(run))) + "\n";
  const std::vector<int64_t> chakra_ranks = o.chakra.empty() ? std::vector<int64_t>{} : step::chakra_world(run, o.chakra_world);
  // No output replaces an input or another output; every output's place is checked first.
  std::vector<NamedPath> outputs{{o.dump_schedule, "--dump-schedule"}, {o.trace, "--trace"}};
  if (!o.chakra.empty()) {
    const std::string base = std::filesystem::path(o.chakra).filename().string();
    std::error_code ec;
    if (base.empty() || base == "." || base == ".." || std::filesystem::is_directory(o.chakra, ec)) {
      throw InvalidArgument("--chakra " + quote_input(o.chakra) + " is the prefix of the files it writes (PREFIX.0.et, "
                            "..., PREFIX.comm_groups.json), not a directory: give DIR/NAME");
    }
    for (std::size_t i = 0; i < chakra_ranks.size(); ++i) outputs.push_back({o.chakra + "." + std::to_string(i) + ".et", "--chakra"});
    outputs.push_back({o.chakra + ".comm_groups.json", "--chakra"});
  }
  check_distinct(input_files(o.spec), outputs);
  for (const NamedPath& p : outputs) {
    if (!p.path.empty()) prepare_output(p.path, p.what);
  }
  if (!o.dump_schedule.empty()) write_file_whole(o.dump_schedule, step::write_csv(r.layout.schedule), "--dump-schedule");
  if (!o.trace.empty()) write_file_whole(o.trace, trace_text, "--trace");
  std::optional<step::ChakraExport> chakra;
  if (!o.chakra.empty()) chakra = step::write_chakra(run, chakra_ranks, o.chakra);
  if (chakra && chakra->nodes == 0) {
    std::cerr << "meshsim step: warning: the Chakra traces hold no nodes: no collective, send or receive of this step "
                 "runs between the "
              << chakra->ranks.size() << " NPU" << (chakra->ranks.size() == 1 ? "" : "s")
              << " written (one NPU, or every group reaches outside --chakra-world)\n";
  }
  if (o.format == "json") {
    nlohmann::json j = step::step_json(run);
    if (chakra) {
      j["chakra"] = {{"prefix", o.chakra}, {"npus", chakra->ranks.size()}, {"ranks", chakra->ranks}, {"nodes", chakra->nodes},
                     {"collectives", chakra->collectives}, {"sends", chakra->sends}, {"recvs", chakra->recvs},
                     {"groups", chakra->groups}, {"dropped", chakra->dropped}, {"comm_groups", chakra->comm_groups_path}};
    }
    out << json::output_text(j) << "\n";
    return r.ok ? 0 : 1;
  }
  const int64_t params = step::job_parameter_count(job);
  const std::vector<int64_t>& layers = r.layout.layer_count;
  if (job.framework == step::Framework::kMegatron) {
    out << "step: megatron pp=" << t.pp << " dp=" << t.dp_shard << " cp=" << t.cp << " tp=" << t.tp << " ep=" << t.ep
        << " (" << thousands(world) << " ranks); ";
  } else {
    out << "step: torchtitan pp=" << t.pp << " dp_replicate=" << t.dp_replicate << " dp_shard=" << t.dp_shard
        << " cp=" << t.cp << " tp=" << t.tp << " (" << thousands(world) << " ranks); ";
  }
  out << job.model.name << " ("
      << thousands(params) << " parameters), seq " << job.seq_len << ", local batch " << job.local_batch_size
      << (job.grad_accum_steps > 1 ? ", " + std::to_string(job.grad_accum_steps) + " gradient accumulation steps" : "")
      << (run.job_file.empty() ? "" : " (job " + run.job_file + ")") << "\n";
  if (t.pp > 1) {
    std::string split;
    for (std::size_t i = 0; i < layers.size() && i < 16; ++i) split += (i ? "+" : "") + std::to_string(layers[i]);
    if (layers.size() > 16) split += "+...";
    out << "pipeline: " << job.schedule << ", " << r.layout.stages << " stages (" << split << " layers), "
        << job.microbatches << (job.microbatches == 1 ? " microbatch, " : " microbatches, ") << o.spec.send_semantics
        << " sends\n";
  }
  out << "rank " << r.rank << ": " << r.program.size() << " events in one step\n\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-13s %6s  %-15s %7s %14s %14s", "dim", "size", "op", "calls", "bytes/rank",
                r.by_link ? "across hosts" : "");
  out << line << "\n";
  std::set<std::string> printed;
  for (int d = 0; d < step::kDims; ++d) {
    const std::string dim(step::dim_label(job, static_cast<step::Dim>(d)));
    const auto it = r.by_dim.find(dim);
    if (it == r.by_dim.end() || !printed.insert(dim).second) continue;
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
    out << "\nlinks (every rank, " << *o.spec.gpus_per_host << " GPUs per host; ring all_gather/reduce_scatter/all_reduce, "
        << "pairwise all_to_all): intra-host " << human(r.by_link->intra_host) << ", inter-host "
        << human(r.by_link->inter_host) << "\n";
  }
  out << "\n";
  // The pipeline's grid (PyTorch's _format_pipeline_order) when asked, and whenever the schedule
  // itself cannot progress (a CSV's deadlock), its stuck steps marked.
  if (t.pp > 1) {
    const step::Progress sp = step::check_progress(r.layout.schedule, run.options.semantics);
    if (o.grid || !sp.ok) {
      const auto group = step::group_members(job.parallel, step::Dim::kPp, r.rank);
      std::string members;
      for (std::size_t i = 0; i < group.size() && i < 16; ++i) members += (i ? ", " : "") + std::to_string(group[i]);
      if (group.size() > 16) members += ", ...";
      out << "schedule (every pipeline group; the columns are pp ranks, rank " << r.rank << "'s group is [" << members
          << "]):\n";
      print_grid(r.layout.schedule, sp, o.max_rows, o.max_cols, out);
      out << "\n";
    }
  }
  if (chakra) {
    std::string dropped;
    for (const auto& [dim, n] : chakra->dropped) dropped += (dropped.empty() ? "" : ", ") + dim + " " + thousands(n);
    out << "chakra: " << o.chakra << ".{0.." << chakra->ranks.size() - 1 << "}.et (" << chakra->ranks.size() << " NPUs: ranks "
        << (o.chakra_world == "all" ? std::string("all") : o.chakra_world) << ") and " << chakra->comm_groups_path << ": "
        << thousands(chakra->nodes) << " nodes (" << thousands(chakra->collectives) << " collectives, " << thousands(chakra->sends)
        << " sends, " << thousands(chakra->recvs) << " receives) over " << chakra->groups << " communicator groups"
        << (dropped.empty() ? std::string() : "; left out (groups reach outside): " + dropped) << "\n";
  }
  if (r.ok) {
    out << "OK: " << thousands(world) << " ranks: every group's members issue the same collectives and the step "
        << "makes progress under " << step::send_semantics_name(run.options.semantics) << " sends (" << r.programs << " programs, " << r.groups_checked
        << " groups compared, " << r.ranks_simulated << " ranks simulated)\n";
    return 0;
  }
  out << r.diagnosis << "\n";
  return 1;
}

}  // namespace

int run(const Options& o, std::ostream& out) {
  if (!o.spec.preset.empty() || !o.spec.job.empty() || !o.spec.megatron_args.empty()) return run_job(o, out);
  for (const auto& [set, flag] : std::vector<std::pair<bool, const char*>>{
           {!o.spec.model.empty(), "--model"}, {o.spec.seq_len.has_value(), "--seq-len"},
           {o.spec.local_batch_size.has_value(), "--local-batch-size"}, {o.spec.gpus_per_host.has_value(), "--gpus-per-host"},
           {!o.spec.faults.empty() && !(step::find_schedule(o.spec.schedule) && step::find_schedule(o.spec.schedule)->kind == step::ScheduleKind::kMegatronInterleaved), "--fault"}, {!o.trace.empty(), "--trace"}, {!o.spec.ranks.empty(), "--ranks"},
           {!o.chakra.empty(), "--chakra"},
           {o.spec.world_size.has_value(), "--world-size"}, {o.spec.loss_chunks.has_value(), "--loss-chunks"}}) {
    if (set) throw InvalidArgument(std::string(flag) + " needs --preset or --job (a training job's step)");
  }
  if (!o.spec.microbatches) throw InvalidArgument("--microbatches is required with --schedule alone");
  const int64_t microbatches = *o.spec.microbatches;
  const step::SendSemantics sem = step::parse_send_semantics(o.spec.send_semantics);
  text::check_format(o.format);
  if (o.max_rows < 0) throw OutOfRange("--max-rows " + std::to_string(o.max_rows) + " is negative");
  if (o.max_cols < 0) throw OutOfRange("--max-cols " + std::to_string(o.max_cols) + " is negative");
  std::string lowering;
  const step::Schedule s = schedule_of(o, microbatches, lowering);
  const step::Progress p = step::check_progress(s, sem);
  if (!o.dump_schedule.empty()) {
    check_distinct(input_files(o.spec), {{o.dump_schedule, "--dump-schedule"}});
    prepare_output(o.dump_schedule, "--dump-schedule");
    write_file_whole(o.dump_schedule, step::write_csv(s), "--dump-schedule");
  }
  if (o.format == "json") {
    nlohmann::json j{{"ok", p.ok}, {"pp", s.ranks.size()}, {"stages", s.stages}, {"microbatches", s.microbatches},
                     {"send_semantics", o.spec.send_semantics}, {"lowering", lowering}, {"diagnosis", p.ok ? nlohmann::json(nullptr) : nlohmann::json(p.diagnosis)},
                     {"ranks", p.ranks}};
    out << json::output_text(j) << "\n";
    return p.ok ? 0 : 1;
  }
  print_grid(s, p, o.max_rows, o.max_cols, out);
  if (p.ok) {
    out << "OK: " << s.ranks.size() << " pipeline ranks, " << s.stages << " stages, " << s.microbatches
        << " microbatches: every send meets its receive under " << o.spec.send_semantics << " sends\n";
    return 0;
  }
  std::string ranks;
  for (int64_t r : p.ranks) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  out << "FAILED ranks [" << ranks << "]: " << p.diagnosis << "\n";
  return 1;
}

}  // namespace meshsim::step_command
