// run_job.cpp — `meshsim run`'s flags as a check::Job: the part of the tool's front the Python
// module shares (meshsim.run with a flags list reads them exactly as the tool does).
#include "meshsim/error.hpp"
#include "meshsim/job_store.hpp"
#include "meshsim/run.hpp"
#include "meshsim/text_fields.hpp"

namespace meshsim::run {

check::Job job_of(const Options& o) {
  check::Job job;
  if (!check::find_engine(o.backend)) {
    throw InvalidArgument("--backend '" + o.backend + "' is not available (known: " + check::engine_names_text() + ")");
  }
  job.engine = o.backend;
  job.timeout = launch::timeout_flag(o.timeout_seconds);
  text::check_format(o.format);
  job.recipe = recipe_from_flags(o.recipe);
  job.origin = recipe_origin(o.recipe);  // a bad recipe's errors name its file or preset
  job.faults = check::parse_faults(o.faults, job.recipe.world_size);
  constexpr int64_t kMinKib = static_cast<int64_t>(kMinStackBytes >> 10), kMaxKib = static_cast<int64_t>(kMaxStackBytes >> 10);
  if (o.rank_stack_kib != 0 && (o.rank_stack_kib < kMinKib || o.rank_stack_kib > kMaxKib)) {
    throw InvalidArgument("--rank-stack-kib " + std::to_string(o.rank_stack_kib) + " is out of range [" +
                          std::to_string(kMinKib) + ", " + std::to_string(kMaxKib) + "]");
  }
  job.stack_bytes = static_cast<std::size_t>(o.rank_stack_kib) << 10;
  job.every_group = o.format == "json";
  job.max_elements = o.max_elements;
  job.hosts = placement::from_flags(o.placement);
  job.interrupted = o.interrupted;
  return job;
}

}  // namespace meshsim::run
