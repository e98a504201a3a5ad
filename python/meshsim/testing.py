"""Hypothesis strategies for meshsim's layouts and meshes: the counterparts of the rapidcheck
generators (testing/generators.hpp, testing/mesh_generators.hpp), for users' own property tests.

    from hypothesis import given
    from meshsim.testing import meshes

    @given(meshes())
    def test_every_rank_is_in_one_group_per_dim(mesh):
        ...
"""
from hypothesis import strategies as st

import meshsim

__all__ = ["shapes", "layouts", "meshes", "mesh_names", "transformed"]


def shapes(max_dims=4, max_size=4):
    """Mesh shapes: 1..max_dims sizes in 1..max_size."""
    return st.lists(st.integers(1, max_size), min_size=1, max_size=max_dims)


def layouts(max_modes=4, max_size=4, max_stride=16):
    """Flat layouts: sizes in 1..max_size, strides in 0..max_stride (any layout, overlapping or not)."""
    return st.integers(1, max_modes).flatmap(
        lambda n: st.tuples(st.lists(st.integers(1, max_size), min_size=n, max_size=n),
                            st.lists(st.integers(0, max_stride), min_size=n, max_size=n))
    ).map(lambda ss: meshsim.Layout(ss[0], ss[1]))


def mesh_names(n):
    """n distinct dim names."""
    return st.lists(st.sampled_from(["dp", "cp", "tp", "pp", "ep", "fsdp", "a", "b"]), min_size=n, max_size=n,
                    unique=True)


@st.composite
def meshes(draw, max_dims=4, max_size=4, permuted=True):
    """Named root meshes: init_device_mesh, or (permuted) DeviceMesh over a shuffled rank map."""
    shape = draw(shapes(max_dims, max_size))
    names = draw(mesh_names(len(shape)))
    n = 1
    for s in shape:
        n *= s
    if permuted and draw(st.booleans()):
        ranks = draw(st.permutations(list(range(n))))
        return meshsim.DeviceMesh.from_ranks(shape, ranks, names)
    return meshsim.init_device_mesh(shape, names)


def _factor_pairs(n):
    return [(a, n // a) for a in range(2, n) if n % a == 0]


@st.composite
def transformed(draw, root, max_steps=4):
    """A chain of up to max_steps transformations of `root` (a named mesh): slices (in stride
    order), flatten, unflatten, transpose, and concatenate of two disjoint slices. Returns
    (mesh, steps): the resulting mesh and the same chain as `meshsim query` mesh.program ops
    (each step bound with `let` and applied `on` the previous one), so the chain can be replayed
    through the query, recorded, or rebuilt in PyTorch. A drawn step the mesh refuses (PyTorch's
    rules, e.g. a slice out of stride order after a transpose) is left out of the chain."""
    mesh, steps, on, fresh = root, [], "root", [0]

    def name(prefix):
        fresh[0] += 1
        return prefix + str(fresh[0])

    for _ in range(draw(st.integers(1, max_steps))):
        names = list(mesh.mesh_dim_names)
        kind = draw(st.sampled_from(["slice", "flatten", "unflatten", "transpose", "concatenate"]))
        let = name("s")
        try:
            if kind == "slice":
                keep = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
                keep = [n for n in names if n in keep]
                new, ops = mesh[tuple(keep)], [{"slice": keep}]
            elif kind == "flatten":
                flat = name("f")
                new, ops = mesh.flatten(flat), [{"flatten": flat}]
            elif kind == "unflatten":
                splittable = [n for n, size in zip(names, mesh.shape) if _factor_pairs(size)]
                if not splittable:
                    continue
                dim = draw(st.sampled_from(splittable))
                sizes = list(draw(st.sampled_from(_factor_pairs(mesh.size(dim)))))
                new_names = [name("u"), name("u")]
                new = mesh.unflatten(dim, sizes, new_names)
                ops = [{"unflatten": {"dim": dim, "sizes": sizes, "names": new_names}}]
            elif kind == "transpose":
                order = draw(st.permutations(names))
                new, ops = mesh.transpose(order), [{"transpose": order}]
            else:
                if len(names) < 2:
                    continue
                cut = draw(st.integers(1, len(names) - 1))
                first, second = names[:cut], names[cut:]
                a, b = name("c"), name("c")
                new = meshsim.concatenate([mesh[tuple(first)], mesh[tuple(second)]])
                steps += [{"slice": first, "on": on, "let": a}, {"slice": second, "on": on, "let": b}]
                ops = [{"concatenate": [a, b]}]
        except meshsim.Error:
            continue
        for op in ops[:-1]:
            op.setdefault("on", on)
        last = dict(ops[-1])
        if "concatenate" not in last:
            last["on"] = on
        last["let"] = let
        steps += ops[:-1] + [last]
        mesh, on = new, let
    return mesh, steps
