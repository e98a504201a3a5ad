#include "meshsim/step_job.hpp"

#include <filesystem>
#include <algorithm>
#include <cctype>
#include <map>
#include <type_traits>

#include "meshsim/error.hpp"
#include "meshsim/torchtitan_job.hpp"
#include "meshsim/megatron_args.hpp"
#include "meshsim/text_fields.hpp"
#include "meshsim/text_file.hpp"
#include "step_internal.hpp"

namespace meshsim::step {

namespace {

using text::checked_mul;
using text::lower_case;

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

// from_job_file fills what the spec leaves unset from the job file's settings, as torchtitan reads
// them (torchtitan_job.hpp: its defaults where the file is silent, its rules), and notes each flag
// that overrides the file.
void from_job_file(const torchtitan::JobFile& f, const preset::Torchtitan& t, StepSpec& s, Job& job, StepRun& run) {
  const std::string of = " of " + quote_input(f.path);
  const torchtitan::Settings set = torchtitan::settings(f, t);
  auto overrides = [&](const std::string& flag, const std::string& given, const std::string& file_value,
                       const std::string& key) {
    if (given != file_value) run.notes.push_back(flag + " " + given + " overrides " + key + " = " + file_value + of);
  };
  auto fill_int = [&](std::optional<int64_t>& flag_value, const char* flag, const torchtitan::Keyed<int64_t>& v) {
    if (flag_value) {
      overrides(flag, std::to_string(*flag_value), std::to_string(v.value), v.key);
      return;
    }
    // meshsim's bounds on a file's sequence length and batch, blamed on the file's key, never on
    // a flag the user did not give.
    const std::string_view name(flag);
    if ((name == "--seq-len" || name == "--local-batch-size") && (v.value < 1 || v.value > (int64_t{1} << 32))) {
      throw InvalidArgument(v.key + " = " + std::to_string(v.value) + " is out of range [1, 2^32]" + of);
    }
    flag_value = v.value;
  };
  auto fill_str = [&](std::string& flag_value, const char* flag, const std::optional<torchtitan::Keyed<std::string>>& v) {
    if (!v) return;
    const bool defaulted = v->key.size() > 10 && v->key.compare(v->key.size() - 10, 10, " (default)") == 0;
    if (flag_value.empty()) flag_value = v->value;
    else if (!defaulted) overrides(flag, flag_value, v->value, v->key);  // a choice, not the file's
  };
  if (!s.model.empty()) {
    if (f.model) overrides("--model", s.model, f.model->value, f.model->key);
  } else {
    try {
      (void)builtin_model(set.model.value);
    } catch (const NotFound& e) {
      std::string known;
      for (const auto& n : builtin_model_names()) known += (known.empty() ? "" : ", ") + n;
      throw NotFound(f.where + ": " + set.model.key + " name the model " + quote_input(set.model.value) +
                     ", which meshsim does not know (" + known + "): give --model FILE.toml with its sizes");
    }
    s.model = set.model.value;
  }
  fill_int(s.seq_len, "--seq-len", set.seq_len);
  fill_int(s.local_batch_size, "--local-batch-size", set.per_microbatch);
  if (t.pp > 1) fill_int(s.microbatches, "--microbatches", set.microbatches);
  job.grad_accum_steps = set.grad_accum_steps;
  fill_str(s.schedule, "--schedule", set.schedule);
  fill_str(s.reshard_after_forward, "--reshard-after-forward", set.reshard_after_forward);
  fill_str(s.activation_checkpoint, "--activation-checkpoint", set.activation_checkpoint);
  if (!set.load_balance) s.load_balance = false;
  const torchtitan::PipelineSplit split =
      torchtitan::pipeline_split(f, t.pp, model_of(s.model).layers, s.schedule, is_single_stage(lower_case(s.schedule)));
  job.first_stage_less_layers = split.first_stage_less_layers;
  job.last_stage_less_layers = split.last_stage_less_layers;
  if (split.stages) fill_int(s.stages, "--stages", *split.stages);
  if (set.loss_chunks) fill_int(s.loss_chunks, "--loss-chunks", *set.loss_chunks);
}

// from_megatron_args fills the spec from Megatron-LM's flags as megatron_job resolves them (a
// flag given beside them overrides, noted), and the Megatron rules they set into the job; the
// job's degrees are its return.
preset::Megatron from_megatron_args(const MegatronArgs& a, StepSpec& s, Job& job, StepRun& run) {
  if (!s.world_size) {
    throw InvalidArgument("--megatron-args needs --world-size (Megatron takes it from WORLD_SIZE)");
  }
  auto fill = [&](std::optional<int64_t>& flag_value, const char* flag, int64_t value, const std::string& from) {
    if (flag_value && *flag_value != value) {
      run.notes.push_back(std::string(flag) + " " + std::to_string(*flag_value) + " overrides " + from + " " +
                          std::to_string(value) + " of --megatron-args");
    } else if (!flag_value) {
      flag_value = value;
    }
  };
  if (a.model) {
    if (!s.model.empty()) run.notes.push_back("--model " + s.model + " overrides the model shape of --megatron-args");
  } else if (s.model.empty()) {
    throw InvalidArgument("--megatron-args: give the model's shape (--num-layers, --hidden-size, --num-attention-heads, "
                          "--vocab-size, ...) or --model");
  }
  const int64_t layers = a.model && s.model.empty() ? a.model->layers : model_of(s.model).layers;
  const MegatronJob mj = megatron_job(a, *s.world_size, layers);
  if (!mj.seq_length && !s.seq_len) throw InvalidArgument("--megatron-args needs --seq-length");
  if (mj.seq_length) fill(s.seq_len, "--seq-len", *mj.seq_length, "--seq-length");
  fill(s.local_batch_size, "--local-batch-size", mj.micro_batch_size, "--micro-batch-size");
  fill(s.microbatches, "--microbatches", mj.microbatches, "--global-batch-size / (--micro-batch-size x dp)");
  if (mj.stages) fill(s.stages, "--stages", *mj.stages, "the virtual pipeline stages");
  if (s.activation_checkpoint.empty()) {
    s.activation_checkpoint = a.recompute;
  } else if (a.recompute_given && text::lower_case(s.activation_checkpoint) != a.recompute) {
    run.notes.push_back("--activation-checkpoint " + s.activation_checkpoint + " overrides the recomputation of "
                        "--megatron-args (" + a.recompute + ")");
  }
  if (!s.reshard_after_forward.empty()) {
    throw InvalidArgument("--reshard-after-forward " + quote_input(s.reshard_after_forward) + " is FSDP's (torchtitan's) "
                          "setting; a Megatron step shards with its distributed optimizer and has no such choice");
  }
  job.megatron_grad_reduce_in_bf16 = a.grad_reduce_in_bf16;
  job.megatron_vocab_divisible = a.vocab_divisible;
  job.megatron_bias_linear = a.bias_linear;
  job.megatron_qkv_bias = a.qkv_bias;
  job.megatron_layernorm = a.normalization == "LayerNorm";
  job.megatron_rerun_validate = a.rerun_mode == "validate_results";
  if (!a.ignored.empty()) {
    std::string list;
    for (std::size_t i = 0; i < a.ignored.size() && i < 32; ++i) list += (i ? " " : "") + a.ignored[i];
    if (a.ignored.size() > 32) list += " ... (" + std::to_string(a.ignored.size()) + ")";
    run.notes.push_back("--megatron-args: not read (no collective meshsim models): " + list);
  }
  return mj.degrees;
}

}  // namespace

const std::vector<StepField>& step_fields() {
  static const std::vector<StepField> kFields = {
      {"--preset", "preset", &StepSpec::preset, true, "torchtitan:KEY=V,... or torchtitan:FILE.toml: check the job's step"},
      {"--world-size", "world_size", &StepSpec::world_size, true, "the world size (for dp_shard=-1)"},
      {"--model", "model", &StepSpec::model, true,
       "llama3-8b, llama3-70b, llama3-405b, deepseek_v3-16b, deepseek_v3-671b, ... or a .toml file with a [model] table"},
      {"--seq-len", "seq_len", &StepSpec::seq_len, true, "tokens per sequence"},
      {"--job", "job", &StepSpec::job, true,
       "a torchtitan job file, read whole: a .toml job file, or the .json config torchtitan 0.3.0 saves "
       "(debug.save_config_file); flags given too override it (said on stderr)"},
      {"--megatron-args", "megatron_args", &StepSpec::megatron_args, true,
       "Megatron-LM's own flags, quoted (\"--tensor-model-parallel-size 2 --bf16 ...\"), or @FILE: Megatron-core's step "
       "(with --world-size)"},
      {"--local-batch-size", "local_batch_size", &StepSpec::local_batch_size, true,
       "sequences per data-parallel rank in one microbatch (not torchtitan's local_batch_size: with pp, its "
       "pipeline_parallel_microbatch_size)"},
      {"--gpus-per-host", "gpus_per_host", &StepSpec::gpus_per_host, false,
       "split every collective's bytes into intra- and inter-host"},
      {"--rank", "rank", &StepSpec::rank, false, "the rank whose program the table reports (default 0)"},
      {"--ranks", "ranks", &StepSpec::ranks, false,
       "simulate these ranks exactly ('all', or 0,3,8-15); also what --trace writes"},
      {"--fault", "faults", &StepSpec::faults, false,
       "plant a fault: skip@R, swap@R, wrong-group@R, wrong-peer@R (repeatable)"},
      {"--reshard-after-forward", "reshard_after_forward", &StepSpec::reshard_after_forward, true,
       "FSDP's policy: default, always or never"},
      {"--activation-checkpoint", "activation_checkpoint", &StepSpec::activation_checkpoint, true,
       "selective (torchtitan's default: all-gathers issued again in backward), full or none"},
      {"--no-metrics", "log_metrics", &StepSpec::log_metrics, true, "a step that does not log (no loss metrics all-reduces)"},
      {"--no-load-balance", "load_balance", &StepSpec::load_balance, true,
       "torchtitan's MoE without load balancing (load_balance_coeff None: no all-reduce of the tokens per expert)"},
      {"--schedule", "schedule", &StepSpec::schedule, true,
       "GPipe, 1F1B (default with --preset), Interleaved1F1B, or a CSV file of PyTorch's form"},
      {"--loss-chunks", "loss_chunks", &StepSpec::loss_chunks, true,
       "torchtitan 0.3.0's loss.num_chunks: the lm_head and loss run per sequence chunk (ChunkedLossWrapper); unset: the "
       "loss whole"},
      {"--microbatches", "microbatches", &StepSpec::microbatches, true,
       "pipeline microbatches per step (default 1 with --preset)"},
      {"--stages", "stages", &StepSpec::stages, true,
       "stages (Interleaved1F1B: a multiple of --pp; a CSV: the largest stage + 1)"},
      {"--send-semantics", "send_semantics", &StepSpec::send_semantics, false,
       "rendezvous (a send waits for its receive, as NCCL's large messages) or eager"},
      {"--lowering", "lowering", &StepSpec::lowering, true,
       "runtime (default: what PyTorch's multi-stage runtime runs, UNSHARD/RESHARD/REDUCE_GRAD and idle steps dropped) or "
       "add_send_recv (the compute order as it is); GPipe and 1F1B take add_send_recv"},
  };
  return kFields;
}

const StepField* find_step_field(std::string_view name) {
  for (const StepField& f : step_fields()) {
    if (f.flag == name || f.keyword == name) return &f;
  }
  return nullptr;
}

void set_step_field(StepSpec& spec, const StepField& f, const std::string& value, const std::string& where) {
  std::visit(
      [&](auto member) {
        using T = std::remove_reference_t<decltype(spec.*member)>;
        if constexpr (std::is_same_v<T, std::string>) {
          spec.*member = value;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          (spec.*member).push_back(value);
        } else if constexpr (std::is_same_v<T, bool>) {
          spec.*member = false;  // a bool's flag turns it off
        } else {
          spec.*member = text::parse_int(value, where + std::string(f.flag));
        }
      },
      f.member);
}

std::vector<int64_t> parse_ranks(const std::string& text, int64_t world) {
  try {
    return text::rank_list(text, world, "--ranks", int64_t{1} << 20);
  } catch (const ResourceExhausted& e) {
    throw ResourceExhausted(std::string(e.what()) + ": use --ranks all");
  }
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

namespace {

// group_layout: the dims `names` of a row-major view (its first name slowest) as a layout over the
// world, one mode per dim of size > 1 (its size : the product of the sizes after it), the
// smallest stride first. A name the view lacks is Internal: the preset and the step drifted.
GroupLayout group_layout(const preset::ViewShape& view, const std::vector<std::string_view>& names) {
  for (const std::string_view n : names) {
    if (std::find(view.names.begin(), view.names.end(), n) == view.names.end()) {
      throw Internal("group_layout: the preset's view has no dim " + std::string(n));
    }
  }
  GroupLayout g;
  int64_t stride = 1;
  for (std::size_t i = view.names.size(); i-- > 0;) {
    if (view.sizes[i] > 1 && std::find(names.begin(), names.end(), view.names[i]) != names.end()) {
      g.shape[static_cast<std::size_t>(g.modes)] = view.sizes[i];
      g.stride[static_cast<std::size_t>(g.modes)] = stride;
      ++g.modes;
    }
    stride *= view.sizes[i];
  }
  return g;
}

// laid_out: `p` with each Dim's groups read from the views, `names` the view's dims of each
// (in Dim order: pp, dp_replicate, fsdp, cp, tp, batch, loss, ep, efsdp, mp, world), then held
// to the degrees (validate_groups: Internal, for the preset and the step drifted).
Parallel laid_out(Parallel p, const preset::ViewShape& dense, const preset::ViewShape& expert,
                  const std::array<std::vector<std::string_view>, kDims>& names) {
  for (int d = 0; d < kDims; ++d) {
    const bool sparse = d == static_cast<int>(Dim::kEp) || d == static_cast<int>(Dim::kEfsdp);
    p.groups[static_cast<std::size_t>(d)] = group_layout(sparse ? expert : dense, names[static_cast<std::size_t>(d)]);
  }
  try {
    detail::validate_groups(p);
  } catch (const InvalidArgument& e) {
    throw Internal(std::string("the preset's views: ") + e.what());
  }
  return p;
}

}  // namespace

Parallel megatron_parallel(const preset::Megatron& mg, std::optional<int64_t> world_size) {
  const preset::MegatronViews v = preset::megatron_views(mg, world_size);
  // The expert view is the MoE's (ep > 1, expert tp 1); a dense model's step issues nothing on it.
  const int64_t etp = mg.etp.value_or(mg.tp);
  if (mg.ep > 1 && etp != 1) {
    throw InvalidArgument("--preset megatron: etp=" + std::to_string(etp) +
                          " (Megatron's default is tp): meshsim step models MoE with expert tensor parallel size 1; "
                          "give etp=1");
  }
  // The groups each view's dims make: dense (pp, dp, cp, tp in the order's layout), expert (pp,
  // edp, ep, etp); dp_replicate (1) is Megatron's nowhere, fsdp is dp_cp, batch is dp.
  Parallel p{mg.pp, 1, v.world / (mg.pp * mg.cp * mg.tp), mg.cp, mg.tp, mg.ep};
  // A dense model's expert groups (ep 1, etp the default tp) are read from the dense view: the
  // step issues nothing on them; ep is then 1 and efsdp dp x cp x tp, what the degrees make.
  const bool moe = mg.ep > 1;
  std::array<std::vector<std::string_view>, kDims> names{
      {{"pp"}, {}, {"dp", "cp"}, {"cp"}, {"tp"}, {"dp"}, {"dp", "cp"}, {"ep"}, {"edp"}, {"pp", "tp"}, {"pp", "dp", "cp", "tp"}}};
  if (!moe) {
    names[static_cast<std::size_t>(Dim::kEp)] = {};
    names[static_cast<std::size_t>(Dim::kEfsdp)] = {"dp", "cp", "tp"};
  }
  return laid_out(p, v.dense, moe ? v.expert : v.dense, names);
}

Parallel titan_parallel(const preset::TorchtitanViews& v) {
  const preset::Torchtitan& t = v.degrees;
  return laid_out(Parallel{t.pp, t.dp_replicate, t.dp_shard, t.cp, t.tp, t.ep}, v.dense, v.sparse,
                  {{{"pp"}, {"dp_replicate"}, {"dp_shard", "cp"}, {"cp"}, {"tp"}, {"dp_replicate", "dp_shard"},
                    {"dp_replicate", "dp_shard", "cp"}, {"ep"}, {"efsdp"}, {"pp", "tp"}, {"pp", "dp_replicate", "dp_shard", "cp", "tp"}}});
}

StepRun run_step(const StepSpec& given) {
  StepSpec spec = given;
  // --preset torchtitan:FILE.toml is the job file, read whole.
  if (spec.job.empty() && spec.preset.rfind("torchtitan:", 0) == 0 && spec.preset.size() > 11 &&
      spec.preset.find('=') == std::string::npos) {
    spec.job = spec.preset.substr(11);
    spec.preset.clear();
  }
  std::optional<MegatronArgs> margs;
  if (!spec.megatron_args.empty()) {
    if (!spec.preset.empty() || !spec.job.empty()) {
      throw InvalidArgument("--megatron-args gives the job; --preset or --job gives it again: use one");
    }
    margs = parse_megatron_args(spec.megatron_args);
  }
  if (!spec.job.empty() && !spec.preset.empty()) {
    throw InvalidArgument("--job " + quote_input(spec.job) + " gives the parallel degrees; --preset " + quote_input(spec.preset) +
                          " gives them again: use one");
  }
  const SendSemantics semantics = parse_send_semantics(spec.send_semantics);
  StepRun run;
  preset::Torchtitan& t = run.degrees;
  Job& job = run.job;
  std::optional<preset::Megatron> margs_degrees;
  if (margs) margs_degrees = from_megatron_args(*margs, spec, job, run);
  const bool megatron = margs_degrees || spec.preset.rfind("megatron", 0) == 0;
  if (!margs && spec.preset.empty() && spec.job.empty()) throw InvalidArgument("meshsim step needs --preset or --job");
  Parallel layout;  // the ranks as the preset's views lay them out
  if (megatron) {
    // Megatron-core's sizes, checked by its own rules (the preset's RankGenerators), laid out in
    // its order as the preset's views are: the dense ranks as (pp, dp, cp, tp), the expert ranks
    // as (pp, edp, ep) with expert tp 1, each axis where the order puts it.
    const preset::Megatron mg = margs_degrees ? *margs_degrees : preset::megatron_spec(spec.preset);
    layout = megatron_parallel(mg, spec.world_size);  // every order the preset accepts
    t = preset::Torchtitan{mg.pp, 1, layout.dp_shard, mg.cp, mg.tp, mg.ep};
    job.framework = Framework::kMegatron;
    job.activation_checkpoint = Checkpoint::kNone;
  } else {
    std::optional<torchtitan::JobFile> file;
    if (!spec.job.empty()) file = torchtitan::read_job_file(spec.job);
    t = file ? file->degrees : preset::torchtitan_spec(spec.preset);
    // torchtitan's checks of the degrees (dp_shard resolved) and its views, as the preset has them
    const preset::TorchtitanViews views = preset::torchtitan_views(t, spec.world_size);
    t = views.degrees;
    layout = titan_parallel(views);
    if (file) {
      run.job_file = spec.job;
      from_job_file(*file, t, spec, job, run);
    }
  }
  job.parallel = layout;
  job.model = margs && margs->model && spec.model.empty() ? *margs->model : model_of(spec.model);
  if (!spec.seq_len) throw InvalidArgument("--seq-len is required with --preset (or give --job)");
  if (!spec.local_batch_size) throw InvalidArgument("--local-batch-size (sequences per rank and microbatch) is required with --preset (or give --job)");
  job.seq_len = *spec.seq_len;
  job.local_batch_size = *spec.local_batch_size;
  job.microbatches = spec.microbatches.value_or(1);
  job.lowering = parse_lowering(spec.lowering);
  if (!spec.reshard_after_forward.empty()) job.reshard_after_forward = parse_reshard(spec.reshard_after_forward);
  if (!spec.activation_checkpoint.empty()) {
    const Checkpoint ac = parse_checkpoint(spec.activation_checkpoint, job.framework);
    // Megatron's selective recomputes core attention only: no collective is issued again.
    if (!megatron || ac != Checkpoint::kSelective) job.activation_checkpoint = ac;
  }
  job.log_metrics = spec.log_metrics;
  if (!spec.load_balance) {
    if (megatron) throw InvalidArgument("--no-load-balance is torchtitan's MoE load_balance_coeff: not a Megatron setting");
    job.model.load_balance = false;
  }
  if (spec.loss_chunks) {
    if (megatron) throw InvalidArgument("--loss-chunks is torchtitan's loss.num_chunks: Megatron's loss is not chunked");
    if (*spec.loss_chunks < 1) throw InvalidArgument("--loss-chunks " + std::to_string(*spec.loss_chunks) + " is not >= 1");
    job.loss_chunks = *spec.loss_chunks;
    run.loss_chunks = job.loss_chunks;
  }
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
    std::error_code ec;
    if (!std::filesystem::exists(spec.schedule, ec)) {
      throw NotFound("--schedule " + quote_input(spec.schedule) + " is neither a schedule meshsim builds (" +
                     schedule_names() + ") nor a CSV file (there is no such file)");
    }
    job.schedule = spec.schedule;
    job.schedule_override =
        read_schedule_file(spec.schedule, t.pp, spec.stages, job.microbatches, "--schedule " + quote_input(spec.schedule),
                           job.lowering, &job.override_as_written);
  } else {
    throw InvalidArgument("--schedule " + quote_input(spec.schedule) + " needs pp > 1 in --preset");
  }
  Options& so = run.options;
  so.semantics = semantics;
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
                   {"model", {{"name", run.job.model.name}, {"parameters", job_parameter_count(run.job)},
                              {"layers", run.job.model.layers}}},
                   {"framework", framework_name(run.job.framework)},
                   {"parallel", run.job.framework == Framework::kMegatron
                                    ? nlohmann::json{{"pp", t.pp}, {"dp", t.dp_shard}, {"cp", t.cp}, {"tp", t.tp}, {"ep", t.ep}, {"etp", 1}}
                                    : nlohmann::json{{"pp", t.pp}, {"dp_replicate", t.dp_replicate}, {"dp_shard", t.dp_shard},
                                                     {"cp", t.cp}, {"tp", t.tp}, {"ep", t.ep}}},
                   {"schedule", pp ? nlohmann::json(run.job.schedule) : nlohmann::json(nullptr)},
                   {"stages", r.layout.stages},
                   {"layers_per_stage", r.layout.layer_count},
                   {"microbatches", pp ? run.job.microbatches : 1},
                   {"gradient_accumulation_steps", run.job.grad_accum_steps},
                   {"job_file", run.job_file.empty() ? nlohmann::json(nullptr) : nlohmann::json(run.job_file)},
                   {"loss_chunks", run.loss_chunks},
                   {"notes", run.notes},
                   {"send_semantics", send_semantics_name(run.options.semantics)},
                   {"lowering", pp ? nlohmann::json(r.layout.lowering) : nlohmann::json(nullptr)},
                   {"activation_checkpoint", checkpoint_name(run.job.activation_checkpoint)},
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

}  // namespace meshsim::step
