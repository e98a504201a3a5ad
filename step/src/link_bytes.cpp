// Bytes per link: what every dim's collectives send inside a host and across hosts, every rank
// counted (O(world x dims) group walks; the events are the pp ranks' programs).
#include <map>
#include <string>
#include <vector>

#include "step_check.hpp"

namespace meshsim::step::detail {

namespace {

// sent: the bytes one rank sends for a collective, by ring (all_gather, reduce_scatter,
// all_reduce) or pairwise exchange (all_to_all, to each other member).
int64_t ring_sent(const Event& e, int64_t n) {
  // floor(bytes x (n - 1) / n) without a wide product: n is at most the world size.
  const int64_t share = e.bytes / n * (n - 1) + (e.bytes % n) * (n - 1) / n;
  switch (e.op) {
    case Op::kAllGather:
    case Op::kReduceScatter: return share;
    case Op::kAllReduce: return checked_mul(share, 2, "an all-reduce's ring bytes");
    default: return e.bytes;
  }
}

}  // namespace

void Checker::links(int64_t gpus, Report& r) const {
  LinkBytes world{};
  for (int d = 0; d < kDims; ++d) {
    const Dim dim = static_cast<Dim>(d);
    const int64_t n = dim_size(p_, dim);
    if (n < 2) continue;
    // Per pp coordinate: ranks whose ring successor is on their host; for all_to_all, the
    // members each rank shares a host with (itself left out).
    std::vector<int64_t> ring_same(p_.pp, 0), pair_same(p_.pp, 0), ranks_at(p_.pp, 0);
    std::vector<std::map<int64_t, int64_t>> peer_same(p_.pp);  // pp -> peer pp -> ranks on one host
    for (int64_t rank = 0; rank < world_; ++rank) {
      if (leader(p_, dim, rank) != rank) continue;
      const auto members = group_members(p_, dim, rank);
      std::map<int64_t, int64_t> per_host;
      for (int64_t m : members) ++per_host[m / gpus];
      for (std::size_t k = 0; k < members.size(); ++k) {
        const int64_t m = members[k], next = members[(k + 1) % members.size()];
        const int64_t pp = pp_coordinate(p_, m);
        ++ranks_at[pp];
        if (m / gpus == next / gpus) ++ring_same[pp];
        pair_same[pp] += per_host[m / gpus] - 1;
      }
    }
    if (dim == Dim::kPp) {
      for (int64_t rank = 0; rank < world_; ++rank) {
        const int64_t pp = pp_coordinate(p_, rank);
        for (int64_t q : {pp - 1, pp + 1}) {
          if (q < 0 || q >= p_.pp) continue;
          peer_same[pp][q] += (rank / gpus == with_pp(p_, rank, q) / gpus) ? 1 : 0;
        }
      }
    }
    LinkBytes here{};
    const std::string what = "the " + std::string(dim_name(dim)) + " dim's link bytes";
    for (int64_t pp = 0; pp < p_.pp; ++pp) {
      for (const Event& e : base_[pp]) {
        if (e.dim != dim || e.op == Op::kRecv) continue;
        int64_t intra = 0, inter = 0;
        if (e.op == Op::kSend) {
          const auto it = peer_same[pp].find(e.peer);
          const int64_t same = it == peer_same[pp].end() ? 0 : it->second;
          intra = checked_mul(e.bytes, same, what);
          inter = checked_mul(e.bytes, ranks_at[pp] - same, what);
        } else if (e.op == Op::kAllToAll) {
          const int64_t share = e.bytes / n;
          intra = checked_mul(share, pair_same[pp], what);
          inter = checked_mul(share, checked_mul(ranks_at[pp], n - 1, what) - pair_same[pp], what);
        } else {
          const int64_t sent = ring_sent(e, n);
          intra = checked_mul(sent, ring_same[pp], what);
          inter = checked_mul(sent, ranks_at[pp] - ring_same[pp], what);
        }
        here.intra_host = checked_add(here.intra_host, intra, what);
        here.inter_host = checked_add(here.inter_host, inter, what);
      }
    }
    LinkBytes& slot = r.link_by_dim[std::string(dim_label(job_, dim))];  // Megatron's dp_cp names two dims
    slot.intra_host = checked_add(slot.intra_host, here.intra_host, "the dim's link bytes");
    slot.inter_host = checked_add(slot.inter_host, here.inter_host, "the dim's link bytes");
    world.intra_host = checked_add(world.intra_host, here.intra_host, "the world's link bytes");
    world.inter_host = checked_add(world.inter_host, here.inter_host, "the world's link bytes");
  }
  r.by_link = world;
}

}  // namespace meshsim::step::detail
