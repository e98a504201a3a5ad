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

__all__ = ["shapes", "layouts", "meshes", "mesh_names"]


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
