// Placement of a mesh's groups on hosts against a brute-force count over every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "meshsim/error.hpp"
#include "meshsim/placement.hpp"

namespace meshsim {
namespace {

// brute counts from every rank's own group (group_of), each group once.
placement::DimPlacement brute(const DeviceMesh& m, int d, int64_t g, int64_t dom) {
  std::set<std::vector<int64_t>> groups;
  for (int64_t r : m.rank_map()) groups.insert(*m.group_of(r, d));
  placement::DimPlacement p;
  p.groups = static_cast<int64_t>(groups.size());
  for (const auto& grp : groups) {
    std::set<int64_t> hosts, domains;
    for (int64_t r : grp) {
      hosts.insert(r / g);
      domains.insert(r / dom);
    }
    p.max_hosts = std::max<int64_t>(p.max_hosts, static_cast<int64_t>(hosts.size()));
    p.max_domains = std::max<int64_t>(p.max_domains, static_cast<int64_t>(domains.size()));
    p.groups_crossing_hosts += hosts.size() > 1 ? 1 : 0;
  }
  return p;
}

TEST(Placement, MatchesABruteForceCountOnRandomMeshesRankMapsAndHosts) {
  std::mt19937_64 rng(20261126);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 3);
    std::vector<int64_t> shape;
    int64_t n = 1;
    for (int i = 0; i < nd; ++i) {
      shape.push_back(1 + static_cast<int64_t>(rng() % 6));
      n *= shape.back();
    }
    // A rank map: an offset range, or a shuffled sparse set.
    std::vector<int64_t> ranks(static_cast<std::size_t>(n));
    const int64_t offset = static_cast<int64_t>(rng() % 64);
    std::iota(ranks.begin(), ranks.end(), offset);
    if (rng() % 2) {
      for (auto& r : ranks) r = r * 3 + static_cast<int64_t>(rng() % 3);
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
      if (static_cast<int64_t>(ranks.size()) != n) continue;
      std::shuffle(ranks.begin(), ranks.end(), rng);
    }
    std::vector<std::string> names{"a", "b", "c"};
    names.resize(static_cast<std::size_t>(nd));
    DeviceMesh m = DeviceMesh::from_ranks(shape, ranks, names);
    if (nd > 1 && rng() % 2) {
      // A sliced view: its groups live on the same ranks.
      m = m.slice(std::vector<std::string>{m.dim_name(nd - 1)});
    }
    placement::Hosts h;
    h.gpus_per_host = 1 + static_cast<int64_t>(rng() % 9);
    h.nvlink_domain = 1 + static_cast<int64_t>(rng() % 17);
    for (int d = 0; d < m.ndim(); ++d) {
      const placement::DimPlacement got = placement::place(m, d, h);
      const placement::DimPlacement want = brute(m, d, h.gpus_per_host, h.nvlink_domain);
      EXPECT_EQ(got.groups, want.groups) << m.to_string() << " dim " << d;
      EXPECT_EQ(got.max_hosts, want.max_hosts) << m.to_string() << " dim " << d;
      EXPECT_EQ(got.groups_crossing_hosts, want.groups_crossing_hosts) << m.to_string() << " dim " << d;
      EXPECT_EQ(got.max_domains, want.max_domains) << m.to_string() << " dim " << d;
      // A violation exists exactly when some group crosses a host.
      EXPECT_EQ(placement::violation(m, d, h, placement::Scope::kHost).has_value(), want.groups_crossing_hosts > 0);
      ++checked;
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(Placement, AViolationNamesTheDimTheFirstGroupAndItsHosts) {
  const DeviceMesh m = DeviceMesh::init({4, 8}, {{"dp", "tp"}});
  placement::Hosts h;
  h.gpus_per_host = 8;
  h.nvlink_domain = 16;
  EXPECT_FALSE(placement::violation(m, 1, h, placement::Scope::kHost));
  const auto v = placement::violation(m, 0, h, placement::Scope::kHost);
  ASSERT_TRUE(v);
  EXPECT_NE(v->find("dim dp"), std::string::npos) << *v;
  EXPECT_NE(v->find("group [0, 8, 16, 24] spans hosts [0, 1, 2, 3]"), std::string::npos) << *v;
  const auto dv = placement::violation(m, 0, h, placement::Scope::kDomain);
  ASSERT_TRUE(dv);
  EXPECT_NE(dv->find("spans domains [0, 1]"), std::string::npos) << *dv;
}

TEST(Placement, FlagsAreCheckedNamingTheFlagAndValue) {
  auto refused = [](placement::Flags f, const std::string& words) {
    try {
      placement::from_flags(f);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << words;
  };
  refused({std::nullopt, 4, {}}, "--nvlink-domain needs --gpus-per-host");
  refused({std::nullopt, std::nullopt, {"tp=host"}}, "needs --gpus-per-host");
  refused({-8, std::nullopt, {}}, "--gpus-per-host -8 is out of range");
  refused({int64_t{1} << 62, std::nullopt, {}}, "--gpus-per-host 4611686018427387904 is out of range");
  refused({8, -1, {}}, "--nvlink-domain -1 is out of range");
  refused({8, std::nullopt, {"tp=rack"}}, "'tp=rack' is not DIM=host or DIM=domain");
  refused({8, std::nullopt, {"=host"}}, "is not DIM=host");
  refused({8, 0, {}}, "--nvlink-domain 0 is out of range");
  const auto h = placement::from_flags({8, std::nullopt, {"tp=host", "ep=domain"}});
  ASSERT_TRUE(h);
  EXPECT_EQ(h->nvlink_domain, 8);
  ASSERT_EQ(h->require.size(), 2u);
  EXPECT_EQ(h->require[1].scope, placement::Scope::kDomain);
  EXPECT_THROW(placement::check_required(*h, {DeviceMesh::init({2, 4}, {{"dp", "tp"}})}), InvalidArgument);
}

}  // namespace
}  // namespace meshsim
