// DeviceMesh properties: random roots and random chains of slice / flatten / unflatten /
// concatenate, every result checked against the brute-force permute/reshape reference; groups
// partition the ranks; identity, hashing, the group cache and save/load follow their laws;
// every rejected step is a meshsim::Error predicted by the reference's rules.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <map>
#include <set>

#include "meshsim/testing/mesh_generators.hpp"
#include "mesh_reference.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"
#include "meshsim/mesh_json.hpp"

namespace meshsim {
namespace {

using ref::Array;
using ref::RefMesh;

struct Handle {
  DeviceMesh mesh;
  RefMesh ref;
};

struct Run {
  std::vector<int64_t> ranks;  // by position
  std::vector<std::string> root_names;
  std::map<std::string, Array> registry;  // flatten name -> copy at position 0
  std::vector<Handle> handles;
  int fresh = 0;
};

Array to_ranks(const Run& run, const Array& positions) {
  Array out;
  for (int64_t p : positions) out.push_back(run.ranks[static_cast<std::size_t>(p)]);
  return out;
}

// check_same asserts that the layout mesh and the reference describe the same mesh.
void check_same(const Run& run, const Handle& h) {
  const DeviceMesh& m = h.mesh;
  const RefMesh& r = h.ref;
  const auto n = static_cast<int64_t>(run.ranks.size());
  RC_ASSERT(m.shape() == r.shape);
  RC_ASSERT(m.names().has_value() == !r.names.empty());
  if (m.names()) RC_ASSERT(*m.names() == r.names);
  RC_ASSERT(m.copies() == static_cast<int64_t>(r.copies.size()));
  const ref::Where where = ref::locate_all(r, n);
  for (int64_t p = 0; p < n; ++p) {
    RC_ASSERT(where.copy[static_cast<std::size_t>(p)] < r.copies.size());
    RC_ASSERT(m.coordinate(run.ranks[static_cast<std::size_t>(p)]) ==
              ref::unravel(where.index[static_cast<std::size_t>(p)], r.shape));
  }
  std::vector<std::vector<Array>> rows_by_dim;
  for (int d = 0; d < m.ndim(); ++d) {
    std::vector<Array> rows = ref::dim_rows(r, d);
    std::vector<Array> want;
    std::vector<bool> seen(static_cast<std::size_t>(n), false);
    for (const Array& row : rows) {
      want.push_back(to_ranks(run, row));
      RC_ASSERT(static_cast<int64_t>(row.size()) == m.size(d));
      for (int64_t p : row) {
        RC_ASSERT(!seen[static_cast<std::size_t>(p)]);  // the rows partition the ranks
        seen[static_cast<std::size_t>(p)] = true;
      }
    }
    RC_ASSERT(std::find(seen.begin(), seen.end(), false) == seen.end());
    RC_ASSERT(m.groups(d) == want);
    // The one-buffer listing holds the same rows.
    const GroupTable table = m.group_table(d);
    RC_ASSERT(table.count == static_cast<int64_t>(want.size()));
    RC_ASSERT(table.size == m.size(d));
    for (std::size_t g = 0; g < want.size(); ++g) {
      const auto row = table.row(static_cast<int64_t>(g));
      RC_ASSERT(std::vector<int64_t>(row.begin(), row.end()) == want[g]);
    }
    rows_by_dim.push_back(std::move(rows));
  }
  // Rank-scoped answers on a sample of ranks.
  for (int s = 0; s < 4; ++s) {
    const int64_t p = *rc::gen::inRange<int64_t>(0, n);
    const int64_t rank = run.ranks[static_cast<std::size_t>(p)];
    const std::size_t k = where.copy[static_cast<std::size_t>(p)];
    auto arr = m.mesh_for(rank);
    RC_ASSERT(arr.has_value());
    RC_ASSERT(arr->values == to_ranks(run, r.copies[k]));
    RC_ASSERT(arr->values[static_cast<std::size_t>(where.index[static_cast<std::size_t>(p)])] == rank);
    for (int d = 0; d < m.ndim(); ++d) {
      for (const Array& row : rows_by_dim[static_cast<std::size_t>(d)]) {
        auto at = std::find(row.begin(), row.end(), p);
        if (at == row.end()) continue;
        RC_ASSERT(m.group_of(rank, d) == to_ranks(run, row));
        RC_ASSERT(m.local_rank(rank, d) == at - row.begin());  // local rank = coordinate
        break;
      }
    }
  }
}

// spliced replaces element d of v by `with` (unflatten's rule for shapes and names).
template <typename T>
std::vector<T> spliced(const std::vector<T>& v, int d, const std::vector<T>& with) {
  std::vector<T> out(v.begin(), v.begin() + d);
  out.insert(out.end(), with.begin(), with.end());
  out.insert(out.end(), v.begin() + d + 1, v.end());
  return out;
}

// pick_dims picks k distinct dims of an n-dim mesh, in ascending order or shuffled.
std::vector<int> pick_dims(int n) {
  std::vector<int> all(static_cast<std::size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  const int k = *rc::gen::inRange(1, n + 1);
  std::vector<int> out;
  for (int i = 0; i < k; ++i) {
    const auto at = *rc::gen::inRange<std::size_t>(0, all.size());
    out.push_back(all[at]);
    all.erase(all.begin() + static_cast<std::ptrdiff_t>(at));
  }
  if (*rc::gen::weightedElement<bool>({{2, true}, {1, false}})) std::sort(out.begin(), out.end());
  return out;
}

// dim_fn is dim d's rank-map displacements (the row through position 0).
Array dim_fn(const RefMesh& r, int d) { return ref::dim_rows(r, d).front(); }

// slice_may_fail: meshsim checks the order of the selected modes' strides (PyTorch's rule);
// the reference knows a dim's stride when its row is an arithmetic progression of size > 1.
// Size-1 dims keep any stride, so the reference cannot predict their order.
bool slice_must_succeed(const RefMesh& r, const std::vector<int>& sel) {
  int64_t prev = -1;
  for (std::size_t k = sel.size(); k-- > 0;) {
    Array f = dim_fn(r, sel[k]);
    if (f.size() < 2) return false;
    const int64_t stride = f[1] - f[0];
    for (std::size_t j = 1; j < f.size(); ++j) {
      if (f[j] - f[j - 1] != stride) return false;  // a nested (non-contiguous) dim
    }
    if (stride < prev) return false;
    prev = stride;
  }
  return true;
}

bool slice_must_fail(const RefMesh& r, const std::vector<int>& sel) {
  // Out of order among arithmetic dims of size > 1.
  int64_t prev = -1;
  for (std::size_t k = sel.size(); k-- > 0;) {
    Array f = dim_fn(r, sel[k]);
    if (f.size() < 2) continue;
    bool arithmetic = true;
    for (std::size_t j = 1; j < f.size(); ++j) arithmetic = arithmetic && f[j] - f[j - 1] == f[1] - f[0];
    if (!arithmetic) continue;
    if (f[1] - f[0] < prev) return true;
    prev = f[1] - f[0];
  }
  return false;
}

template <typename F>
std::optional<DeviceMesh> attempt(F&& f) {
  try {
    return f();
  } catch (const Error&) {
    return std::nullopt;  // anything else escapes and fails the property
  }
}

void step(Run& run) {
  const Handle h = run.handles[*rc::gen::inRange<std::size_t>(0, run.handles.size())];
  const RefMesh& r = h.ref;
  const int op = *rc::gen::inRange(0, 4);
  const int n = h.mesh.ndim();
  if (op == 0) {  // slice
    if (r.names.empty()) {
      RC_ASSERT_THROWS_AS(h.mesh.slice("d0"), FailedPrecondition);
      return;
    }
    std::vector<int> sel = pick_dims(n);
    std::vector<std::string> names;
    for (int d : sel) names.push_back(r.names[static_cast<std::size_t>(d)]);
    auto got = attempt([&] { return h.mesh.slice(names); });
    if (names == r.names) {  // all own names in order: the mesh itself, whatever its strides
      RC_ASSERT(got.has_value() && *got == h.mesh);
      return;
    }
    if (!got) {
      RC_ASSERT(!slice_must_succeed(r, sel));
      return;
    }
    RC_ASSERT(!slice_must_fail(r, sel));
    run.handles.push_back({*got, ref::slice(r, sel)});
  } else if (op == 1) {  // flatten
    const int choice = *rc::gen::inRange(0, 4);
    std::optional<std::string> name;
    if (choice > 0) name = "f" + std::to_string(choice);
    auto got = attempt([&] { return h.mesh.flatten(name); });
    if (r.names.empty()) {
      RC_ASSERT(!got);
      return;
    }
    std::string flat = name.value_or("");
    if (!name) {
      for (std::size_t i = 0; i < r.names.size(); ++i) flat += (i ? "_" : "") + r.names[i];
    }
    if (n == 1 && flat == r.names[0]) {
      RC_ASSERT(got && *got == h.mesh);
      return;
    }
    const bool root_dim =
        std::find(run.root_names.begin(), run.root_names.end(), flat) != run.root_names.end();
    const auto it = run.registry.find(flat);
    const bool clash = it != run.registry.end() && it->second != r.copies.front();
    RC_ASSERT(got.has_value() == !(root_dim || clash));
    if (!got) return;
    run.registry.emplace(flat, r.copies.front());
    run.handles.push_back({*got, ref::reshape(r, {ref::product(r.shape)}, {flat})});
  } else if (op == 2) {  // unflatten
    const int d = *rc::gen::inRange(0, n);
    int64_t left = r.shape[static_cast<std::size_t>(d)];
    std::vector<int64_t> sizes;
    const int parts = *rc::gen::inRange(1, 4);
    for (int i = 0; i + 1 < parts; ++i) {
      std::vector<int64_t> divisors;
      for (int64_t x = 1; x <= left; ++x) {
        if (left % x == 0) divisors.push_back(x);
      }
      const int64_t f = *rc::gen::elementOf(divisors);
      sizes.push_back(f);
      left /= f;
    }
    sizes.push_back(left);
    std::vector<std::string> names;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const bool collide = !r.names.empty() && *rc::gen::weightedElement<bool>({{1, true}, {9, false}});
      names.push_back(collide ? r.names.front() : "u" + std::to_string(run.fresh++));
    }
    auto got = attempt([&] { return h.mesh.unflatten(d, sizes, names); });
    if (r.names.empty()) {
      RC_ASSERT(!got);
      return;
    }
    const std::vector<std::string> new_names = spliced(r.names, d, names);
    std::set<std::string> unique(new_names.begin(), new_names.end());
    RefMesh want = ref::reshape(r, spliced(r.shape, d, sizes), new_names);
    if (unique.size() != new_names.size()) {
      RC_ASSERT(!got);
      return;
    }
    // A reshape that is not additive over the new dims has no layout (PyTorch's composition
    // asserts too): meshsim must refuse exactly those.
    RC_ASSERT(got.has_value() == ref::additive(want));
    if (!got) return;
    run.handles.push_back({*got, want});
  } else {  // concatenate
    const int k = *rc::gen::inRange(1, 4);
    std::vector<DeviceMesh> meshes;
    std::vector<RefMesh> refs;
    std::vector<std::string> names;
    auto add = [&](const DeviceMesh& m, const RefMesh& rm) {
      meshes.push_back(m);
      refs.push_back(rm);
      names.insert(names.end(), rm.names.begin(), rm.names.end());
    };
    if (!r.names.empty() && n > 1 && *rc::gen::arbitrary<bool>()) {
      // Complementary slices of one mesh, in either order: these never overlap.
      std::vector<int> a = pick_dims(n);
      std::sort(a.begin(), a.end());
      std::vector<int> b;
      for (int d = 0; d < n; ++d) {
        if (std::find(a.begin(), a.end(), d) == a.end()) b.push_back(d);
      }
      RC_PRE(!b.empty());
      auto names_of = [&](const std::vector<int>& dims) {
        std::vector<std::string> out;
        for (int d : dims) out.push_back(r.names[static_cast<std::size_t>(d)]);
        return out;
      };
      auto sa = attempt([&] { return h.mesh.slice(names_of(a)); });
      auto sb = attempt([&] { return h.mesh.slice(names_of(b)); });
      RC_PRE(sa.has_value() && sb.has_value());
      if (*rc::gen::arbitrary<bool>()) {
        add(*sa, ref::slice(r, a));
        add(*sb, ref::slice(r, b));
      } else {
        add(*sb, ref::slice(r, b));
        add(*sa, ref::slice(r, a));
      }
    } else {
      for (int i = 0; i < k; ++i) {
        const Handle& p = run.handles[*rc::gen::inRange<std::size_t>(0, run.handles.size())];
        add(p.mesh, p.ref);
      }
    }
    auto got = attempt([&] { return DeviceMesh::concatenate(meshes); });
    auto want = ref::concatenate(refs, static_cast<int64_t>(run.ranks.size()));
    std::set<std::string> unique(names.begin(), names.end());
    RC_ASSERT(got.has_value() == (want.has_value() && unique.size() == names.size()));
    if (!got) return;
    run.handles.push_back({*got, *want});
  }
  check_same(run, run.handles.back());
  RC_TAG(op == 0 ? "slice" : op == 1 ? "flatten" : op == 2 ? "unflatten" : "concatenate");
}

Run start(const gen::MeshRootSpec& spec);

// random_run builds a random root and applies between lo and hi - 1 random steps.
Run random_run(const gen::MeshRootSpec& spec, int lo, int hi) {
  Run run = start(spec);
  const int steps = *rc::gen::inRange(lo, hi);
  for (int i = 0; i < steps; ++i) step(run);
  return run;
}

Run start(const gen::MeshRootSpec& spec) {
  Run run;
  run.ranks = spec.ranks();
  if (spec.named) run.root_names = spec.names();
  run.handles.push_back({spec.build(), ref::root(spec.shape, run.root_names)});
  check_same(run, run.handles.front());
  return run;
}

RC_GTEST_PROP(DeviceMeshProps, RandomProgramsAgreeWithTheBruteForceReference, ()) {
  const auto spec = *gen::mesh_root();
  Run run = random_run(spec, 1, 8);
}

RC_GTEST_PROP(DeviceMeshProps, EqualityIsUniverseCanonicalLayoutAndNames, ()) {
  const auto spec = *gen::mesh_root();
  Run run = random_run(spec, 1, 8);
  // Roots, slices, flattens and unflattens derive the canonical layout from their parts' (or
  // copy a flat layout) instead of coalescing every dim again: it must still be each dim's
  // coalesced layout.
  for (const Handle& a : run.handles) {
    const Layout& l = a.mesh.layout();
    const Layout& c = a.mesh.canonical_layout();
    RC_ASSERT(c.shape().is_tuple());
    RC_ASSERT(c.rank() == l.rank());
    for (int d = 0; d < l.rank(); ++d) RC_ASSERT(c[d] == coalesce(l[d]));
  }
  for (const Handle& a : run.handles) {
    for (const Handle& b : run.handles) {
      bool same = a.ref.names == b.ref.names && a.ref.shape.size() == b.ref.shape.size();
      for (int d = 0; same && d < static_cast<int>(a.ref.shape.size()); ++d) {
        same = dim_fn(a.ref, d) == dim_fn(b.ref, d);
      }
      RC_ASSERT((a.mesh == b.mesh) == same);
      if (a.mesh == b.mesh) RC_ASSERT(a.mesh.hash() == b.mesh.hash());
      RC_ASSERT(equivalent(a.mesh, b.mesh) == same);
    }
  }
  // Another universe with the same ranks: never equal, equivalent iff same content.
  Run other = start(spec);
  RC_ASSERT(other.handles[0].mesh != run.handles[0].mesh);
  RC_ASSERT(equivalent(other.handles[0].mesh, run.handles[0].mesh));
}

RC_GTEST_PROP(DeviceMeshProps, GroupCacheHitsIffTheKeyRepeats, ()) {
  const auto spec = *gen::mesh_root();
  Run run = random_run(spec, 1, 6);
  const BackendConfig gloo{.backend = "gloo", .timeout = std::chrono::milliseconds(100)};
  std::set<std::pair<Array, int>> keys;
  int64_t calls = 0;
  std::map<std::pair<Array, int>, std::shared_ptr<const GroupRecord>> records;
  for (const Handle& h : run.handles) {
    for (int d = 0; d < h.mesh.ndim(); ++d) {
      const int which = *rc::gen::inRange(0, 2);
      auto rec = which == 0 ? h.mesh.group_record(d) : h.mesh.group_record(d, gloo);
      ++calls;
      auto key = std::make_pair(dim_fn(h.ref, d), which);
      keys.insert(key);
      auto [it, fresh] = records.emplace(key, rec);
      RC_ASSERT(it->second == rec);  // the same key always gives the same record
      RC_ASSERT(rec->rows() == h.mesh.groups(d));
    }
  }
  const CacheStats s = run.handles[0].mesh.cache_stats();
  RC_ASSERT(s.misses == static_cast<int64_t>(keys.size()));
  RC_ASSERT(s.hits == calls - static_cast<int64_t>(keys.size()));
}

RC_GTEST_PROP(DeviceMeshProps, SaveLoadRoundTripsToAnEquivalentMesh, ()) {
  const auto spec = *gen::mesh_root();
  Run run = random_run(spec, 0, 6);
  const Handle& h = *rc::gen::elementOf(run.handles);
  const std::string text = save_mesh(h.mesh);
  DeviceMesh back = load_mesh(text);
  RC_ASSERT(back != h.mesh);
  RC_ASSERT(equivalent(back, h.mesh));
  RC_ASSERT(save_mesh(back) == text);
  check_same(run, Handle{back, h.ref});
}

RC_GTEST_PROP(DeviceMeshProps, UnflattenThenFlattenRestoresTheDim, ()) {
  const auto spec = *gen::mesh_root();
  Run run = random_run(spec, 0, 5);
  const Handle& h = *rc::gen::elementOf(run.handles);
  RC_PRE(h.mesh.names().has_value());
  const int d = *rc::gen::inRange(0, h.mesh.ndim());
  const int64_t s = h.mesh.size(d);
  std::vector<int64_t> divisors;
  for (int64_t x = 1; x <= s; ++x) {
    if (s % x == 0) divisors.push_back(x);
  }
  const int64_t a = *rc::gen::elementOf(divisors);
  const std::vector<int64_t> sizes{a, s / a};
  const std::vector<std::string> names{"split_a", "split_b"};
  auto attempt_u = attempt([&] { return h.mesh.unflatten(d, sizes, names); });
  if (!attempt_u) {  // only a reshape no layout can express is refused
    RC_ASSERT(!ref::additive(ref::reshape(h.ref, spliced(h.ref.shape, d, sizes), {})));
    return;
  }
  const DeviceMesh& u = *attempt_u;
  RC_ASSERT(u.ndim() == h.mesh.ndim() + 1);
  // The inner new dim's groups are contiguous runs inside the old dim's groups.
  const std::vector<Array> old_groups = h.mesh.groups(d);
  for (const Array& g : u.groups(d + 1)) {
    bool inside = false;
    for (const Array& big : old_groups) {
      inside = inside || std::search(big.begin(), big.end(), g.begin(), g.end()) != big.end();
    }
    RC_ASSERT(inside);
  }
  // Unflatten then flatten restores the dim (on the dim as a 1-D mesh).
  std::optional<DeviceMesh> one =
      h.mesh.ndim() == 1 ? std::optional(h.mesh) : attempt([&] { return h.mesh.slice(h.mesh.dim_name(d)); });
  RC_PRE(one.has_value());
  DeviceMesh back = one->unflatten(0, sizes, names).flatten("restored");
  RC_ASSERT(back.groups(0) == one->groups(0));
  for (int s = 0; s < 8; ++s) {
    const int64_t r = *rc::gen::elementOf(run.ranks);
    RC_ASSERT(back.mesh_for(r)->values == one->mesh_for(r)->values);
  }
}

TEST(DeviceMeshProps, HostileProgramsNeverCrash) {
  // Fixed adversarial inputs beside the random ones: huge sizes, deep chains, repeated flattens.
  DeviceMesh m = DeviceMesh::init({int64_t{1} << 31, int64_t{1} << 31}, std::vector<std::string>{"a", "b"});
  EXPECT_THROW(m.unflatten(0, std::vector<int64_t>{int64_t{1} << 31, 3}, std::vector<std::string>{"x", "y"}),
               InvalidArgument);
  DeviceMesh cur = DeviceMesh::init({1 << 12}, std::vector<std::string>{"w"});
  for (int i = 0; i < 12; ++i) {
    cur = cur.unflatten(0, std::vector<int64_t>{2, cur.size(0) / 2},
                        std::vector<std::string>{"x" + std::to_string(i), "rest" + std::to_string(i)})
              .slice(std::vector<std::string>{"rest" + std::to_string(i)});
    if (cur.size(0) == 1) break;
  }
  EXPECT_EQ(cur.size(), 1);
  EXPECT_THROW(DeviceMesh::init({int64_t{1} << 62, 4}), OverflowError);
}

}  // namespace
}  // namespace meshsim
