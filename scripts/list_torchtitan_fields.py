"""Lists the fields of the config torchtitan saves (debug.save_config_file: Trainer.Config's to_dict)
as recipes/src/torchtitan_fields.cpp holds them: for each section that holds one class in every
config of torchtitan's registries (the activation checkpointing policy and the loss, which differ
between them, are left out), each field with the kind its type annotation gives (int, float,
number (float | int), bool, str, choice (a Literal), list, dict (a dict or a nested config: a
table)), whether it is Optional, and a Literal's choices. Facts read from torchtitan's own
dataclasses, not code:

    .venv/bin/python scripts/list_torchtitan_fields.py > recipes/src/torchtitan_fields.inc
"""
import contextlib
import dataclasses
import importlib
import io
import logging
import os
import sys
import types
import typing
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "torch"))
import triton_stub  # noqa: E402

triton_stub.install()
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
import torchtitan  # noqa: E402
from torchtitan.config.manager import ConfigManager  # noqa: E402


def kind(t):
    """(kind, optional, choices) of a field's annotation, or None for one this table does not hold."""
    args = typing.get_args(t)
    origin = typing.get_origin(t)
    optional = False
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        optional = len(rest) < len(args)
        if sorted(map(repr, rest)) == sorted([repr(float), repr(int)]):
            return "number", optional, ()
        if len(rest) != 1:
            return None
        t = rest[0]
        args, origin = typing.get_args(t), typing.get_origin(t)
    if origin is typing.Literal:
        return "choice", optional, tuple(args)
    if t is bool:
        return "bool", optional, ()
    if t is int:
        return "int", optional, ()
    if t is float:
        return "float", optional, ()
    if t is str:
        return "str", optional, ()
    if t is list or origin is list:
        return "list", optional, ()
    if t is dict or origin is dict or dataclasses.is_dataclass(t):
        return "dict", optional, ()
    return None


def registry_configs():
    """Every config torchtitan's model registries build (those whose module imports here)."""
    from torchtitan.models import _supported_models
    for mod in sorted(_supported_models):
        try:
            reg = importlib.import_module(f"torchtitan.models.{mod}.config_registry")
        except ImportError:
            continue
        for name in dir(reg):
            fn = getattr(reg, name)
            if name.startswith("_") or not callable(fn) or not name.startswith(mod.split("_")[0]):
                continue
            try:
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    c = fn()
            except Exception:  # a config function that needs arguments or assets
                continue
            if dataclasses.is_dataclass(c):
                yield c


def main():
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel"])
    classes = {}
    for c in registry_configs():
        for f in dataclasses.fields(c):
            classes.setdefault(f.name, set()).add(type(getattr(c, f.name)))
    print(f"// torchtitan {torchtitan.__version__}'s saved config, listed by scripts/list_torchtitan_fields.py.")
    for section in dataclasses.fields(config):
        value = getattr(config, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        # A section of one class in every registry config: its fields. One whose class differs
        # (the checkpointing policy, the loss): the fields its classes type alike.
        rows, kinds = [], {}
        for cls in sorted((c for c in classes.get(section.name, {type(value)}) if dataclasses.is_dataclass(c)),
                          key=lambda c: c.__qualname__):
            sub = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                kinds.setdefault(f.name, set()).add(kind(sub[f.name]))
        for name, ks in kinds.items():
            if len(ks) == 1 and None not in ks:
                rows.append((name, *next(iter(ks))))
            elif len(classes.get(section.name, ())) == 1:
                rows = None  # a field of a kind this table does not type: the section is left out
                break
        if rows is None:
            continue
        for name, k, optional, choices in rows:
            assert all(choices) and len(choices) <= 8, f"{section.name}.{name}: the table holds up to 8 non-empty choices"
            ch = ", ".join('"%s"' % c for c in choices)
            print(f'{{"{section.name}", "{name}", Kind::k{k.capitalize()}, {"true" if optional else "false"}, {{{ch}}}}},')


if __name__ == "__main__":
    main()
