"""Small value types shared across stages: tensor specs.

Task results (``Detections``, ``Transcript``) live next to the stage that makes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from edgert.errors import InputError

#: A dimension is a fixed size or the name of a dynamic axis (``"batch"``, ``"N"``) or -1 when unnamed.
Dim = Union[int, str]


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of one model input or output, as the model declares it."""

    name: str
    shape: tuple[Dim, ...]
    dtype: np.dtype

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) or d < 0 for d in self.shape)

    def describe(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        return f"{self.name} {self.dtype.name}[{dims}]"

    def check(self, array: np.ndarray) -> None:
        """Raise :class:`InputError` unless ``array`` fits this spec (dynamic dims match anything)."""
        if array.dtype != self.dtype:
            raise InputError(
                f"Input tensor: {self.name} | Received dtype {array.dtype}. Note: expected {self.dtype}"
            )
        if array.ndim != len(self.shape) or any(
            isinstance(d, int) and d >= 0 and d != got for d, got in zip(self.shape, array.shape)
        ):
            raise InputError(
                f"Input tensor: {self.name} | Received shape {tuple(array.shape)}. "
                f"Note: expected {tuple(self.shape)}"
            )

    def concrete(self, overrides: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
        """The shape with dynamic dims resolved: from ``overrides`` if given, else 1 for each."""
        if overrides and self.name in overrides:
            shape = tuple(int(x) for x in overrides[self.name])
            if len(shape) != len(self.shape):
                raise InputError(
                    f"Input tensor: {self.name} | Received shape {shape}. Note: expected rank {len(self.shape)}"
                )
            return shape
        return tuple(d if isinstance(d, int) and d >= 0 else 1 for d in self.shape)
