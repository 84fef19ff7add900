"""The batch sizes a GPU session runs part batches at (``edgert.backends.gpu_session.batch_sizes``): powers of
two below the whole batch, from the smallest the model allows, then the whole batch."""

from __future__ import annotations

import pytest

from edgert.backends.gpu_session import batch_sizes


@pytest.mark.parametrize(("full", "smallest", "sizes"), [
    (16, 1, (1, 2, 4, 8, 16)),
    (12, 1, (1, 2, 4, 8, 12)),  # not a power of two: the whole batch closes the list
    (1, 1, (1,)),
    (2, 1, (1, 2)),
    (16, 3, (4, 8, 16)),  # an engine profile that starts at 3: the sizes from there
    (8, 8, (8,)),
    (32, 1, (1, 2, 4, 8, 16, 32)),
])
def test_powers_of_two_then_the_whole_batch(full: int, smallest: int, sizes: tuple[int, ...]) -> None:
    assert batch_sizes(full, smallest) == sizes
