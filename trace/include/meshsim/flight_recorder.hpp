// flight_recorder.hpp — PyTorch's Flight Recorder dumps read and checked across ranks: what
// `meshsim trace check DIR` runs after a job hung. This header gathers trace/'s parts:
// fr_schema.hpp (a dump's records), dump_reader.hpp (reading dumps), fr_check.hpp (the check,
// its problem kinds), fr_report.hpp (the reports); plan_check.hpp holds dumps to a step's plan.
//
// A dump is one rank's ring buffer of collective and point-to-point records, written by c10d's
// FlightRecorder (torch/csrc/distributed/c10d/FlightRecorder.hpp, FlightRecorderDetail.hpp at
// pytorch/pytorch cb41e3a4d13921611dde43bb6aa6cf38d22f7f73: `version` "2.x", `pg_config` {name:
// {name, desc, ranks "[0, 1]"}}, `entries` [{record_id, pg_id, process_group (name, desc),
// collective_seq_id, p2p_seq_id, op_id, profiling_name "nccl:all_reduce" / "nccl:send 0->1" /
// "nccl:recv 1<-0", input_sizes, input_dtypes, output_sizes, output_dtypes, state scheduled |
// started | completed, is_p2p, ...}]) as a pickle (read by pickle.hpp's bounded reader) or as
// the same fields in JSON (`_dump_nccl_trace_json`). Files are `<prefix><rank>` as PyTorch's
// analyzer (torch/distributed/flight_recorder/fr_trace.py) finds them, in DIR or below it.
//
// The check covers every process group at once and reports every problem, not the first:
// membership disagreements, missing dumps, ranks that never issued a group's Nth collective
// while its other members wait in it, type / size / dtype / state mismatches of the Nth
// collective (the odd ranks named against the majority), each entry's own size rule (all_gather
// output = input x group size, reduce_scatter input = output x group size, all_reduce in = out),
// and sends paired with receives per (src, dst) in order. A hang is then followed through the
// ranks' waits to the ranks that hold everyone up (the culprits), or to a cycle of waits.
//
//   DumpSet set = read_dump_dir("comm_traces", "rank_");
//   CheckReport r = check_dumps(set.dumps);   // r.ok, r.problems, r.culprits
//
// Entries a ring buffer dropped are never taken for missing ones: a rank is said to have never
// issued collective #N of a group only when its newest record of that group is older than #N.
// Errors: ParseError / InvalidArgument naming the file and the field for a malformed dump;
// ResourceExhausted over the bounds (files, bytes, entries). Thread safety: plain values.
#pragma once

#include "meshsim/dump_reader.hpp"
#include "meshsim/fr_check.hpp"
#include "meshsim/fr_report.hpp"
#include "meshsim/fr_schema.hpp"
