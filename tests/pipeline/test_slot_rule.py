"""The GPU processor's default slot count (edgert.pipeline.processor): three, four on trial for a batch of
many sources, the trial slot kept only for a model whose batch runs short (the GPU tests check the processor
itself keeps to it)."""

from __future__ import annotations

import pytest

from edgert.pipeline.processor import MANY_SOURCES_BATCH, TRIAL_SLOT_MAX_MS, default_slots, keep_trial_slot


@pytest.mark.parametrize(("batch", "want"), [(1, 3), (MANY_SOURCES_BATCH - 1, 3), (MANY_SOURCES_BATCH, 4), (32, 4)])
def test_gpu_default_by_batch(batch: int, want: int) -> None:
    assert default_slots("gpu", batch) == want


def test_cpu_default_ignores_batch() -> None:
    assert default_slots("cpu", 1) == default_slots("cpu", 32) in (1, 2)


@pytest.mark.parametrize(("ms", "kept"), [(2.6, True), (TRIAL_SLOT_MAX_MS - 0.01, True), (TRIAL_SLOT_MAX_MS, False),
                                          (8.6, False), (None, False)])
def test_trial_slot_kept_only_for_a_short_batch(ms: float | None, kept: bool) -> None:
    assert keep_trial_slot(ms) is kept
