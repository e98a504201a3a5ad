"""meshsim: PyTorch's DeviceMesh bookkeeping and the CuTe layout algebra under it, computed
exactly by meshsim's C++ library, for tests that need an oracle or a simulator.

    >>> import meshsim
    >>> mesh = meshsim.init_device_mesh((2, 2, 4), ("dp", "cp", "tp"))
    >>> mesh["dp", "tp"].groups(0)[:2]
    [[0, 8], [1, 9]]
"""
import json as _json
import os as _os

from . import errors
from ._meshsim import DeviceMesh, concatenate, equivalent, load, save
from . import _meshsim
from .errors import *  # noqa: F401,F403 - the error classes are part of the API

__all__ = [
    "DeviceMesh", "Layout", "init_device_mesh", "concatenate", "equivalent", "save", "load",
    "preset", "recipe", "run", "query", "errors",
] + errors.__all__


def init_device_mesh(shape, mesh_dim_names=None, device_type="cpu", world_size=None):
    """PyTorch's init_device_mesh: a row-major mesh of `shape` over ranks 0..n-1."""
    return DeviceMesh.init(list(shape), None if mesh_dim_names is None else list(mesh_dim_names),
                           device_type, world_size)


def query(request):
    """Answer one `meshsim query` request (a dict); returns the result, raises the error."""
    answer = _json.loads(_meshsim.query(_json.dumps(request)))
    if not answer.get("ok"):
        err = answer["error"]
        raise getattr(errors, err["type"], errors.Error)(err["message"])
    return answer["result"]


def preset(spec, world_size=None):
    """A framework's meshes (`meshsim show --preset`): {view name: DeviceMesh}, in order."""
    return dict(_meshsim.preset_views(spec, world_size))


def recipe(program):
    """The views of a mesh.program recipe (a dict, or the path of a JSON file): {name: DeviceMesh}."""
    if isinstance(program, (str, _os.PathLike)):
        with open(program, encoding="utf-8") as f:
            program = _json.load(f)
    return dict(_meshsim.recipe_views(_json.dumps(program)))


def run(mesh=None, *, recipe=None, preset=None, world_size=None, backend="threaded", faults=(), timeout=30.0):
    """`meshsim run --format json` in this process: every rank of the mesh checks its groups over
    the backend. Give the mesh as "dp=2,tp=4", a recipe file path, or a preset spec. Returns the
    report as a dict (its "ok" says whether the run passed); bad input raises. The GIL is
    released while the ranks run."""
    status, text = _meshsim.run(mesh or "", _os.fspath(recipe) if recipe else "", preset or "", world_size,
                                backend, list(faults), float(timeout))
    report = _json.loads(text)
    report["exit_status"] = status
    return report


def _layout_json(layout):
    return {"shape": layout.shape, "stride": layout.stride}


class Layout:
    """A CuTe layout shape:stride. Layout("(2,2):(4,1)") or Layout((2, 2), (4, 1)).
    Every operation takes convention="torch" (PyTorch's _pycute, the default) or "cute"."""

    def __init__(self, shape, stride=None):
        if stride is None:
            if not isinstance(shape, str):
                raise errors.InvalidArgument("Layout(text) or Layout(shape, stride)")
            self.shape, self.stride = _parse_text(shape)
        else:
            self.shape, self.stride = _tupled(shape), _tupled(stride)

    def _ask(self, op, convention, **args):
        return query(dict(op=op, layout=_layout_json(self), convention=convention, **args))

    def size(self, convention="torch"):
        return self._ask("size", convention)

    def cosize(self, convention="torch"):
        return self._ask("cosize", convention)

    def coalesce(self, convention="torch"):
        return _from_json(self._ask("coalesce", convention))

    def filter(self, convention="torch"):
        return _from_json(self._ask("filter", convention))

    def complement(self, bound=None, convention="torch"):
        if bound is None:
            return _from_json(self._ask("complement", convention))
        return _from_json(self._ask("complement_bound", convention, bound=bound))

    def composition(self, other, convention="torch"):
        return _from_json(query({"op": "composition", "a": _layout_json(self), "b": _layout_json(other),
                                 "convention": convention}))

    def logical_divide(self, other, convention="torch"):
        return _from_json(query({"op": "logical_divide", "a": _layout_json(self), "b": _layout_json(other),
                                 "convention": convention}))

    def logical_product(self, other, convention="torch"):
        return _from_json(query({"op": "logical_product", "a": _layout_json(self), "b": _layout_json(other),
                                 "convention": convention}))

    def right_inverse(self, convention="torch"):
        return _from_json(self._ask("right_inverse", convention))

    def left_inverse(self, convention="torch"):
        return _from_json(self._ask("left_inverse", convention))

    def crd2idx(self, coords, convention="torch"):
        return self._ask("crd2idx", convention, coords=coords)

    def idx2crd(self, indices, convention="torch"):
        return query({"op": "idx2crd", "shape": self.shape, "stride": self.stride, "indices": indices,
                      "convention": convention})

    def __eq__(self, other):
        return isinstance(other, Layout) and (self.shape, self.stride) == (other.shape, other.stride)

    def __hash__(self):
        return hash((_hashable(self.shape), _hashable(self.stride)))

    def __str__(self):
        return _text(self.shape) + ":" + _text(self.stride)

    def __repr__(self):
        return "Layout(" + repr(str(self)) + ")"


def _tupled(x):
    return [_tupled(e) for e in x] if isinstance(x, (list, tuple)) else int(x)


def _hashable(x):
    return tuple(_hashable(e) for e in x) if isinstance(x, list) else x


def _text(x):
    if isinstance(x, list):
        return "(" + ",".join(_text(e) for e in x) + ("," if len(x) == 1 else "") + ")"
    return str(x)


def _from_json(j):
    return Layout(j["shape"], j["stride"])


def _parse_text(text):
    # meshsim's reader validates the text (its errors, typed); the tuples are then read here.
    shape_text, sep, stride_text = text.partition(":")
    if not sep:
        raise errors.ParseError("layout " + repr(text) + " is not shape:stride")
    query({"op": "size", "layout": text})  # raises the reader's error on bad text
    return _tupled(_json.loads(_to_json_list(shape_text))), _tupled(_json.loads(_to_json_list(stride_text)))


def _to_json_list(t):
    out = t.strip().replace("(", "[").replace(")", "]")
    return out.replace(",]", "]")
