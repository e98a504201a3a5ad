// mesh_reference.hpp — a brute-force DeviceMesh that materialises every copy of the mesh as an
// N-d array of rank-map positions and transforms it with permute/reshape, the algorithm PyTorch
// used before layouts. The properties check meshsim's layout bookkeeping against it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshsim::ref {

using Array = std::vector<int64_t>;  // row-major values

struct RefMesh {
  std::vector<int64_t> shape;
  std::vector<std::string> names;  // empty for an unnamed mesh
  std::vector<Array> copies;       // sorted by first element (PyTorch's complement order)
};

inline int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

inline std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> c(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    c[d] = i % shape[d];
    i /= shape[d];
  }
  return c;
}

inline int64_t ravel(const std::vector<int64_t>& c, const std::vector<int64_t>& shape) {
  int64_t i = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + c[d];
  return i;
}

inline void sort_copies(std::vector<Array>& copies) {
  std::sort(copies.begin(), copies.end(),
            [](const Array& a, const Array& b) { return a.front() < b.front(); });
}

inline RefMesh root(const std::vector<int64_t>& shape, std::vector<std::string> names) {
  Array a(static_cast<std::size_t>(product(shape)));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int64_t>(i);
  return RefMesh{shape, std::move(names), {a}};
}

// slice keeps dims `sel` (in that order): every copy splits into one sub-array per setting of
// the other dims (permute the selected dims last, reshape).
inline RefMesh slice(const RefMesh& m, const std::vector<int>& sel) {
  RefMesh out;
  for (int d : sel) {
    out.shape.push_back(m.shape[static_cast<std::size_t>(d)]);
    if (!m.names.empty()) out.names.push_back(m.names[static_cast<std::size_t>(d)]);
  }
  std::vector<int> rest;
  std::vector<int64_t> rest_shape;
  for (int d = 0; d < static_cast<int>(m.shape.size()); ++d) {
    if (std::find(sel.begin(), sel.end(), d) == sel.end()) {
      rest.push_back(d);
      rest_shape.push_back(m.shape[static_cast<std::size_t>(d)]);
    }
  }
  const int64_t inner = product(out.shape);
  // Row-major strides of the parent, so a sub-array element is a dot product.
  std::vector<int64_t> st(m.shape.size(), 1);
  for (std::size_t d = m.shape.size(); d-- > 1;) st[d - 1] = st[d] * m.shape[d];
  std::vector<int64_t> offsets;  // parent offset of each selected coordinate, row-major
  for (int64_t i = 0; i < inner; ++i) {
    std::vector<int64_t> sc = unravel(i, out.shape);
    int64_t off = 0;
    for (std::size_t k = 0; k < sel.size(); ++k) off += sc[k] * st[static_cast<std::size_t>(sel[k])];
    offsets.push_back(off);
  }
  for (const Array& copy : m.copies) {
    for (int64_t o = 0; o < product(rest_shape); ++o) {
      std::vector<int64_t> rc = unravel(o, rest_shape);
      int64_t base = 0;
      for (std::size_t k = 0; k < rest.size(); ++k) base += rc[k] * st[static_cast<std::size_t>(rest[k])];
      Array sub;
      sub.reserve(offsets.size());
      for (int64_t off : offsets) sub.push_back(copy[static_cast<std::size_t>(base + off)]);
      out.copies.push_back(std::move(sub));
    }
  }
  sort_copies(out.copies);
  return out;
}

// reshape keeps every copy's row-major values (flatten and unflatten).
inline RefMesh reshape(const RefMesh& m, std::vector<int64_t> shape, std::vector<std::string> names) {
  return RefMesh{std::move(shape), std::move(names), m.copies};
}

// concatenate joins dims: the copy at position 0 of each part gives its displacements, the
// joined copy 0 sums them, and the other copies are its translates to the uncovered positions.
// nullopt when the parts overlap or their translates do not tile [0, n).
inline std::optional<RefMesh> concatenate(const std::vector<RefMesh>& parts, int64_t n) {
  RefMesh out;
  for (const RefMesh& p : parts) {
    out.shape.insert(out.shape.end(), p.shape.begin(), p.shape.end());
    out.names.insert(out.names.end(), p.names.begin(), p.names.end());
  }
  int64_t total = 1;
  for (const RefMesh& p : parts) {
    total *= product(p.shape);
    if (total > n) return std::nullopt;  // more elements than positions: they overlap
  }
  Array copy0(static_cast<std::size_t>(total), 0);
  for (std::size_t i = 0; i < copy0.size(); ++i) {
    int64_t rest = static_cast<int64_t>(i);
    for (std::size_t k = parts.size(); k-- > 0;) {
      const int64_t sz = product(parts[k].shape);
      copy0[i] += parts[k].copies.front()[static_cast<std::size_t>(rest % sz)];
      rest /= sz;
    }
  }
  std::vector<bool> covered(static_cast<std::size_t>(n), false);
  for (int64_t base = 0; base < n; ++base) {
    if (covered[static_cast<std::size_t>(base)]) continue;
    Array c;
    for (int64_t v : copy0) {
      const int64_t p = base + v;
      if (p >= n || covered[static_cast<std::size_t>(p)]) return std::nullopt;
      covered[static_cast<std::size_t>(p)] = true;
      c.push_back(p);
    }
    out.copies.push_back(std::move(c));
  }
  return out;
}

// dim_rows lists every row along dim d (other coordinates fixed), sorted by first element.
inline std::vector<Array> dim_rows(const RefMesh& m, int d) {
  std::vector<Array> rows;
  int64_t stride = 1;
  for (std::size_t k = static_cast<std::size_t>(d) + 1; k < m.shape.size(); ++k) stride *= m.shape[k];
  const int64_t size = m.shape[static_cast<std::size_t>(d)];
  for (const Array& copy : m.copies) {
    for (int64_t i = 0; i < static_cast<int64_t>(copy.size()); ++i) {
      if ((i / stride) % size != 0) continue;
      Array row;
      row.reserve(static_cast<std::size_t>(size));
      for (int64_t j = 0; j < size; ++j) row.push_back(copy[static_cast<std::size_t>(i + j * stride)]);
      rows.push_back(std::move(row));
    }
  }
  sort_copies(rows);
  return rows;
}

// additive is whether copy 0 is a sum of per-dim displacements (what a layout can express):
// value(c) - value(0) == sum over dims of (value(c_d e_d) - value(0)).
inline bool additive(const RefMesh& m) {
  const Array& c0 = m.copies.front();
  std::vector<int64_t> st(m.shape.size(), 1);
  for (std::size_t d = m.shape.size(); d-- > 1;) st[d - 1] = st[d] * m.shape[d];
  for (int64_t i = 0; i < static_cast<int64_t>(c0.size()); ++i) {
    int64_t sum = c0[0];
    for (std::size_t d = 0; d < m.shape.size(); ++d) {
      const int64_t digit = (i / st[d]) % m.shape[d];
      sum += c0[static_cast<std::size_t>(digit * st[d])] - c0[0];
    }
    if (sum != c0[static_cast<std::size_t>(i)]) return false;
  }
  return true;
}

// Where is, for every position, its copy and its row-major index there.
struct Where {
  std::vector<std::size_t> copy;
  std::vector<int64_t> index;
};

inline Where locate_all(const RefMesh& m, int64_t n) {
  Where w{std::vector<std::size_t>(static_cast<std::size_t>(n), m.copies.size()),
          std::vector<int64_t>(static_cast<std::size_t>(n), -1)};
  for (std::size_t k = 0; k < m.copies.size(); ++k) {
    for (std::size_t i = 0; i < m.copies[k].size(); ++i) {
      w.copy[static_cast<std::size_t>(m.copies[k][i])] = k;
      w.index[static_cast<std::size_t>(m.copies[k][i])] = static_cast<int64_t>(i);
    }
  }
  return w;
}

// locate finds position p: (copy index, row-major index).
inline std::pair<std::size_t, int64_t> locate(const RefMesh& m, int64_t p) {
  for (std::size_t k = 0; k < m.copies.size(); ++k) {
    auto it = std::find(m.copies[k].begin(), m.copies[k].end(), p);
    if (it != m.copies[k].end()) return {k, it - m.copies[k].begin()};
  }
  return {m.copies.size(), -1};
}

}  // namespace meshsim::ref
