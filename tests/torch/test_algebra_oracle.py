"""meshsim's layout algebra, torch convention, against PyTorch 2.13's own `torch.distributed._pycute`.

Random layouts (Hypothesis; nested shapes, zero and non-compact strides) go through both. For
every op both have (size, cosize, coalesce, filter, complement with and without a bound,
composition, logical_divide, logical_product, right_inverse, left_inverse, crd2idx and idx2crd on
integer indices):
- where both answer, the answers are equal (shape and stride trees, or the integers);
- where PyTorch raises, meshsim raises one of its typed errors;
- where meshsim refuses and PyTorch answers, PyTorch's answer must break the operation's own
  postcondition, checked here by brute force over the whole domain (docs/algebra.md, "Where
  meshsim deliberately differs"): otherwise the refusal is a meshsim bug.
The DeviceMesh layout helpers of 2.13 (_FlatLayout's all_ranks_from_zero and global_ranks,
_MeshLayout's top_level_sizes and remap_to_tensor) against meshsim's mesh_* query ops, the same
way: where meshsim refuses, PyTorch's groups must fail to hold every rank once.
MESHSIM_TORCH_EXAMPLES sets the examples per op (default 200).
"""
import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import meshsim

pc = pytest.importorskip("torch.distributed._pycute", reason="PyTorch 2.13 (the project's .venv) is the oracle")

EXAMPLES = int(os.environ.get("MESHSIM_TORCH_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="MESHSIM_TORCH_SEED" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow])
MAX_DOMAIN = 4096  # brute-force checks walk at most this many indices


def _shape_stride(depth):
    leaf = st.tuples(st.integers(1, 6), st.integers(0, 40))
    if depth == 0:
        return leaf
    return st.one_of(leaf, st.lists(_shape_stride(depth - 1), min_size=1, max_size=3).map(
        lambda kids: (tuple(k[0] for k in kids), tuple(k[1] for k in kids))))


layouts = st.lists(_shape_stride(1), min_size=1, max_size=3).map(
    lambda modes: pc.Layout(tuple(m[0] for m in modes), tuple(m[1] for m in modes)) if len(modes) > 1
    else pc.Layout(modes[0][0], modes[0][1]))
# Tilers and divisors: compact-ish small layouts, the shapes DeviceMesh's own calls use.
small = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 12)), min_size=1, max_size=2).map(
    lambda m: pc.Layout(tuple(s for s, _ in m), tuple(d for _, d in m)) if len(m) > 1 else pc.Layout(*m[0]))


def tree(x):
    return tuple(tree(e) for e in x) if isinstance(x, (list, tuple)) else x


def ours(layout):
    return meshsim.Layout(layout.shape, layout.stride)


def as_pair(result):
    return tree(result.shape), tree(result.stride)


def call(fn):
    """(value, None) or (None, the exception)."""
    try:
        return fn(), None
    except RecursionError:
        raise
    except Exception as e:  # noqa: BLE001 - PyTorch raises AssertionError, ZeroDivisionError, ...
        return None, e


def domain(layout):
    n = pc.size(layout)
    return range(n) if n <= MAX_DOMAIN else None


# What each op's cases came to: "equal" (both answered alike), "both refuse", "meshsim refuses a
# broken answer", "undecided" (meshsim refuses, the answer too big to walk).
OUTCOMES = {}


def count(name, outcome):
    OUTCOMES.setdefault(name, {}).setdefault(outcome, 0)
    OUTCOMES[name][outcome] += 1


def compare(name, theirs_fn, ours_fn, postcondition, *inputs):
    theirs, their_error = call(theirs_fn)
    mine, my_error = call(ours_fn)
    if my_error is not None and not isinstance(my_error, meshsim.Error):
        raise AssertionError(f"{name}{inputs}: meshsim raised {type(my_error).__name__}, not a meshsim.Error: "
                             f"{my_error}")
    if their_error is not None:
        assert my_error is not None, (f"{name}{inputs}: PyTorch raises {type(their_error).__name__} "
                                      f"({their_error}), meshsim answers {mine}")
        count(name, "both refuse")
        return
    if my_error is None:
        assert mine == theirs, f"{name}{inputs}: PyTorch {theirs}, meshsim {mine}"
        count(name, "equal")
        return
    # meshsim refuses what PyTorch answers: PyTorch's answer must be wrong.
    # (An answer that cannot even be evaluated, e.g. a size-0 mode, is broken.)
    broken, unusable = call(lambda: postcondition(theirs))
    broken = True if unusable is not None else broken
    assert broken is not False, (f"{name}{inputs}: meshsim refuses ({my_error}) but PyTorch's answer {theirs} "
                                 f"holds the postcondition")
    count(name, "meshsim refuses a broken answer" if broken else "undecided")


def composed_correctly(a, b):
    def check(r):
        dom = domain(b)
        if dom is None:
            return None  # too big to walk: no verdict
        if pc.size(r) != pc.size(b):
            return True
        return any(r(i) != a(b(i)) for i in dom)
    return check


@SETTINGS
@given(layouts)
def test_size_cosize_coalesce_filter_and_indices(layout):
    m = ours(layout)
    assert m.size() == pc.size(layout)
    if pc.size(layout) >= 1:
        compare("cosize", lambda: pc.cosize(layout), m.cosize, lambda r: None, layout)
    compare("coalesce", lambda: as_pair(pc.coalesce(layout)), lambda: as_pair(m.coalesce()), lambda r: None, layout)
    compare("filter", lambda: as_pair(pc.filter(layout)), lambda: as_pair(m.filter()), lambda r: None, layout)
    idx = list(range(min(pc.size(layout), 64)))
    if idx:
        compare("crd2idx", lambda: [pc.crd2idx(i, layout.shape, layout.stride) for i in idx],
                lambda: m.crd2idx(idx), lambda r: None, layout)
        compare("idx2crd", lambda: [tree(pc.idx2crd(i, layout.shape, layout.stride)) for i in idx],
                lambda: [tree(c) for c in m.idx2crd(idx)], lambda r: None, layout)


@SETTINGS
@given(layouts, st.one_of(st.none(), st.integers(1, 200)))
def test_complement(layout, bound):
    def broken(pair):
        # The complement of a layout that is not injective is undefined (PyTorch returns a size-0
        # mode); of an injective one, (L, C) must be injective and reach the bound.
        c = pc.Layout(*pair)
        if pc.size(layout) * max(pc.size(c), 1) > MAX_DOMAIN:
            return None
        own = [layout(i) for i in range(pc.size(layout))]
        if len(set(own)) != len(own) or pc.size(c) == 0:
            return True
        both = pc.make_layout(layout, c)
        image = [both(i) for i in range(pc.size(both))]
        return len(set(image)) != len(image) or (bound is not None and pc.cosize(both) < bound)
    args = () if bound is None else (bound,)
    compare("complement", lambda: as_pair(pc.complement(layout, *args)),
            lambda: as_pair(ours(layout).complement(bound)), broken, layout, bound)


@SETTINGS
@given(layouts, small)
def test_composition_divide_product(a, b):
    m, n = ours(a), ours(b)
    compare("composition", lambda: as_pair(pc.composition(a, b)), lambda: as_pair(m.composition(n)),
            lambda pair: composed_correctly(a, b)(pc.Layout(*pair)), a, b)

    def divide_broken(pair):
        bc, e = call(lambda: pc.make_layout(b, pc.complement(b, pc.size(a))))
        if e is not None:
            return True
        return composed_correctly(a, bc)(pc.Layout(*pair))
    compare("logical_divide", lambda: as_pair(pc.logical_divide(a, b)), lambda: as_pair(m.logical_divide(n)),
            divide_broken, a, b)

    def product_broken(pair):
        c, e = call(lambda: pc.complement(a, pc.size(a) * pc.cosize(b)))
        if e is not None:
            return True
        r = pc.Layout(*pair)
        if pc.size(r) > MAX_DOMAIN:
            return None
        # (A, A* o B): the first mode is A itself, the second A's complement composed with B.
        second = composed_correctly(c, b)(r[1]) if len(pc.as_tuple(r.shape)) == 2 else True
        return second or r[0].shape != a.shape or r[0].stride != a.stride
    compare("logical_product", lambda: as_pair(pc.logical_product(a, b)), lambda: as_pair(m.logical_product(n)),
            product_broken, a, b)


@SETTINGS
@given(layouts)
def test_inverses(layout):
    m = ours(layout)

    def right_broken(pair):
        r = pc.Layout(*pair)
        return any(layout(r(i)) != i for i in range(min(pc.size(r), MAX_DOMAIN)))

    def left_broken(pair):
        inv = pc.Layout(*pair)
        dom = domain(layout)
        return None if dom is None else any(inv(layout(i)) != i for i in dom)
    compare("right_inverse", lambda: as_pair(pc.right_inverse(layout)), lambda: as_pair(m.right_inverse()),
            right_broken, layout)
    compare("left_inverse", lambda: as_pair(pc.left_inverse(layout)), lambda: as_pair(m.left_inverse()),
            left_broken, layout)


flat = st.lists(st.tuples(st.integers(1, 6), st.integers(0, 48)), min_size=1, max_size=4)


@SETTINGS
@given(flat)
def test_check_orthogonal_is_flat_layouts(modes):
    from torch.distributed._mesh_layout import _FlatLayout
    shape, stride = tuple(m[0] for m in modes), tuple(m[1] for m in modes)
    theirs, error = call(lambda: _FlatLayout(shape, stride).check_orthogonal())
    mine = meshsim.Layout(shape, stride).check_orthogonal()
    if error is not None:
        # PyTorch divides by a broadcast mode's zero stride; meshsim answers False (docs/algebra.md).
        assert isinstance(error, ZeroDivisionError) and mine is False, (shape, stride, error, mine)
        count("check_orthogonal", "both refuse")
        return
    assert mine == theirs, f"check_orthogonal {shape}:{stride}: PyTorch {theirs}, meshsim {mine}"
    count("check_orthogonal", "equal")


def _flat_text(modes):
    """A flat layout (modes of (size, stride)) as meshsim's query reads it: "(2,3):(1,2)"."""
    if len(modes) == 1:
        return f"{modes[0][0]}:{modes[0][1]}"
    return "(" + ",".join(str(m[0]) for m in modes) + "):(" + ",".join(str(m[1]) for m in modes) + ")"


def _mesh_text(axes):
    """A mesh layout: one top-level mode per axis, each axis flat."""
    shapes = [str(a[0][0]) if len(a) == 1 else "(" + ",".join(str(m[0]) for m in a) + ")" for a in axes]
    strides = [str(a[0][1]) if len(a) == 1 else "(" + ",".join(str(m[1]) for m in a) + ")" for a in axes]
    return "(" + ",".join(shapes) + "):(" + ",".join(strides) + ")"


def _ask(request):
    return meshsim.query(request)


def _same(name, theirs_fn, ours_fn, inputs, broken=None):
    """Equal answers, or both refuse (meshsim with one of its typed errors), or meshsim refuses
    where `broken(PyTorch's answer)` says that answer is wrong (docs/algebra.md)."""
    theirs, their_error = call(theirs_fn)
    mine, my_error = call(ours_fn)
    if my_error is not None and not isinstance(my_error, meshsim.Error):
        raise AssertionError(f"{name}{inputs}: meshsim raised {type(my_error).__name__}: {my_error}")
    if their_error is None and my_error is not None and broken is not None and broken(theirs):
        count(name, "meshsim refuses a broken answer")
        return
    if their_error is not None or my_error is not None:
        assert their_error is not None and my_error is not None, (
            f"{name}{inputs}: PyTorch {their_error or theirs!r}, meshsim {my_error or mine!r}")
        count(name, "both refuse")
        return
    assert mine == theirs, f"{name}{inputs}: PyTorch {theirs}, meshsim {mine}"
    count(name, "equal")


small_flat = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 12)), min_size=1, max_size=3)


@SETTINGS
@given(small_flat, st.integers(1, 48))
def test_flat_layout_helpers(modes, world):
    # 2.13's _FlatLayout: all_ranks_from_zero and global_ranks(world_size) (the layout's ranks
    # offset by its complement's in the world), against meshsim's mesh_* query ops.
    from torch.distributed._mesh_layout import _FlatLayout
    shape, stride = tuple(m[0] for m in modes), tuple(m[1] for m in modes)
    text = _flat_text(modes)
    _same("all_ranks_from_zero", lambda: _FlatLayout(shape, stride).all_ranks_from_zero(),
          lambda: _ask({"op": "mesh_all_ranks_from_zero", "layout": text}), (text,))
    # An answer is broken when its groups do not tile the world: a rank twice, or one missing.
    def untiled(groups):
        every = [r for g in groups for r in g]
        return sorted(every) != list(range(world))
    _same("global_ranks", lambda: _FlatLayout(shape, stride).global_ranks(world),
          lambda: _ask({"op": "mesh_global_ranks", "layout": text, "world_size": world}), (text, world), untiled)


@SETTINGS
@given(st.lists(small_flat, min_size=1, max_size=3), st.integers(1, 48), st.randoms(use_true_random=False))
def test_mesh_layout_helpers(axes, n, rnd):
    # 2.13's _MeshLayout: top_level_sizes, and remap_to_tensor over a shuffled rank map (the
    # mesh array each rank's copy is cut from).
    import torch
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
    mesh = _MeshLayout([_FlatLayout(tuple(m[0] for m in a), tuple(m[1] for m in a)) for a in axes])
    text = _mesh_text(axes)
    _same("top_level_sizes", lambda: list(mesh.top_level_sizes),
          lambda: _ask({"op": "mesh_top_level_sizes", "layout": text}), (text,))
    rank_map = list(range(n))
    rnd.shuffle(rank_map)
    # Broken: the copies of the mesh do not hold every rank of the map once (an overlapping
    # layout, or strides that leave ranks out).
    def repeats(t):
        flat = torch.tensor(t).flatten().tolist() if t else []
        return sorted(flat) != sorted(rank_map)
    _same("remap_to_tensor", lambda: mesh.remap_to_tensor(torch.tensor(rank_map)).tolist(),
          lambda: _ask({"op": "mesh_remap_to_tensor", "layout": text, "rank_map": rank_map}), (text, rank_map),
          repeats)


def test_zz_every_op_was_compared_on_answers():
    """Run last: the cases each op came to, printed; every op met answers from both sides, so no
    comparison above passed vacuously."""
    for name, outcomes in sorted(OUTCOMES.items()):
        print(f"{name}: {outcomes}")
    ops = {"cosize", "coalesce", "filter", "crd2idx", "idx2crd", "complement", "composition", "logical_divide",
           "logical_product", "right_inverse", "left_inverse", "check_orthogonal", "all_ranks_from_zero",
           "global_ranks", "top_level_sizes", "remap_to_tensor"}
    if len(OUTCOMES) < len(ops):
        pytest.skip("run with the whole file: some op tests were deselected")
    for op in ops:
        assert OUTCOMES.get(op, {}).get("equal", 0) > 0, (op, OUTCOMES.get(op))


def test_the_oracle_is_the_pytorch_this_run_is_for():
    import torch
    import torch_env
    torch_env.check()
    assert pc.__file__.startswith(os.path.dirname(torch.__file__))
