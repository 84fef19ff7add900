"""A new model for a running pipeline: the processor behind a door that changes its model between two batches.

The orchestrator wraps the run's processor (CPU or GPU, whichever) in an :class:`UpdatableProcessor` when
``model.update_dir`` is set, so every processor gets the same swap:

- the new processor is opened and warmed *beside* the old one (by the caller, on its own thread) and handed to
  :meth:`UpdatableProcessor.swap_in`;
- the batcher stamps each batch with the model generation it is for (:meth:`UpdatableProcessor.batch_ready`,
  one call per batch, on the batcher's thread), so the switch happens at a batch boundary in frame order: every
  batch stamped before the swap runs on the old model, every batch after on the new, whichever slot thread
  takes it first;
- in-flight batches finish on the old model; ``swap_in`` returns once the last of them is through, and the old
  processor is closed then;
- nothing downstream changes: the frames go on to the same tracker, counters and sinks, so no frame is dropped
  or counted twice and track ids carry on. The first frame of each source on the new model carries a
  ``model_swap`` event, which the JSONL and MQTT sinks write beside the frame's record.

Where the class list changes, counts continue **by class name**: the run keeps one class table, the old model's
names first; a class the new model shares keeps its id (and its count, its tracks, its line counters), a class
only the new model knows is appended after them, and a class it no longer has keeps its count, which stops
growing. The new model's detections are renumbered into that table (one ``take`` per frame, only when the tables
differ), so the summary's ``classes`` and ``detections_per_class`` read the same names before and after.

The wrapper also keeps a small rotating sample of recent decoded frames with the current model's detections
(``model.update_sample`` frames, copied every few batches): the gate of a candidate runs on them
(:mod:`edgert.pipeline.update_door`).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from edgert.pipeline.processor import Processor, ProcessorSlot
from edgert.vision.detections import Detections

if TYPE_CHECKING:
    from edgert.pipeline.feeds import _Frame
    from edgert.pipeline.parts import JSONDict

__all__ = ["HeldFrame", "UpdatableProcessor", "merge_names"]

log = logging.getLogger(__name__)

#: a frame is copied into the held sample every this many batches (a rotating sample spread over time, at the
#: cost of one frame copy per this many batches)
SAMPLE_EVERY = 8


def merge_names(run: Sequence[str], model: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray | None]:
    """The run's class table after a model with ``model`` names comes in, and the new model's id -> run id map
    (None: the same table, nothing to renumber). Names the run has keep their ids; new ones are appended."""
    if tuple(run) == tuple(model):
        return tuple(run), None
    table = list(run)
    where = {name: i for i, name in enumerate(table)}
    ids = []
    for name in model:
        if name not in where:
            where[name] = len(table)
            table.append(name)
        ids.append(where[name])
    mapping = np.asarray(ids, np.int32)
    if len(table) == len(model) and np.array_equal(mapping, np.arange(len(model))):
        return tuple(table), None
    return tuple(table), mapping


def _hand_over_frames(old: Processor, new: Processor) -> None:
    """The frame memory the run got through ``old`` goes on with ``new``.

    The GPU processor hands out page-locked (on Jetson: mapped) frame buffers and pins capture workers' rings;
    it knows them by address (``frame_buffers``), so its slots upload a frame with one DMA or read it in place,
    and it frees them at its close. The frames live on after a swap, so ``new`` learns their addresses and takes
    over their ownership (``old`` keeps the addresses for its last batches, and frees nothing at its close). The
    CPU processor has none of this. Not yet run on a GPU: the device rows check it."""
    known, theirs_too = getattr(old, "frame_buffers", None), getattr(new, "frame_buffers", None)
    if not isinstance(known, dict) or not isinstance(theirs_too, dict):
        return
    theirs_too.update(known)
    for owned in ("_frame_arrays", "_registrations"):
        theirs, mine = getattr(old, owned, None), getattr(new, owned, None)
        if isinstance(theirs, list) and isinstance(mine, list):
            mine.extend(theirs)
            theirs.clear()


class HeldFrame:
    """One frame of the held sample: its pixels (a copy) and the current model's class counts on it."""

    __slots__ = ("counts", "pixels", "source")

    def __init__(self, pixels: np.ndarray, counts: dict[str, int], source: int) -> None:
        self.pixels = pixels
        self.counts = counts
        self.source = source


class _Model:
    """One generation: the processor, its class renumbering, and what its batches cost."""

    def __init__(self, processor: Processor, label: str, mapping: np.ndarray | None, owned: bool) -> None:
        self.processor = processor
        self.label = label
        self.mapping = mapping
        self.owned = owned
        self.outstanding = 0  # batches stamped for it and not yet through
        self.prepared: set[int] = set()  # slot indexes whose thread ran processor.prepare
        self.batches = 0
        self.seconds = 0.0
        self.failed: BaseException | None = None
        self.recovered_to: _Model | None = None  # the model its failed batches went to instead


class UpdatableProcessor(Processor):
    """The run's processor, whose model can change between two batches (see the module's docstring).

    ``first``: the processor the run opened; ``owned``: whether closing this closes it. ``names``: the run's
    class table (the first model's); it grows when a model with other classes comes in.
    """

    def __init__(self, first: Processor, owned: bool = True, label: str = "", sample: int = 16) -> None:
        super().__init__()
        self.kind = first.kind
        self._lock = threading.Condition()
        self._first = _Model(first, label, None, owned)
        self._models: dict[int, _Model] = {0: self._first}
        self._generation = 0  # what the batcher stamps new batches with
        self._noted: set[int] = set()  # sources whose first frame on the current generation has its event
        self._batches_seen = 0
        self._sample: collections.deque[HeldFrame] = collections.deque(maxlen=max(1, sample))
        self.names = tuple(first.names)
        self.backend_name = first.backend_name
        self.input_name, self.input_shape, self.input_dtype = first.input_name, first.input_shape, first.input_dtype
        self.batch = first.batch
        self.batch_note = first.batch_note
        self.slots = [_SwapSlot(self, k) for k in range(len(first.slots))]
        #: the GPU processor pins capture workers' frame rings (edgert.pipeline.frames): they go to the first
        #: processor, and each swap hands them on (:func:`_hand_over_frames`)
        self.register_frames: Callable[[np.ndarray, int, int], None] | None = getattr(first, "register_frames", None)
        self.swaps = 0
        self._recovering = threading.Lock()
        #: called (on a slot's thread) when a batch fails on a swapped-in model: returns the previous model's
        #: processor, opened, to take the batch and every next one, or None; set by the update door
        self.on_failure: Callable[[BaseException], Processor | None] | None = None
        #: called first by :meth:`close` (the update door stops its thread: nothing swaps into a closed run)
        self.before_close: Callable[[], None] | None = None

    # -- what the orchestrator calls ------------------------------------------------------------------
    @property
    def current(self) -> Processor:
        with self._lock:
            return self._models[self._generation].processor

    @property
    def generation(self) -> int:
        return self._generation

    def batch_ready(self, frames: Sequence[_Frame]) -> None:
        """The batcher's call for each batch before it goes to the slots: the generation that runs it."""
        with self._lock:
            gen = self._generation
            model = self._models[gen]
            model.outstanding += 1
            self._batches_seen += 1
            for f in frames:
                f.generation = gen
                if gen and f.feed not in self._noted:  # the first frame of this source on the new model
                    self._noted.add(f.feed)
                    f.notes = [{"type": "model_swap", "frame": f.index, "model": model.label, "generation": gen}]

    def prepare(self, slot: ProcessorSlot) -> None:
        if isinstance(slot, _SwapSlot):
            slot.prepare_for(self._first)

    def warm_up(self, runs: int) -> None:
        self.current.warm_up(runs)

    def frame_buffer(self, height: int, width: int) -> np.ndarray | None:
        return self._first.processor.frame_buffer(height, width)

    def describe(self) -> JSONDict:
        out = dict(self.current.describe())
        out["model_generation"] = self._generation
        return out

    def stage_summary(self) -> dict[str, dict[str, float]] | None:
        return self.current.stage_summary()

    def held_sample(self) -> list[HeldFrame]:
        """The frames held for a gate: the rotating sample as it is now (the ring goes on filling)."""
        with self._lock:
            return list(self._sample)

    def mean_batch_ms(self, generation: int) -> float | None:
        """Mean time of one batch on generation ``generation`` (None before it ran one)."""
        model = self._models.get(generation)
        if model is None or not model.batches:
            return None
        return 1000.0 * model.seconds / model.batches

    def batches_on(self, generation: int) -> int:
        model = self._models.get(generation)
        return model.batches if model is not None else 0

    def failure(self, generation: int) -> BaseException | None:
        model = self._models.get(generation)
        return model.failed if model is not None else None

    # -- the swap -------------------------------------------------------------------------------------
    def swap_in(self, processor: Processor, label: str, stopping: threading.Event | None = None) -> int:
        """Make ``processor`` (opened and warmed by the caller, with as many slots as this one) the model of
        every batch stamped from now on; wait until the batches stamped before are through and close the old
        processor (when it is ours). Returns the new generation. ``stopping``: the run's stop event; waiting
        ends when it is set (the run closes what is left)."""
        old_gen = self._install(processor, label)
        self.retire(old_gen, stopping)
        return old_gen + 1

    def _install(self, processor: Processor, label: str) -> int:
        """``processor`` takes every batch stamped from now on; returns the generation it replaces."""
        if len(processor.slots) < len(self.slots):
            raise ValueError(f"the new processor has {len(processor.slots)} slots, the run {len(self.slots)}")
        names, mapping = merge_names(self.names, processor.names)
        with self._lock:
            old_gen = self._generation
            _hand_over_frames(self._models[old_gen].processor, processor)
            self._models[old_gen + 1] = _Model(processor, label, mapping, owned=True)
            self._generation = old_gen + 1
            self._noted = set()
            self.names = names
            self.swaps += 1
        return old_gen

    def retire(self, generation: int, stopping: threading.Event | None = None) -> bool:
        """Wait until the batches of ``generation`` are through, then close its processor (when ours); False
        when the run stopped first (the run's close then closes it)."""
        with self._lock:
            old = self._models.get(generation)
            if old is None or generation == self._generation:
                return old is None
            while old.outstanding and not (stopping is not None and stopping.is_set()):
                self._lock.wait(0.1)
            if old.outstanding:
                return False
            del self._models[generation]
        if old.owned:
            old.processor.close()
        return True

    def _recover(self, model: _Model, exc: BaseException) -> _Model | None:
        """A batch failed on ``model``: the model that takes it instead (the door reopens the previous one and it
        becomes current: a rollback), or None (the failure is the run's)."""
        with self._recovering:
            if model.recovered_to is not None:
                return model.recovered_to
            if self.on_failure is None:
                return None
            processor = self.on_failure(exc)
            if processor is None:
                return None
            self._install(processor, "rollback")
            with self._lock:
                model.recovered_to = self._models[self._generation]
            return model.recovered_to

    def _finished(self, model: _Model, seconds: float) -> None:
        with self._lock:
            model.outstanding -= 1
            model.batches += 1
            model.seconds += seconds
            if model.outstanding == 0:
                self._lock.notify_all()

    def _model_for(self, frames: Sequence[_Frame]) -> _Model:
        gen = frames[0].generation if frames else self._generation
        with self._lock:
            return self._models[gen]

    def _hold(self, frames: Sequence[_Frame], found: Sequence[Detections]) -> None:
        """Every :data:`SAMPLE_EVERY`-th batch, a copy of its first frame and its class counts into the sample."""
        if not frames or self._batches_seen % SAMPLE_EVERY:
            return
        f = frames[0]
        pixels = f.pixels
        if pixels is None:
            return
        held = HeldFrame(pixels.copy(), found[0].counts() if found else {}, f.feed)
        with self._lock:
            self._sample.append(held)

    def close(self) -> None:
        if self.before_close is not None:
            self.before_close()
        with self._lock:
            models = list(self._models.values())
            self._models = {}
        for model in models:
            if model.owned:
                model.processor.close()
        self.slots = []


class _SwapSlot(ProcessorSlot):
    """Slot ``k`` of the run: each batch goes to slot ``k`` of the processor of the batch's generation."""

    def __init__(self, owner: UpdatableProcessor, index: int) -> None:
        self.owner = owner
        self.index = index

    def prepare_for(self, model: _Model) -> None:
        """The processor's once-per-thread step for its slot (the GPU captures CUDA graphs), on this thread."""
        if self.index in model.prepared:
            return
        slot = model.processor.slots[self.index]
        with slot.active():
            model.processor.prepare(slot)
        model.prepared.add(self.index)

    def process(self, frames: Sequence[np.ndarray], timings: Sequence[np.ndarray]) -> list[Detections]:
        slot = self.owner.current.slots[self.index]
        with slot.active():
            return slot.process(frames, timings)

    def process_frames(self, frames: Sequence[_Frame]) -> Sequence[Detections]:
        owner = self.owner
        model = owner._model_for(frames)
        t0 = time.perf_counter()
        try:
            found = self._run(model, frames)
        except Exception as exc:
            model.failed = exc
            owner._finished(model, time.perf_counter() - t0)
            instead = owner._recover(model, exc) if model is not owner._first else None
            if instead is None:
                raise
            with owner._lock:
                instead.outstanding += 1
            model = instead
            t0 = time.perf_counter()
            found = self._run(model, frames)
        if model.mapping is not None:  # the new model's ids into the run's class table (counts by name)
            table = owner.names
            found = [Detections.trusted(d.xyxy, d.confidence, model.mapping[d.class_id], table) for d in found]
        owner._finished(model, time.perf_counter() - t0)
        if model is owner._models.get(owner.generation):
            owner._hold(frames, found)
        return found

    def _run(self, model: _Model, frames: Sequence[_Frame]) -> list[Detections]:
        self.prepare_for(model)
        processor = model.processor
        slot = processor.slots[self.index]
        with slot.active():
            if processor.batch >= len(frames):
                return list(slot.process_frames(frames))
            return [d for k in range(0, len(frames), processor.batch)  # a model of a smaller batch: in parts
                    for d in slot.process_frames(frames[k:k + processor.batch])]

    def active(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()  # each batch enters its own model's slot context (process_frames)

    def close(self) -> None:
        """The processors own their slots; :meth:`UpdatableProcessor.close` closes them."""
