// mesh_generators.hpp — rapidcheck generators for DeviceMesh roots: up to 6 dims, worlds up to
// 4096 ranks, rank maps that are the identity, an offset run, a permutation or a sparse set.
//
//   #include <meshsim/testing/mesh_generators.hpp>   // target meshsim::testing
//   RC_GTEST_PROP(MyMeshes, EveryRankHasACoordinate, ()) {
//     const auto spec = *meshsim::gen::mesh_root();
//     meshsim::DeviceMesh m = spec.build();
//     for (int64_t r : spec.ranks()) RC_ASSERT(m.coordinate(r).has_value());
//   }
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "meshsim/device_mesh.hpp"

namespace meshsim::gen {

enum class RankMapKind { kIdentity, kOffset, kPermutation, kSparse };

struct MeshRootSpec {
  std::vector<int64_t> shape;
  bool named = true;
  RankMapKind kind = RankMapKind::kIdentity;
  uint64_t seed = 0;

  int64_t size() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < shape.size(); ++i) out.push_back("d" + std::to_string(i));
    return out;
  }
  // ranks are the global ranks by rank-map position.
  std::vector<int64_t> ranks() const {
    const int64_t n = size();
    std::vector<int64_t> r(static_cast<std::size_t>(n));
    std::iota(r.begin(), r.end(), int64_t{0});
    std::mt19937_64 rng(seed);
    switch (kind) {
      case RankMapKind::kIdentity:
        break;
      case RankMapKind::kOffset:
        for (int64_t& x : r) x += static_cast<int64_t>(seed % 100000);
        break;
      case RankMapKind::kPermutation:
        std::shuffle(r.begin(), r.end(), rng);
        break;
      case RankMapKind::kSparse: {
        std::set<int64_t> used;
        for (int64_t& x : r) {
          do {
            x = static_cast<int64_t>(rng() % static_cast<uint64_t>(10 * n + 10));
          } while (!used.insert(x).second);
        }
        break;
      }
    }
    return r;
  }
  int64_t world() const {
    const auto r = ranks();
    return *std::max_element(r.begin(), r.end()) + 1 + static_cast<int64_t>(seed % 3);
  }
  DeviceMesh build() const {
    MeshNames n = named ? MeshNames(names()) : std::nullopt;
    RootOptions o{.world_size = world()};
    if (kind == RankMapKind::kIdentity) return DeviceMesh::init(shape, n, o);
    auto r = ranks();
    return DeviceMesh::from_ranks(shape, r, n, o);
  }
};

inline rc::Gen<MeshRootSpec> mesh_root() {
  return rc::gen::exec([] {
    MeshRootSpec s;
    const int ndim = *rc::gen::inRange(1, 7);
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) {
      const int64_t cap = std::min<int64_t>(8, 4096 / n);
      const int64_t sz = *rc::gen::inRange<int64_t>(1, cap + 1);
      s.shape.push_back(sz);
      n *= sz;
    }
    s.named = *rc::gen::weightedElement<bool>({{5, true}, {1, false}});
    s.kind = static_cast<RankMapKind>(*rc::gen::inRange(0, 4));
    s.seed = *rc::gen::arbitrary<uint64_t>();
    return s;
  });
}

inline std::ostream& operator<<(std::ostream& os, const MeshRootSpec& s) {
  os << "MeshRootSpec{shape=[";
  for (std::size_t i = 0; i < s.shape.size(); ++i) os << (i ? "," : "") << s.shape[i];
  return os << "], named=" << s.named << ", kind=" << static_cast<int>(s.kind)
            << ", seed=" << s.seed << "}";
}

}  // namespace meshsim::gen
