"""Pipeline configuration: one frozen dataclass per stage, loaded from YAML.

Each stage validates itself when it is built, so a config object that exists is a valid one. Loading
from YAML keeps the line of every key, so an error reads
``pipeline.yaml:12: preprocess.mean: expected 3 numbers, got 2`` and points at the line to fix.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Tuple, TypeVar, Union

from edgert.coco import COCO_NAMES
from edgert.decoder_kinds import decode_kinds
from edgert.errors import ConfigError
from edgert.search_rules import at_least_one, length_penalty_problem, patience_problem, temperatures_problem

if TYPE_CHECKING:
    import yaml  # imported where a file is loaded: ``import edgert`` needs numpy alone

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_NODES",
    "MAX_IMAGE_SIDE",
    "MAX_QUEUE_SIZE",
    "TRACKERS",
    "AnalyticsConfig",
    "AsrConfig",
    "DecodeConfig",
    "FieldError",
    "LineConfig",
    "ModelConfig",
    "PipelineConfig",
    "PowerConfig",
    "PreprocessConfig",
    "RuntimeConfig",
    "SourceConfig",
    "SpeechConfig",
    "TrackConfig",
    "VadConfig",
    "WakeWordConfig",
    "ZoneConfig",
    "from_mapping",
    "load_config",
]

T = TypeVar("T")

#: Upper bounds on counts that allocate per unit (frame buffers, sessions).
MAX_QUEUE_SIZE = 64
MAX_SLOTS = 16
MAX_BATCH = 64
MAX_SOURCES = 64
MAX_THREADS = 256  # CPU threads for a backend: more is a typo, and each holds a stack


class FieldError(ValueError):
    """Raised by a config's ``__post_init__`` to blame one of its fields."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field_name = field_name
        self.message = message


def _check(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise FieldError(field_name, message)


def _rule(problem: str | None, field_name: str) -> None:
    """A rule kept in another home (:mod:`edgert.search_rules`): its problem, if any, names the key."""
    if problem is not None:
        raise FieldError(field_name, problem)


#: The largest image side preprocessing accepts (a 8192 x 8192 float32 NCHW input is 805 MB).
MAX_IMAGE_SIDE = 8192


# --------------------------------------------------------------------------------------------------
# Stage configs. Defaults are what a user of Ultralytics-style YOLO exports expects.


@dataclass(frozen=True)
class ModelConfig:
    path: str = ""
    backend: str = "auto"
    precision: Literal["fp32", "fp16", "int8", "best"] = "fp32"
    threads: int = 0  # 0: the backend's default
    engine_cache: str | None = None
    # Constant values for inputs other than the image (e.g. orig_target_sizes: [640, 640]), broadcast to
    # each input's shape. A model with such an input and no value here is refused, not fed zeros.
    inputs: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(0 <= self.threads <= MAX_THREADS, "threads",
               f"expected a count from 0 to {MAX_THREADS}, got {self.threads}")


@dataclass(frozen=True)
class PreprocessConfig:
    size: tuple[int, int] | None = None  # (height, width); None: from the model's input
    resize: Literal["letterbox", "stretch"] = "letterbox"
    pad_value: int = 114
    color: Literal["rgb", "bgr"] = "rgb"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    layout: Literal["auto", "NCHW", "NHWC"] = "auto"
    dtype: Literal["auto", "float32", "float16", "uint8"] = "auto"

    def __post_init__(self) -> None:
        _check(0 <= self.pad_value <= 255, "pad_value", f"expected 0..255, got {self.pad_value}")
        _check(all(s != 0 for s in self.std), "std", "expected non-zero values")
        if self.size is not None:
            _check(all(0 < s <= MAX_IMAGE_SIDE for s in self.size), "size",
                   f"expected sizes 1..{MAX_IMAGE_SIDE}, got {list(self.size)}")


@dataclass(frozen=True)
class DecodeConfig:
    kind: str = "auto"  # a key of edgert.decoder_kinds.DECODERS, or auto
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    classes: tuple[int, ...] | None = None  # keep only these class ids
    names: tuple[str, ...] | None = None  # class names; None: from the model or COCO
    agnostic: bool = False

    def __post_init__(self) -> None:
        kinds = decode_kinds()  # the decoder table, so that a registered decoder is a valid kind at once
        _check(self.kind in kinds, "kind", f"expected one of {', '.join(kinds)}, got {_kind(self.kind)}")
        _check(0.0 <= self.conf <= 1.0, "conf", f"expected 0..1, got {self.conf}")
        _check(0.0 <= self.iou <= 1.0, "iou", f"expected 0..1, got {self.iou}")
        _check(self.max_det > 0, "max_det", f"expected > 0, got {self.max_det}")


@dataclass(frozen=True)
class SourceConfig:
    uri: str = ""
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    fourcc: str | None = None
    loop: bool = False
    sensor_mode: int | None = None
    flip: int = 0
    preload: bool = False  # decode the whole file into memory before the clock starts (benchmarks)
    name: str | None = None  # how results, events and statistics name this source; None: its index
    sinks: tuple[str, ...] = ()  # sinks that get this source's frames only
    timeout_s: float | None = None  # no frame for this long is a stall; None: 10 s for files, 5 s for live
    # thread: decoded on a capture thread of the pipeline's process; process: in a worker process per source,
    # into a shared frame ring; auto: process from 4 sources on a host of 4+ cores (edgert.vision.capture says why)
    capture: Literal["auto", "thread", "process"] = "auto"

    def __post_init__(self) -> None:
        if self.timeout_s is not None:
            _check(0 < self.timeout_s <= 3600, "timeout_s", f"expected seconds 0..3600, got {self.timeout_s}")
        if self.fourcc is not None:
            _check(len(self.fourcc) == 4, "fourcc", f"expected 4 characters, got {self.fourcc!r}")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the one pipeline runs: which processor, how many frames at once, and the run's limits.

    ``processing``: ``cpu`` (host preprocessing, the session, host decode + NMS) or ``gpu`` (letterbox
    kernel, the session on device buffers, GPU confidence filter); ``auto`` picks ``gpu`` whenever the
    backend runs on a GPU and CUDA works. ``slots``: frames processed at once, each slot with its own session
    (an execution context of one engine, or an ONNX Runtime session) and, on the GPU, its own stream; None:
    2 on the CPU (two single-threaded sessions beat one two-threaded one on a few cores), 3 on the GPU.
    ``memory`` and ``cuda_graph`` apply to the GPU processor only; None means its default (auto / off).
    ``metrics``: ``HOST:PORT`` to serve Prometheus metrics while the pipeline runs.
    """

    queue_size: int = 4
    max_frames: int | None = None
    warmup: int = 2
    processing: Literal["auto", "cpu", "gpu"] = "auto"
    slots: int | None = None
    memory: Literal["auto", "pinned", "zero-copy"] | None = None
    cuda_graph: bool | None = None
    metrics: str | None = None
    batch: int | None = None
    batch_timeout_ms: float = 10.0

    def __post_init__(self) -> None:
        _check(self.queue_size >= 1, "queue_size", f"expected >= 1, got {self.queue_size}")
        _check(self.queue_size <= MAX_QUEUE_SIZE, "queue_size",
               f"expected <= {MAX_QUEUE_SIZE} (each frame in flight holds a frame buffer), got {self.queue_size}")
        if self.max_frames is not None:
            _check(self.max_frames >= 0, "max_frames", f"expected a number >= 0, got {self.max_frames}")
        _check(self.warmup >= 0, "warmup", f"expected a number >= 0, got {self.warmup}")
        if self.slots is not None:
            _check(1 <= self.slots <= MAX_SLOTS, "slots", f"expected 1..{MAX_SLOTS}, got {self.slots}")
        if self.batch is not None:
            _check(1 <= self.batch <= MAX_BATCH, "batch", f"expected 1..{MAX_BATCH}, got {self.batch}")
        _check(0 <= self.batch_timeout_ms <= 10_000, "batch_timeout_ms",
               f"expected 0..10000 milliseconds, got {self.batch_timeout_ms}")


@dataclass(frozen=True)
class PowerConfig:
    budget_w: float | None = None
    rail: str | None = None
    meter: str = "auto"
    sample_hz: float = 10.0

    def __post_init__(self) -> None:
        if self.budget_w is not None:
            _check(self.budget_w > 0, "budget_w", f"expected watts > 0, got {self.budget_w}")
        _check(self.sample_hz > 0, "sample_hz", f"expected > 0, got {self.sample_hz}")


@dataclass(frozen=True)
class VadConfig:
    """Silero VAD: hysteresis thresholds and segment timing (seconds)."""

    model: str = ""
    threshold: float = 0.5
    neg_threshold: float | None = None  # None: threshold - 0.15, as silero-vad does
    min_speech_s: float = 0.25
    min_silence_s: float = 0.5
    pad_s: float = 0.1
    max_speech_s: float = 28.0  # Whisper reads at most 30 s at once

    def __post_init__(self) -> None:
        _check(0.0 < self.threshold < 1.0, "threshold", f"expected 0..1, got {self.threshold}")
        if self.neg_threshold is not None:
            _check(0.0 <= self.neg_threshold <= self.threshold, "neg_threshold",
                   f"expected 0..threshold ({self.threshold}), got {self.neg_threshold}")
        for name in ("min_speech_s", "min_silence_s", "pad_s"):
            _check(getattr(self, name) >= 0, name, f"expected seconds >= 0, got {getattr(self, name)}")
        _check(self.min_speech_s < self.max_speech_s <= 30.0, "max_speech_s",
               f"expected min_speech_s < max_speech_s <= 30, got {self.max_speech_s}")


@dataclass(frozen=True)
class WakeWordConfig:
    """openWakeWord: classifier models (one per word), the shared front end, firing rules."""

    models: tuple[str, ...] = ()
    melspec: str = ""  # "": melspectrogram.onnx beside the first word model
    embedding: str = ""  # "": embedding_model.onnx beside the first word model
    threshold: float = 0.5
    refractory_s: float = 2.0
    listen_s: float = 8.0  # in a chain, speech starting this long after a wake word is transcribed

    def __post_init__(self) -> None:
        _check(0.0 < self.threshold <= 1.0, "threshold", f"expected 0..1, got {self.threshold}")
        _check(self.refractory_s >= 0, "refractory_s", f"expected seconds >= 0, got {self.refractory_s}")
        _check(self.listen_s > 0, "listen_s", f"expected seconds > 0, got {self.listen_s}")


@dataclass(frozen=True)
class AsrConfig:
    """Whisper: a folder holding encoder.onnx, decoder.onnx and tokenizer.json, and how its tokens are searched.

    ``decoding``: ``greedy`` or ``beam`` (openai-whisper's beam search). ``temperatures``: the fallback
    schedule; ``[0.0]`` decodes once, ``[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]`` is openai-whisper's. The search keys
    left at None take openai-whisper's values where they apply and are refused where they cannot
    (``beam_size`` with greedy decoding, ``best_of`` without a temperature above 0, ...).
    """

    model: str = ""
    max_tokens: int = 224
    decoder: Literal["auto", "exact", "bucketed"] = "auto"
    no_speech_threshold: float | None = 0.6  # Whisper's silence rule; None: keep every text
    logprob_threshold: float = -1.0
    decoding: Literal["greedy", "beam"] = "greedy"
    beam_size: int | None = None  # beam only; None: 5
    patience: float | None = None  # beam only; None: 1.0 (stop once beam_size sequences have ended)
    length_penalty: float | None = None  # ranking of beams or samples: None sum logprob / length, else alpha 0..1
    temperatures: tuple[float, ...] = (0.0,)
    best_of: int | None = None  # samples at each temperature above 0; None: 5
    compression_ratio_threshold: float | None = None  # with a fallback only; None: 2.4 (.inf: never on repetition)
    condition_on_previous_text: bool = True  # long audio: each 30 s window prompted with the text before it

    def __post_init__(self) -> None:
        _check(1 <= self.max_tokens <= 254, "max_tokens", f"expected 1..254, got {self.max_tokens}")
        if self.no_speech_threshold is not None:
            _check(0.0 <= self.no_speech_threshold <= 1.0, "no_speech_threshold",
                   f"expected 0..1, got {self.no_speech_threshold}")
        beam = self.decoding == "beam"
        t = self.temperatures
        _rule(temperatures_problem(t, beam), "temperatures")
        sampled = any(x > 0 for x in t)
        for name in ("beam_size", "patience"):
            _check(getattr(self, name) is None or beam, name, "applies to decoding: beam only (decoding is greedy)")
        _rule(None if self.beam_size is None else at_least_one(self.beam_size), "beam_size")
        _rule(patience_problem(self.patience, self.beam_size), "patience")
        _check(self.best_of is None or sampled, "best_of",
               "applies to sampling only: add a temperature above 0 to temperatures")
        _rule(None if self.best_of is None else at_least_one(self.best_of), "best_of")
        _check(self.length_penalty is None or beam or sampled, "length_penalty",
               "ranks beams or samples: it needs decoding: beam or a temperature above 0")
        _rule(length_penalty_problem(self.length_penalty), "length_penalty")
        _check(self.compression_ratio_threshold is None or len(t) > 1, "compression_ratio_threshold",
               "decides the temperature fallback: it needs more than one temperature")
        if self.compression_ratio_threshold is not None:
            _check(self.compression_ratio_threshold > 0, "compression_ratio_threshold",
                   f"expected > 0, got {self.compression_ratio_threshold}")

    def search(self) -> dict[str, Any]:
        """The Transcriber's search arguments, None resolved to openai-whisper's values."""
        return {"decoding": self.decoding, "beam_size": self.beam_size or 5, "patience": self.patience,
                "length_penalty": self.length_penalty, "temperatures": self.temperatures,
                "best_of": self.best_of or 5,
                "compression_ratio_threshold": 2.4 if self.compression_ratio_threshold is None
                else self.compression_ratio_threshold}


@dataclass(frozen=True)
class SpeechConfig:
    """The speech chain (vad -> wakeword -> asr); () runs the stage of ``task`` (after vad if it has a model)."""

    chain: tuple[Literal["vad", "wakeword", "asr"], ...] = ()
    chunk_samples: int = 512  # 32 ms at 16 kHz: one VAD window
    vad: VadConfig = field(default_factory=VadConfig)
    wakeword: WakeWordConfig = field(default_factory=WakeWordConfig)
    asr: AsrConfig = field(default_factory=AsrConfig)

    def __post_init__(self) -> None:
        _check(self.chunk_samples >= 1, "chunk_samples", f"expected >= 1, got {self.chunk_samples}")
        order = ("vad", "wakeword", "asr")
        _check(len(set(self.chain)) == len(self.chain) and list(self.chain) == sorted(self.chain, key=order.index),
               "chain", f"expected stages in the order vad, wakeword, asr, each once; got {', '.join(self.chain)}")
        _check("wakeword" not in self.chain or "asr" not in self.chain or "vad" in self.chain, "chain",
               "a wake word gates speech recognition through VAD segments: put vad first")


#: Trackers ``track.tracker`` may name, each a class of the ``trackers`` package (edgert/analytics/tracking.py).
TRACKERS: dict[str, str] = {"bytetrack": "ByteTrackTracker", "sort": "SORTTracker", "ocsort": "OCSORTTracker"}


@dataclass(frozen=True)
class TrackConfig:
    """Multi-object tracking after decoding. Names and defaults follow the ``trackers`` package, except the
    thresholds, which are set for small detectors run at conf 0.25-0.35 (trackers' 0.7 suits large ones)."""

    tracker: str = "bytetrack"
    track_activation_threshold: float = 0.5  # a new track needs a detection this confident
    high_conf_det_threshold: float = 0.5  # ByteTrack's split between its two matching stages
    minimum_iou_threshold: float = 0.1  # a detection joins a track whose predicted box overlaps it this much
    lost_track_buffer: int = 30  # frames (at 30 fps) a lost track waits to be found again
    minimum_consecutive_frames: int = 1  # frames a track must be seen before it gets an id
    frame_rate: float | None = None  # None: the source's rate, else 30
    keep_untracked: bool = False  # keep detections no track claims (track_id -1) instead of dropping them

    def __post_init__(self) -> None:
        _check(self.tracker in TRACKERS, "tracker",
               f"unknown tracker {self.tracker!r}. Note: valid trackers are {', '.join(TRACKERS)}")
        for name in ("track_activation_threshold", "high_conf_det_threshold", "minimum_iou_threshold"):
            value = getattr(self, name)
            _check(0.0 <= value <= 1.0, name, f"expected 0..1, got {value}")
        _check(self.lost_track_buffer >= 0, "lost_track_buffer", f"expected frames >= 0, got {self.lost_track_buffer}")
        _check(self.minimum_consecutive_frames >= 1, "minimum_consecutive_frames",
               f"expected >= 1, got {self.minimum_consecutive_frames}")
        if self.frame_rate is not None:
            _check(self.frame_rate > 0, "frame_rate", f"expected frames per second > 0, got {self.frame_rate}")


def _check_finite(points: tuple[tuple[float, float], ...], field_name: str) -> None:
    for point in points:
        _check(len(point) == 2, field_name, f"expected points of 2 numbers [x, y], got {list(point)}")
        _check(all(isinstance(v, (int, float)) and math.isfinite(v) for v in point), field_name,
               f"coordinates must be finite numbers, got {list(point)}")


@dataclass(frozen=True)
class LineConfig:
    """A counting line from ``points[0]`` to ``points[1]`` (frame pixels). Walking from the first point to
    the second, a box whose anchor crosses from the right-hand side to the left-hand side counts ``in``."""

    name: str = ""
    points: tuple[tuple[float, float], ...] = ()
    classes: tuple[str, ...] | None = None  # class names (or ids) to count; None: every class
    direction: Literal["in", "out", "both"] = "both"  # which crossings count (and become events)

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "expected a name for the line")
        _check(len(self.points) == 2, "points", f"expected 2 points [[x1, y1], [x2, y2]], got {len(self.points)}")
        _check_finite(self.points, "points")
        _check(tuple(self.points[0]) != tuple(self.points[1]), "points", "the two points are the same")
        _check(self.direction in ("in", "out", "both"), "direction",
               f"expected in, out or both, got {self.direction!r}")


@dataclass(frozen=True)
class ZoneConfig:
    """A polygon (frame pixels, at least 3 corners): occupancy, entries, exits and time in zone per track."""

    name: str = ""
    polygon: tuple[tuple[float, float], ...] = ()
    classes: tuple[str, ...] | None = None
    crowded_at: int | None = None  # occupancy (tracks inside) that is crowded: zone_crowded, then zone_clear below it

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "expected a name for the zone")
        _check(len(self.polygon) >= 3, "polygon",
               f"expected at least 3 points [[x, y], ...], got {len(self.polygon)}")
        _check_finite(self.polygon, "polygon")
        _check(self.crowded_at is None or self.crowded_at >= 1, "crowded_at",
               f"expected a number of tracks >= 1, got {self.crowded_at}")


@dataclass(frozen=True)
class AnalyticsConfig:
    """Counting lines and zones over tracks, judged at one point of each box (``anchor``)."""

    lines: tuple[LineConfig, ...] = ()
    zones: tuple[ZoneConfig, ...] = ()
    anchor: Literal["bottom_center", "center"] = "bottom_center"  # bottom centre: where a person stands
    lost_after: int = 30  # frames a track may go unseen before it counts as gone (zone_exit with reason lost)

    def __post_init__(self) -> None:
        names = [x.name for x in self.lines] + [z.name for z in self.zones]
        twice = sorted({n for n in names if names.count(n) > 1})
        _check(not twice, "lines" if any(x.name in twice for x in self.lines) else "zones",
               f"names must be unique across lines and zones; used twice: {', '.join(twice)}")
        _check(self.lost_after >= 1, "lost_after", f"expected frames >= 1, got {self.lost_after}")

    @property
    def enabled(self) -> bool:
        return bool(self.lines or self.zones)


@dataclass(frozen=True)
class PipelineConfig:
    task: Literal["detect", "vad", "wakeword", "asr"] = "detect"
    model: ModelConfig = field(default_factory=ModelConfig)
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    sources: tuple[SourceConfig, ...] = ()  # several sources in one pipeline (then ``source`` stays unset)
    sinks: tuple[str, ...] = ()
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    speech: SpeechConfig = field(default_factory=SpeechConfig)
    track: TrackConfig | None = None  # None: no tracking
    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig)

    def __post_init__(self) -> None:
        if self.sources:
            _check(len(self.sources) <= MAX_SOURCES, "sources",
                   f"expected at most {MAX_SOURCES} sources, got {len(self.sources)}")
            _check(not self.source.uri, "source", "give either source or sources, not both")
            names = [s.name for s in self.sources if s.name is not None]
            dup = sorted({n for n in names if names.count(n) > 1})
            _check(not dup, "sources", f"source names must differ; {', '.join(dup)} appears more than once")

    def all_sources(self) -> tuple[SourceConfig, ...]:
        """``sources``, or the one ``source``."""
        return self.sources if self.sources else (self.source,)


# --------------------------------------------------------------------------------------------------
# Loading


class _Where:
    """Where a value came from: file name plus the line of each key path."""

    def __init__(self, filename: str, lines: dict[tuple[str, ...], int], base: Path | None = None) -> None:
        self.filename = filename
        self.lines = lines
        self.base = base  # the folder relative paths in the file are relative to

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        key = ".".join(path) if path else "(top level)"
        line = None
        probe = path
        while probe and line is None:  # a missing key is blamed on its parent's line
            line = self.lines.get(probe)
            probe = probe[:-1]
        loc = f"{self.filename}:{line}" if line is not None else self.filename
        return ConfigError(f"{loc}: {key}: {message}")


#: A config is a few kilobytes; past this it is not a config (and PyYAML takes minutes and GBs on 100 MB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024
#: Nodes the document may hold once aliases are expanded. Aliases share nodes in the composed tree but
#: every consumer that walks the data expands them: nine nested aliases of nine items are 387 million.
MAX_CONFIG_NODES = 100_000


def _expanded_size(node: yaml.Node, memo: dict[int, int], filename: str) -> int:
    """Nodes under ``node`` with every alias expanded, counted without expanding (each node once)."""
    import yaml

    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a node that contains itself (a recursive alias) counts once, not forever
    total = 1
    if isinstance(node, yaml.MappingNode):
        children: list[yaml.Node] = [n for pair in node.value for n in pair]
    elif isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    else:
        children = []
    for child in children:
        total += _expanded_size(child, memo, filename)
        if total > MAX_CONFIG_NODES:
            line = node.start_mark.line + 1
            raise ConfigError(f"{filename}:{line}: more than {MAX_CONFIG_NODES} values once aliases are expanded. "
                              "Note: a config this large is a mistake or an alias bomb")
    memo[id(node)] = total
    return total


def _key_lines(node: yaml.Node, prefix: tuple[str, ...], out: dict[tuple[str, ...], int],
               filename: str, active: set[int]) -> None:
    """Record the line of every key path, and refuse a key given twice in one mapping (naming both lines).

    Bounded by :func:`_expanded_size` having run first; ``active`` stops a recursive alias.
    """
    import yaml

    if id(node) in active:
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value)
            line = key_node.start_mark.line + 1
            if key != "<<" and isinstance(key_node, yaml.ScalarNode):  # merge keys are YAML's own override
                if key in seen:
                    name = ".".join((*prefix, key))
                    raise ConfigError(f"{filename}:{line}: {name}: given twice (also at line {seen[key]}). "
                                      "Note: remove one; YAML would silently keep the last")
                seen.setdefault(key, line)
            path = (*prefix, key)
            out.setdefault(path, line)
            _key_lines(value_node, path, out, filename, active)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            out.setdefault(path, item.start_mark.line + 1)
            _key_lines(item, path, out, filename, active)
    active.discard(id(node))


def _read_config_text(p: Path) -> str:
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)  # read no more than the limit, whatever the file (a FIFO, /dev/zero)
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a folder, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: config file is larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB. "
                          "Note: a pipeline config is a few kilobytes; is this the right file?")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: cannot read config: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


@typing.overload
def load_config(path: str | Path) -> PipelineConfig: ...
@typing.overload
def load_config(path: str | Path, cls: type[T]) -> T: ...
def load_config(path: str | Path, cls: type[Any] = PipelineConfig) -> Any:
    """Load a YAML file into ``cls`` (a pipeline by default); every problem is a one-line :class:`ConfigError`.

    Bounded: files over :data:`MAX_CONFIG_BYTES` and documents over :data:`MAX_CONFIG_NODES` values (aliases
    expanded) are refused before anything walks them; a key given twice in one mapping is an error.
    """
    import yaml

    p = Path(path)
    text = _read_config_text(p)
    # Compose once, check the node tree, then construct from the same tree (no second parse).
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[tuple[str, ...], int] = {}
        if node is not None:
            _expanded_size(node, {}, str(p))
            _key_lines(node, (), lines, str(p), set())
            data = loader.construct_document(node)
        else:
            data = None
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else "?"
        raise ConfigError(f"{p}:{line}: invalid YAML: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{p}: invalid YAML: nested too deeply") from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    loaded = from_mapping(cls, data, _Where(str(p), lines, p.resolve().parent))
    if isinstance(loaded, PipelineConfig):
        loaded = _rebase_paths(loaded, p.resolve().parent)
    return loaded


def _rebase(text: str, base: Path) -> str:
    """A relative local path (or ``file://``/``jsonl://`` path) in a file made relative to ``base``; URIs of
    other schemes, ``-``, camera indices, ``~`` and absolute paths as they are."""
    for prefix in ("jsonl://", "file://"):
        if text.startswith(prefix):
            rest = text[len(prefix):]
            return text if rest in ("", "-") else prefix + _rebase(rest, base)
    if not text or text == "-" or "://" in text or text.isdigit() or text.startswith(("/", "~")):
        return text
    return str(base / text)


def _rebase_paths(config: PipelineConfig, base: Path) -> PipelineConfig:
    """Paths in a YAML file follow the file, not the working directory (as ``decode.names`` and recipes do):
    model, engine cache, sources, sinks (a source's own too) and the speech models."""
    def source(s: SourceConfig) -> SourceConfig:
        return dataclasses.replace(s, uri=_rebase(s.uri.strip(), base) if s.uri.strip() else s.uri,
                                   sinks=tuple(_rebase(x, base) for x in s.sinks))

    model = config.model
    model = dataclasses.replace(model, path=_rebase(model.path, base),
                                engine_cache=_rebase(model.engine_cache, base) if model.engine_cache else None)
    sp = config.speech
    speech = dataclasses.replace(
        sp, vad=dataclasses.replace(sp.vad, model=_rebase(sp.vad.model, base)),
        wakeword=dataclasses.replace(sp.wakeword, models=tuple(_rebase(m, base) for m in sp.wakeword.models),
                                     melspec=_rebase(sp.wakeword.melspec, base),
                                     embedding=_rebase(sp.wakeword.embedding, base)),
        asr=dataclasses.replace(sp.asr, model=_rebase(sp.asr.model, base)))
    return dataclasses.replace(config, model=model, source=source(config.source),
                               sources=tuple(source(s) for s in config.sources),
                               sinks=tuple(_rebase(x, base) for x in config.sinks), speech=speech)


#: Stage configs that may be given as one string in YAML, and the field the string fills:
#: ``model: yolov8n.onnx`` is ``model: {path: yolov8n.onnx}``, ``source: /dev/video0`` is ``source: {uri: ...}``.
SHORTHANDS: dict[type, str] = {ModelConfig: "path", SourceConfig: "uri"}


def _labels(value: str, where: _Where, path: tuple[str, ...]) -> tuple[str, ...]:
    """``decode.names`` as a string: ``coco`` (the 80 COCO names) or a labels file, one name per line.

    The file format is the one jetson-inference and DeepStream use; a relative path is relative to the
    YAML file's folder (the working directory for configs not read from a file).
    """
    if value.strip().lower() == "coco":
        return COCO_NAMES
    labels = Path(value).expanduser()
    if not labels.is_absolute() and where.base is not None:
        labels = where.base / labels
    try:
        text = labels.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise where.error(path, f"labels file {labels} not found. Note: give a file with one class name per line, "
                                "a list of names, or coco") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise where.error(path, f"cannot read labels file {labels}: {exc}") from None
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise where.error(path, f"labels file {labels} is empty")
    for i, line in enumerate(lines):
        if not line:  # an empty line would shift every class id after it
            raise where.error(path, f"{labels}:{i + 1}: empty line in the labels file (one class name per line)")
    return tuple(lines)


def from_mapping(cls: type[T], data: Any, where: _Where | None = None, path: tuple[str, ...] = ()) -> T:
    """Build the dataclass ``cls`` from plain data, checking every key and type."""
    where = where or _Where("<config>", {})
    shorthand = SHORTHANDS.get(cls)
    if shorthand is not None and isinstance(data, str):
        data = {shorthand: data}
    if not isinstance(data, Mapping):
        expected = f"a string ({shorthand}) or a mapping" if shorthand else "a mapping"
        raise where.error(path, f"expected {expected}, got {_kind(data)}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    hints = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        key = str(key)
        if key not in fields:
            valid = ", ".join(sorted(fields))
            raise where.error((*path, key), f"unknown key. Note: valid keys are {valid}")
        if cls is DecodeConfig and key == "names" and isinstance(value, str):
            kwargs[key] = _labels(value, where, (*path, key))
            continue
        kwargs[key] = _convert(hints[key], value, where, (*path, key))
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise where.error((*path, exc.field_name), exc.message) from None


# Field types. With ``from __future__ import annotations`` every annotation is a string; typing.get_type_hints
# would evaluate ``str | None`` and ``tuple[int, int]``, which Python 3.8 (JetPack 5) cannot. So the strings are
# parsed here, into the typing forms every supported Python has (Optional, Tuple, Literal).

_BUILTIN_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "None": type(None)}
_TYPES_CACHE: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    cached = _TYPES_CACHE.get(cls)
    if cached is None:
        namespace = vars(sys.modules[cls.__module__])
        cached = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            tp = f.type
            cached[f.name] = _parse_annotation(tp, namespace) if isinstance(tp, str) else tp
        _TYPES_CACHE[cls] = cached
    return cached


def _parse_annotation(text: str, namespace: Mapping[str, Any]) -> Any:
    try:
        node = ast.parse(text, mode="eval").body
        return _annotation(node, namespace)
    except (SyntaxError, KeyError, TypeError) as exc:
        raise TypeError(f"config field type {text!r} is not supported by the loader: {exc}") from None  # an edgert bug


def _subscript_items(node: ast.Subscript) -> list[ast.expr]:
    sub: Any = node.slice
    if sys.version_info < (3, 9) and isinstance(sub, ast.Index):  # Python 3.8 wraps the subscript
        sub = sub.value  # type: ignore[attr-defined,unused-ignore]
    return list(sub.elts) if isinstance(sub, ast.Tuple) else [sub]


def _annotation(node: ast.expr, namespace: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return type(None)
        if isinstance(node.value, str):
            return node.value  # a Literal's member
        raise TypeError(f"unexpected constant {node.value!r}")
    if isinstance(node, ast.Name):
        if node.id in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[node.id]
        return namespace[node.id]  # a config dataclass of this module
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _annotation(node.left, namespace), _annotation(node.right, namespace)
        return Union[left, right]
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        items = _subscript_items(node)
        head = node.value.id
        if head == "Literal":
            return Literal.__getitem__(tuple(_literal(i) for i in items))
        if head == "tuple":
            if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
                return Tuple[_annotation(items[0], namespace), ...]
            return Tuple.__getitem__(tuple(_annotation(i, namespace) for i in items))
        if head == "Optional":
            return Optional[_annotation(items[0], namespace)]
        if head == "dict" and len(items) == 2:
            key, value = _annotation(items[0], namespace), _annotation(items[1], namespace)
            return Dict[key, value]  # type: ignore[valid-type]
    raise TypeError(ast.dump(node))


def _literal(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    raise TypeError(f"unexpected Literal member {ast.dump(node)}")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _convert(tp: Any, value: Any, where: _Where, path: tuple[str, ...]) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where, path)
        errors = []
        for a in inner:
            try:
                return _convert(a, value, where, path)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[-1]
    if origin is Literal:
        if value not in args:
            choices = ", ".join(str(a) for a in args)
            raise where.error(path, f"expected one of {choices}, got {_kind(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise where.error(path, f"expected a list, got {_kind(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, where, (*path, str(i))) for i, v in enumerate(value))
        if len(value) != len(args):
            noun = "numbers" if all(a in (int, float) for a in args) else "items"
            raise where.error(path, f"expected {len(args)} {noun}, got {len(value)}")
        return tuple(_convert(a, v, where, (*path, str(i))) for i, (a, v) in enumerate(zip(args, value)))
    if tp is SourceConfig and isinstance(value, str):
        return SourceConfig(uri=value)  # a source given as its URI alone
    if origin is dict:
        if not isinstance(value, Mapping):
            raise where.error(path, f"expected a mapping, got {_kind(value)}")
        key_type, value_type = args
        return {_convert(key_type, k, where, (*path, str(k))): _convert(value_type, v, where, (*path, str(k)))
                for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where, path)  # type: ignore[arg-type]
    if tp is bool:
        if not isinstance(value, bool):
            raise where.error(path, f"expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.error(path, f"expected a whole number, got {_kind(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise where.error(path, f"expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise where.error(path, f"expected a string, got {_kind(value)}")
        return str(value)
    raise TypeError(f"config field type {tp!r} is not supported by the loader")  # an edgert bug
