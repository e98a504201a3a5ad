// chakra.hpp — one step's programs as MLCommons Chakra execution traces, the input of network
// simulators such as ASTRA-sim: `meshsim step ... --chakra PREFIX`.
//
// One file PREFIX.<npu>.et per rank of the exported world (schema/protobuf/et_def.proto as on
// mlcommons/chakra's main branch, last changed at a1120ddcb50bb3f436a94c8abb40654907f263a6,
// 2024-05-09): varint-length-prefixed protobuf messages, a GlobalMetadata (version "1.0.0", as
// Chakra's generator writes it since 34f95f96d90c461d7037670931cc1dd25653b49c, 2026-05-20) then
// one Node per event in program order: COMM_COLL_NODE (7), COMM_SEND_NODE (5) or COMM_RECV_NODE
// (6), each with a data dependency on the one before, and the attributes Chakra's feeder reads
// (src/feeder/et_feeder_node.cpp at mlcommons/chakra 21585d8f2d65603d791d2121e3d4632351120262),
// each in the value kind it reads: is_cpu_op (bool_val, false), comm_type (int64_val: ALL_REDUCE
// 0, ALL_GATHER 2, ALL_TO_ALL 6, REDUCE_SCATTER 7), comm_size (int64_val), pg_name (string_val)
// for collectives; comm_src, comm_dst, comm_tag (int32_val) for sends and receives. Plus
// PREFIX.comm_groups.json, ASTRA-sim's communicator groups {"<pg_name>": [npu, ...]}.
//
// comm_size is the bytes ASTRA-sim's collectives take as their data size
// (astra-sim/system/collective/Ring.cc at astra-sim/astra-sim
// 0ea03a36887adcb50bfa12a58cb7c023710d584b): All_Gather's final size is data_size x ranks, so an
// all_gather's comm_size is its input (one rank's shard, not the gathered output);
// Reduce_Scatter's final size is data_size / ranks, so a reduce_scatter's comm_size is its
// input (the whole buffer); an all_reduce's its buffer, an all_to_all's its input. A send's and
// a receive's is the tensor; the k-th send from one NPU to another has tag k, as does the k-th
// receive at the other from the one.
//
// The exported world is every rank, or a sub-world (the ranks of one data-parallel replica: a
// pipeline group x the context- and tensor-parallel ranks, where the batch coordinate is 0),
// numbered 0..n-1 in rank order; collectives whose group reaches outside it are left out and
// counted per dim.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "meshsim/step_job.hpp"

namespace meshsim::step {

inline constexpr int64_t kMaxChakraRanks = 1 << 14;
inline constexpr int64_t kMaxChakraNodes = int64_t{1} << 26;

struct ChakraExport {
  std::vector<int64_t> ranks;             // the exported world's ranks; npu i is ranks[i]
  int64_t nodes = 0, collectives = 0, sends = 0, recvs = 0, groups = 0;
  std::map<std::string, int64_t> dropped;  // dim -> collectives left out (their group reaches outside)
  std::string comm_groups_path;
};

// chakra_world: the ranks of "all" (every rank) or "replica" (batch coordinate 0). Errors:
// InvalidArgument for another name, ResourceExhausted past kMaxChakraRanks.
std::vector<int64_t> chakra_world(const StepRun& run, const std::string& which);

// write_chakra writes PREFIX.<npu>.et for each of `ranks` (faults of the run applied) and
// PREFIX.comm_groups.json. Errors: InvalidArgument when a file cannot be written,
// ResourceExhausted past kMaxChakraNodes.
ChakraExport write_chakra(const StepRun& run, const std::vector<int64_t>& ranks, const std::string& prefix);

// chakra_varint / chakra_node_bytes: the encoding, for tests.
std::string chakra_varint(uint64_t v);

}  // namespace meshsim::step
