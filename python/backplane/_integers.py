"""Python integers into C integers, checked: ctypes cuts an integer to its C type's width without a word
(2**40 as an int32_t is 0), so every integer this package hands the C ABI is checked against its
type's range first, and one that does not fit is a ValueError naming it, its value and the range."""

import ctypes
import operator
import re

# The C integer types of the ABI, by the ctypes class that stands for them (size_t is uint64_t here).
_NAMES = {ctypes.c_int32: "int32_t", ctypes.c_int64: "int64_t", ctypes.c_uint32: "uint32_t",
          ctypes.c_uint64: "uint64_t"}


def _limits(ctype):
    bits = 8 * ctypes.sizeof(ctype)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if ctype(-1).value < 0 else (0, (1 << bits) - 1)


def fitted(value, ctype, what):
    """`value` as an integer that fits `ctype`, or TypeError/ValueError naming `what` and the value."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("%s is %r: expected an integer" % (what, value)) from None
    low, high = _limits(ctype)
    if not low <= number <= high:
        raise ValueError("%s is %d, which does not fit its C type %s (%d..%d)" % (what, number, _NAMES[ctype], low, high))
    return number


def checked(ctype):
    """`ctype` as a function's argument type that refuses an integer outside its range (see calling)."""
    if ctype not in _NAMES:
        return ctype

    class Checked(ctype):
        @classmethod
        def from_param(cls, value):
            return value if isinstance(value, ctype) else ctype(fitted(value, ctype, "it"))

    Checked.__name__ = "checked_" + _NAMES[ctype]
    return Checked


def calling(name, function):
    """`function` (a C function whose argument types are checked) raising ValueError, naming the function
    and the argument, where ctypes would raise its ArgumentError."""
    def call(*args):
        try:
            return function(*args)
        except ctypes.ArgumentError as error:
            found = re.match(r"argument (\d+): [^:]*: it (.*)", str(error))
            if found is None:
                raise
            raise ValueError("%s: argument %s %s" % (name, found.group(1), found.group(2))) from None
    call.__name__ = name
    return call


class CheckedStructure(ctypes.Structure):
    """A C struct whose integer fields, given at construction, are checked as `fitted` does."""

    def __init__(self, *values, **named):
        types = dict(self._fields_)
        for field, value in list(zip([f for f, _ in self._fields_], values)) + list(named.items()):
            if types[field] in _NAMES:
                fitted(value, types[field], field)
        super().__init__(*values, **named)
