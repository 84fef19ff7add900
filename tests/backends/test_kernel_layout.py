"""The parameter layout of a driver-API kernel launch (``edgert.backends.cuda._pack_layout``): each argument at
the offset a C compiler gives the same parameter list, checked against ctypes' own structure layout."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from edgert.backends.cuda import _pack_layout

_CTYPES = {np.int32: ctypes.c_int32, np.uint32: ctypes.c_uint32, np.int64: ctypes.c_int64, np.uintp: ctypes.c_uint64,
           np.float32: ctypes.c_float, np.float64: ctypes.c_double}


@pytest.mark.parametrize("types", [
    (np.int32, np.uintp, np.float32, np.int64, np.float64, np.int32),
    (np.uintp, np.uintp, np.int32, np.int32, np.uintp),
    (np.float32, np.int32, np.float32),
    (np.int32, np.int32, np.int32, np.uintp),
])
def test_arguments_sit_where_a_c_compiler_puts_them(types: tuple[type, ...]) -> None:
    args = tuple(t(k + 3) for k, t in enumerate(types))
    fmt, buf, params = _pack_layout(args)
    fmt.pack_into(buf, 0, *args)

    class Params(ctypes.Structure):
        _fields_ = [(f"a{k}", _CTYPES[t]) for k, t in enumerate(types)]

    base = ctypes.addressof(buf)
    for k, t in enumerate(types):
        offset = getattr(Params, f"a{k}").offset
        assert params[k] == base + offset
        assert _CTYPES[t].from_address(base + offset).value == k + 3
