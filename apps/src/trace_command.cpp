#include "meshsim/trace_command.hpp"

#include <ostream>

#include "meshsim/error.hpp"
#include "meshsim/flight_recorder.hpp"

namespace meshsim::trace_command {

int run(const Options& o, std::ostream& out) {
  if (o.format != "text" && o.format != "json") throw InvalidArgument("--format '" + o.format + "' is not text or json");
  const trace::DumpSet set = trace::read_dump_dir(o.dir, o.prefix);
  const trace::CheckReport r = trace::check_dumps(set.dumps);
  if (o.format == "json") {
    out << trace::report_json(r, set).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    out << trace::report_text(r, set);
  }
  return r.ok ? 0 : 1;
}

}  // namespace meshsim::trace_command
