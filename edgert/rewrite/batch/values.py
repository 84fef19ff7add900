"""Symbolic values of the batch rewrite: ``a * B + c`` for shape elements, and what a tensor carries.

A tensor depends on the batch in one of two ways: it carries the batch on an axis (:class:`Info` ``axis``),
or its values are shape numbers of which some equal a multiple of the batch (``sym``, an object array of
:class:`Lin`). A rule that cannot follow a node raises :class:`Unsupported`, which the driver turns into a
one-line error naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Info", "Lin", "Unsupported", "lin_array", "sym_or_none"]


class Lin:
    """``a * B + c``: one element of a shape tensor whose value may depend on the batch size B."""

    __slots__ = ("a", "c")

    def __init__(self, a: Any, c: Any) -> None:
        self.a = a
        self.c = c

    @staticmethod
    def of(x: Any) -> Lin:
        return x if isinstance(x, Lin) else Lin(0, x.item() if isinstance(x, np.generic) else x)

    @property
    def dep(self) -> bool:
        return bool(self.a != 0)

    def __add__(self, o: Any) -> Lin:
        o = Lin.of(o)
        return Lin(self.a + o.a, self.c + o.c)

    __radd__ = __add__

    def __neg__(self) -> Lin:
        return Lin(-self.a, -self.c)

    def __sub__(self, o: Any) -> Lin:
        return self + (-Lin.of(o))

    def __rsub__(self, o: Any) -> Lin:
        return Lin.of(o) - self

    def __mul__(self, o: Any) -> Lin:
        o = Lin.of(o)
        if self.dep and o.dep:
            raise Unsupported("multiplies the batch size by itself")
        return Lin(self.a * o.c + o.a * self.c, self.c * o.c)

    __rmul__ = __mul__

    def _div(self, o: Any, floor: bool) -> Lin:
        o = Lin.of(o)
        if o.dep:
            raise Unsupported("divides by the batch size")
        d = o.c
        if floor:
            if self.a % d or self.c % d:
                raise Unsupported("divides the batch size unevenly")
            return Lin(self.a // d, self.c // d)
        return Lin(self.a / d, self.c / d)

    def __floordiv__(self, o: Any) -> Lin:
        return self._div(o, True)

    def __truediv__(self, o: Any) -> Lin:
        return self._div(o, False)

    def __repr__(self) -> str:
        if not self.dep:
            return repr(self.c)
        b = "B" if self.a == 1 else f"{self.a}*B"
        return b if self.c == 0 else f"{b}+{self.c}"


class Unsupported(Exception):
    """Raised inside the analysis; becomes a BatchRewriteError naming the node."""


@dataclass
class Info:
    """How a tensor depends on the batch: ``axis`` where it carries it, ``sym`` when its values do."""

    axis: int | None = None
    sym: np.ndarray | None = None  # object array of Lin, same shape as the tensor


def lin_array(value: np.ndarray) -> np.ndarray:
    out = np.empty(value.shape, dtype=object)
    flat = out.reshape(-1)
    for i, v in enumerate(value.reshape(-1).tolist()):
        flat[i] = Lin(0, v)
    return out


def sym_or_none(sym: np.ndarray) -> Info | None:
    """Shape values with no batch-dependent element are plain constants again."""
    if any(e.dep for e in sym.reshape(-1)):
        return Info(sym=sym)
    return None
