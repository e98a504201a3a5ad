"""torchtitan's model registry imports a Triton kernel module at import time (its async expert
parallel), which a CPU build of PyTorch lacks. install() puts a stand-in for that one module in
sys.modules before torchtitan is imported; any attribute of it is another stand-in and a
decorator of it returns what it decorates. No code of it runs in the tests that use it."""
import sys
import types

KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


class _Stub(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub(name)

    def __call__(self, *args, **kwargs):
        return args[0] if args and callable(args[0]) and not kwargs else self


def install():
    sys.modules.setdefault(KERNELS, _Stub(KERNELS))
