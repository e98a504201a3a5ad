"""meshsim's errors: one class per C++ ``meshsim::Error`` class, all deriving from
:class:`Error` and each from the matching Python built-in, with the C++ message unchanged."""


class Error(Exception):
    """Base of every error meshsim raises on purpose."""

    def __str__(self):  # KeyError would quote the message; keep it as the C++ one
        return self.args[0] if self.args else ""


class InvalidArgument(Error, ValueError):
    """The input is malformed or breaks an operation's rule."""


class ParseError(InvalidArgument):
    """Text or JSON that does not parse."""


class MismatchError(InvalidArgument):
    """Ranks met at one collective with different op, dtype, count or root."""


class ArgumentTypeError(InvalidArgument, TypeError):
    """An argument of the wrong type (a string where a size belongs, say): also a TypeError."""


class OutOfRange(Error, IndexError):
    """An index, dim, rank or count outside its range."""


class OverflowError(OutOfRange, OverflowError):  # noqa: A001 - mirrors meshsim::OverflowError
    """A product that does not fit in int64."""


class FailedPrecondition(Error, RuntimeError):
    """A valid request the object cannot honour in its state (PyTorch's RuntimeErrors)."""


class NotFound(Error, KeyError):
    """A name looked up and absent."""


class AlreadyExists(Error, ValueError):
    """Registered twice with a different meaning."""


class ResourceExhausted(Error, MemoryError):
    """An answer or request over a size limit."""


class DeadlineExceeded(Error, TimeoutError):
    """A wait ran out."""


class Aborted(Error, RuntimeError):
    """Another participant failed first."""


class Unavailable(Error, ConnectionError):
    """A stream, peer or store could not be reached."""


class Internal(Error, RuntimeError):
    """A bug in meshsim."""


class CheckFailed(Error, AssertionError):
    """A check of a program found problems (meshsim.record: a rank that did not end well, or
    dumps that disagree across ranks); `.result` is the whole answer. Python's own class: the
    C++ tool says the same with exit status 1."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


__all__ = [
    "Error", "InvalidArgument", "ParseError", "MismatchError", "ArgumentTypeError", "OutOfRange", "OverflowError",
    "FailedPrecondition", "NotFound", "AlreadyExists", "ResourceExhausted", "DeadlineExceeded",
    "Aborted", "Unavailable", "Internal", "CheckFailed",
]
