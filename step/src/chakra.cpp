#include "meshsim/chakra.hpp"
#include "meshsim/json_codec.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "meshsim/error.hpp"
#include "meshsim/text_file.hpp"

namespace meshsim::step {

std::string chakra_varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
  return out;
}

namespace {

// Protobuf's wire format, the few pieces et_def.proto needs.
void varint_field(std::string& out, int field, uint64_t v) {
  out += chakra_varint(static_cast<uint64_t>(field) << 3);  // wire type 0
  out += chakra_varint(v);
}
void bytes_field(std::string& out, int field, const std::string& bytes) {
  out += chakra_varint((static_cast<uint64_t>(field) << 3) | 2);  // wire type 2
  out += chakra_varint(bytes.size());
  out += bytes;
}

// AttributeProto: name = 1; int32_val = 7; int64_val = 9; bool_val = 27; string_val = 29.
std::string attr_int64(const std::string& name, int64_t v) {
  std::string a;
  bytes_field(a, 1, name);
  varint_field(a, 9, static_cast<uint64_t>(v));  // negative int64: ten bytes of two's complement
  return a;
}
std::string attr_int32(const std::string& name, int32_t v) {
  std::string a;
  bytes_field(a, 1, name);
  varint_field(a, 7, static_cast<uint64_t>(static_cast<int64_t>(v)));
  return a;
}
std::string attr_bool(const std::string& name, bool v) {
  std::string a;
  bytes_field(a, 1, name);
  varint_field(a, 27, v ? 1 : 0);
  return a;
}
std::string attr_string(const std::string& name, const std::string& v) {
  std::string a;
  bytes_field(a, 1, name);
  bytes_field(a, 29, v);
  return a;
}

// A message as Chakra's encode_message writes it: its length as a varint, then its bytes.
void message(std::string& file, const std::string& bytes) {
  file += chakra_varint(bytes.size());
  file += bytes;
}

int64_t comm_type(Op op) {
  switch (op) {
    case Op::kAllReduce: return 0;
    case Op::kAllGather: return 2;
    case Op::kAllToAll: return 6;
    case Op::kReduceScatter: return 7;
    default: return -1;
  }
}

}  // namespace

std::vector<int64_t> chakra_world(const StepRun& run, const std::string& which) {
  const Parallel& p = run.job.parallel;
  const int64_t world = run.report.world_size;
  std::vector<int64_t> ranks;
  if (which == "all") {
    if (world > kMaxChakraRanks) {
      throw ResourceExhausted("--chakra of " + std::to_string(world) + " ranks: at most " + std::to_string(kMaxChakraRanks) +
                              " (export one data-parallel replica with --chakra-world replica)");
    }
    for (int64_t r = 0; r < world; ++r) ranks.push_back(r);
  } else if (which == "replica") {
    const int64_t n = world / dim_size(p, Dim::kBatch);
    if (n > kMaxChakraRanks) {
      throw ResourceExhausted("--chakra-world replica holds " + std::to_string(n) + " ranks: at most " +
                              std::to_string(kMaxChakraRanks));
    }
    // Rank-major order (pp, dp_replicate, dp_shard, cp, tp): batch coordinate 0 is every
    // (pp, cp, tp) with both data-parallel coordinates 0.
    const int64_t inner = p.cp * p.tp;
    const int64_t per_pp = p.dp_replicate * p.dp_shard * inner;
    for (int64_t s = 0; s < p.pp; ++s) {
      for (int64_t k = 0; k < inner; ++k) ranks.push_back(s * per_pp + k);
    }
  } else {
    throw InvalidArgument("--chakra-world must be all or replica, not " + quote_input(which));
  }
  return ranks;
}

ChakraExport write_chakra(const StepRun& run, const std::vector<int64_t>& ranks, const std::string& prefix) {
  if (prefix.empty()) throw InvalidArgument("--chakra needs a file prefix (writes PREFIX.<npu>.et)");
  const Job& job = run.job;
  const Parallel& p = job.parallel;
  ChakraExport ex;
  ex.ranks = ranks;
  auto npu = [&](int64_t rank) -> int64_t {
    auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
    return it != ranks.end() && *it == rank ? it - ranks.begin() : -1;
  };
  // Programs by pp coordinate, counted before anything is written.
  std::map<int64_t, std::vector<Event>> by_pp;
  int64_t total = 0;
  for (int64_t r : ranks) {
    const int64_t pp = pp_coordinate(p, r);
    auto it = by_pp.find(pp);
    if (it == by_pp.end()) it = by_pp.emplace(pp, program(job, run.report.layout, pp)).first;
    total += static_cast<int64_t>(it->second.size());
    if (total > kMaxChakraNodes) {
      throw ResourceExhausted("--chakra of " + std::to_string(ranks.size()) + " ranks holds over " +
                              std::to_string(kMaxChakraNodes) + " nodes: export fewer ranks (--chakra-world replica)");
    }
  }
  std::map<std::vector<int64_t>, int64_t> group_ids;  // npu members -> pg_name
  std::map<std::pair<int64_t, int64_t>, int32_t> sent, received;  // (src npu, dst npu) -> count
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const int64_t rank = ranks[i];
    std::vector<Event> prog = by_pp.at(pp_coordinate(p, rank));
    for (const Fault& f : run.options.faults) {
      if (f.rank == rank) apply_fault(job, f, prog);
    }
    std::string file;
    {
      std::string meta;
      bytes_field(meta, 1, "1.0.0");
      message(file, meta);
    }
    std::map<Dim, std::pair<int64_t, int64_t>> group_of;  // dim -> (pg id or -1 when outside, size)
    uint64_t id = 0;
    bool has_prev = false;
    uint64_t prev = 0;
    for (const Event& e : prog) {
      std::string node;
      std::vector<std::string> attrs{attr_bool("is_cpu_op", false)};
      int type = 7;
      if (e.op == Op::kSend || e.op == Op::kRecv) {
        const int64_t peer = group_member(p, Dim::kPp, rank, e.peer);
        const int64_t peer_npu = npu(peer);
        if (peer_npu < 0) {
          ++ex.dropped["pp"];
          continue;
        }
        const int64_t me = static_cast<int64_t>(i);
        const bool send = e.op == Op::kSend;
        type = send ? 5 : 6;
        const int64_t src = send ? me : peer_npu, dst = send ? peer_npu : me;
        int32_t& k = send ? sent[{src, dst}] : received[{src, dst}];
        attrs.push_back(attr_int32("comm_src", static_cast<int32_t>(src)));
        attrs.push_back(attr_int32("comm_dst", static_cast<int32_t>(dst)));
        attrs.push_back(attr_int32("comm_tag", k++));
        attrs.push_back(attr_int64("comm_size", e.bytes));
        (send ? ex.sends : ex.recvs) += 1;
      } else {
        auto it = group_of.find(e.dim);
        if (it == group_of.end()) {
          const int64_t n = dim_size(p, e.dim);
          std::vector<int64_t> members;
          bool inside = true;
          for (int64_t k = 0; k < n && inside; ++k) {
            const int64_t m = npu(group_member(p, e.dim, rank, k));
            if (m < 0) inside = false;
            members.push_back(m);
          }
          int64_t gid = -1;
          if (inside) {
            std::sort(members.begin(), members.end());
            gid = group_ids.emplace(members, static_cast<int64_t>(group_ids.size()) + 1).first->second;
          }
          it = group_of.emplace(e.dim, std::make_pair(gid, n)).first;
        }
        const auto [gid, n] = it->second;
        if (gid < 0) {
          ++ex.dropped[std::string(dim_label(job, e.dim))];
          continue;
        }
        attrs.push_back(attr_int64("comm_type", comm_type(e.op)));
        // ASTRA-sim's data size: an all_gather's input (the event holds its output).
        attrs.push_back(attr_int64("comm_size", e.op == Op::kAllGather ? e.bytes / n : e.bytes));
        attrs.push_back(attr_string("pg_name", std::to_string(gid)));
        ++ex.collectives;
      }
      // Node: id = 1, name = 2, type = 3, data_deps = 5 (packed), attr = 10.
      varint_field(node, 1, id);
      bytes_field(node, 2, describe(e));
      varint_field(node, 3, static_cast<uint64_t>(type));
      if (has_prev) bytes_field(node, 5, chakra_varint(prev));
      for (const std::string& a : attrs) bytes_field(node, 10, a);
      message(file, node);
      prev = id++;
      has_prev = true;
      ++ex.nodes;
    }
    write_file_whole(prefix + "." + std::to_string(i) + ".et", file, "--chakra");
  }
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [members, gid] : group_ids) groups[std::to_string(gid)] = members;
  ex.groups = static_cast<int64_t>(group_ids.size());
  ex.comm_groups_path = prefix + ".comm_groups.json";
  write_file_whole(ex.comm_groups_path, json::output_text(groups) + "\n", "--chakra");
  return ex;
}

}  // namespace meshsim::step
