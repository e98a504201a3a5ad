// coordinates.cpp — crd2idx and idx2crd: a coordinate to an index and back over a shape (and
// stride), in either convention; split from algebra.cpp, whose kernels share its divisions
// (checked_math.hpp's divmod).
#include <algorithm>
#include <string>

#include "checked_math.hpp"
#include "meshsim/algebra.hpp"
#include "meshsim/error.hpp"

namespace meshsim {

using Node = IntTuple::Node;

namespace {

void check_shape(const IntTuple& shape, const char* op) {
  for (int i = 0; i < shape.node_count(); ++i) {
    const Node& n = shape.nodes()[i];
    if (n.arity == IntTuple::kLeaf && n.value < 1) {
      throw InvalidArgument(std::string(op) + ": size " + std::to_string(n.value) + " in shape " +
                            to_string(shape) + " is not >= 1");
    }
  }
}

}  // namespace


namespace {

// subtree_size is the product of the sizes under n (valid: n's sizes are >= 1 and the whole
// shape's size was checked, or the caller checks the product).
int64_t subtree_size(const Node* n) {
  if (n->arity == IntTuple::kLeaf) return n->value;
  int64_t p = 1;
  for (int i = 0; i < n->span; ++i) {
    if (n[i].arity == IntTuple::kLeaf) p = checked_mul(p, n[i].value, "crd2idx: size");
  }
  return p;
}

// crd_int splits the int coordinate v over the tree at (s, d) in the convention's order, the
// outermost mode taking the overflow.
int64_t crd_int(int64_t v, const Node* s, const Node* d, Convention c) {
  if (s->arity == IntTuple::kLeaf) return checked_mul(v, d->value, "crd2idx");
  if (s->arity == 0) return 0;  // the empty tuple
  if (s->span == s->arity + 1) {  // a flat tuple: its children are s[1..arity]
    const int n = s->arity;
    const bool torch = c == Convention::kTorch;
    int64_t result = 0;
    for (int k = 0; k + 1 < n; ++k) {
      const int i = 1 + (torch ? n - 1 - k : k);
      int64_t q = 0;
      int64_t r = 0;
      divmod(v, s[i].value, q, r);
      result = checked_add(result, checked_mul(r, d[i].value, "crd2idx"), "crd2idx");
      v = q;
    }
    const int last = 1 + (torch ? 0 : n - 1);  // the outermost mode takes the overflow
    return checked_add(result, checked_mul(v, d[last].value, "crd2idx"), "crd2idx");
  }
  boost::container::small_vector<std::pair<const Node*, const Node*>, 8> kids;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < s->arity; ++k, cs += cs->span, cd += cd->span) kids.emplace_back(cs, cd);
  if (c == Convention::kTorch) std::reverse(kids.begin(), kids.end());
  int64_t result = 0;
  const std::size_t last = kids.size() - 1;
  for (std::size_t k = 0; k < last; ++k) {
    int64_t q = 0;
    int64_t r = 0;
    divmod(v, subtree_size(kids[k].first), q, r);
    result = checked_add(result, crd_int(r, kids[k].first, kids[k].second, c), "crd2idx");
    v = q;
  }
  // The outermost mode takes the overflow.
  return checked_add(result, crd_int(v, kids[last].first, kids[last].second, c), "crd2idx");
}

int64_t crd(const Node* x, const Node* s, const Node* d, Convention c) {
  if (x->arity == IntTuple::kLeaf) {
    if (x->value < 0) {
      throw InvalidArgument("crd2idx: coordinate " + std::to_string(x->value) + " is negative");
    }
    return crd_int(x->value, s, d, c);
  }
  if (s->arity == IntTuple::kLeaf) {
    throw InvalidArgument("crd2idx: tuple coordinate " + to_string(IntTuple::from_nodes(x)) +
                          " against the integer shape " + std::to_string(s->value));
  }
  if (x->arity != s->arity) {
    throw InvalidArgument("crd2idx: coordinate " + to_string(IntTuple::from_nodes(x)) + " has " +
                          std::to_string(x->arity) + " modes but shape " +
                          to_string(IntTuple::from_nodes(s)) + " has " + std::to_string(s->arity));
  }
  int64_t result = 0;
  const Node* cx = x + 1;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < x->arity; ++k, cx += cx->span, cs += cs->span, cd += cd->span) {
    result = checked_add(result, crd(cx, cs, cd, c), "crd2idx");
  }
  return result;
}

}  // namespace

int64_t crd2idx(const IntTuple& coord, const IntTuple& shape, const IntTuple& stride, Convention c) {
  check_shape(shape, "crd2idx");
  if (!congruent(shape, stride)) {
    throw InvalidArgument("crd2idx: shape " + to_string(shape) + " and stride " +
                          to_string(stride) + " are not congruent");
  }
  return crd(coord.nodes(), shape.nodes(), stride.nodes(), c);
}

int64_t crd2idx(const IntTuple& coord, const Layout& l, Convention c) {
  return crd(coord.nodes(), l.shape().nodes(), l.stride().nodes(), c);
}

namespace {

void crd_of_int(int64_t v, const Node* s, const Node* d, IntTupleBuilder& b) {
  if (s->arity == IntTuple::kLeaf) {
    if (d->value == 0) {
      throw InvalidArgument("idx2crd: stride 0 of mode " + std::to_string(s->value) +
                            " cannot be divided by (division by zero)");
    }
    b.leaf((v / d->value) % s->value);
    return;
  }
  b.open();
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < s->arity; ++k, cs += cs->span, cd += cd->span) crd_of_int(v, cs, cd, b);
  b.close();
}

void crd_of(const Node* x, const Node* s, const Node* d, IntTupleBuilder& b) {
  if (x->arity == IntTuple::kLeaf) {
    if (x->value < 0) {
      throw InvalidArgument("idx2crd: index " + std::to_string(x->value) + " is negative");
    }
    crd_of_int(x->value, s, d, b);
    return;
  }
  if (s->arity == IntTuple::kLeaf || s->arity != x->arity) {
    throw InvalidArgument("idx2crd: index " + to_string(IntTuple::from_nodes(x)) +
                          " does not match the structure of shape " +
                          to_string(IntTuple::from_nodes(s)));
  }
  b.open();
  const Node* cx = x + 1;
  const Node* cs = s + 1;
  const Node* cd = d + 1;
  for (int k = 0; k < x->arity; ++k, cx += cx->span, cs += cs->span, cd += cd->span) {
    crd_of(cx, cs, cd, b);
  }
  b.close();
}

}  // namespace

IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, Convention c) {
  check_shape(shape, "idx2crd");
  return idx2crd(idx, shape, compact_stride(shape, c));
}

IntTuple idx2crd(const IntTuple& idx, const IntTuple& shape, const IntTuple& stride) {
  check_shape(shape, "idx2crd");
  if (!congruent(shape, stride)) {
    throw InvalidArgument("idx2crd: shape " + to_string(shape) + " and stride " +
                          to_string(stride) + " are not congruent");
  }
  for (int i = 0; i < stride.node_count(); ++i) {
    const Node& n = stride.nodes()[i];
    if (n.arity == IntTuple::kLeaf && n.value < 0) {
      throw InvalidArgument("idx2crd: stride " + std::to_string(n.value) + " is negative");
    }
  }
  IntTupleBuilder b;
  crd_of(idx.nodes(), shape.nodes(), stride.nodes(), b);
  return b.take();
}

}  // namespace meshsim
