// trace_command.hpp — `meshsim trace check DIR`: every rank's Flight Recorder dump in DIR read
// (pickle or JSON) and checked across ranks: membership, missing dumps, ranks that never issued
// a collective others wait in, type / size / dtype / state mismatches, send/recv pairs, and the
// culprits a hang's waits lead to.
//
//   meshsim trace check comm_traces --prefix rank_
//   meshsim trace check comm_traces --format json --jobs 8
//   meshsim trace check comm_traces --against "--preset torchtitan:pp=4,dp_shard=8 --model llama3-8b --seq-len 8192 --local-batch-size 1"
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

namespace meshsim::trace_command {

struct Options {
  std::string dir;                    // the dumps' directory
  std::optional<std::string> prefix;  // the text before each file's rank (default: inferred)
  std::string format = "text";        // or "json"
  // The plan the dumps are held to: `meshsim step`'s flags that define a step ("--preset
  // torchtitan:... --model llama3-8b --seq-len 8192 ..."), or "@FILE" holding them; split into
  // words as a POSIX shell does (quotes and backslashes), so `--megatron-args '...'` reads as one
  // value. Given but empty (an unset shell variable) is refused, never taken as "no plan".
  std::optional<std::string> against;
  // Threads that read and decode the dumps (default: one per core; the report is the same for
  // any number).
  std::optional<int64_t> jobs;
};

// run prints the report and returns 0 (OK) or 1 (problems found). Unreadable or malformed dumps
// throw meshsim::Error naming the file.
int run(const Options& o, std::ostream& out);

}  // namespace meshsim::trace_command
