"""The pipeline's configuration as data: one frozen dataclass per stage, each checking itself when built
(a config object that exists is a valid one), and the bounds those checks use."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from edgert.decoder_kinds import decode_kinds
from edgert.search_rules import (
    at_least_one,
    auto_decoding,
    decoding_problem,
    length_penalty_problem,
    patience_problem,
    temperatures_problem,
)
from edgert.tasks import SPEECH_TASKS, SpeechTask, Task

#: Upper bounds on counts that allocate per unit (frame buffers, sessions).
MAX_QUEUE_SIZE = 64
MAX_SLOTS = 16
MAX_BATCH = 64
MAX_TRACK_WORKERS = 64
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


def _kind(value: Any) -> str:
    """A value as an error names it: ``the string 'x'``, ``a list of 3``, ``nothing``."""
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
    # Model updates on the running pipeline (docs/fleet.md, "Update models in a fleet"): a model file dropped
    # into update_dir is built in the background, checked on the run's own recent frames and swapped in.
    update_dir: str | None = None
    # mqtt://BROKER/PREFIX/DEVICE: update commands on PREFIX/DEVICE/model/update, status on .../model/status
    update_mqtt: str | None = None
    update_files: str | None = None  # the folder an MQTT update command may name files in
    update_min_map: float = 0.5  # gate: the candidate's mAP@0.5:0.95 against its FP32 reference, at least
    update_max_count_ratio: float = 4.0  # gate: detections on the held frames within this factor of the current's
    update_sample: int = 16  # recent frames held for the gate
    update_probation_s: float = 120.0  # a new model's first seconds: an error or a slowdown rolls it back
    update_max_slowdown: float = 3.0  # ... a batch slower than this many times the previous model's, on average

    def __post_init__(self) -> None:
        _check(0 <= self.threads <= MAX_THREADS, "threads",
               f"expected a count from 0 to {MAX_THREADS}, got {self.threads}")
        _check(0.0 <= self.update_min_map <= 1.0, "update_min_map", f"expected 0..1, got {self.update_min_map}")
        _check(self.update_max_count_ratio >= 1.0, "update_max_count_ratio",
               f"expected >= 1, got {self.update_max_count_ratio}")
        _check(1 <= self.update_sample <= 256, "update_sample", f"expected 1..256 frames, got {self.update_sample}")
        _check(self.update_probation_s >= 0.0, "update_probation_s", f"expected >= 0, got {self.update_probation_s}")
        _check(self.update_max_slowdown >= 1.0, "update_max_slowdown", f"expected >= 1, got {self.update_max_slowdown}")
        _check(not self.update_mqtt or bool(self.update_dir and self.update_files), "update_mqtt",
               "needs update_dir (where candidates go) and update_files (the folder a command may name files in)")


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
    # a video file delivered at its own frame rate, as a camera would (its frame times against the clock),
    # not as fast as it decodes: the camera case from a recording (latency at the camera's rate)
    realtime: bool = False
    # realtime: how far into a frame interval this source's frames come (0 <= x < 1). Unsynchronized cameras run
    # out of step with each other, where files started together are in step; --stagger spreads N sources over one
    realtime_phase: float = 0.0
    name: str | None = None  # how results, events and statistics name this source; None: its index
    sinks: tuple[str, ...] = ()  # sinks that get this source's frames only
    timeout_s: float | None = None  # no frame for this long is a stall; None: 10 s for files, 5 s for live
    # thread: decoded on a capture thread of the pipeline's process; process: in a worker process per source,
    # into a shared frame ring; auto: process from 4 sources on a host of 4+ cores (edgert.io.capture says why)
    capture: Literal["auto", "thread", "process"] = "auto"

    def __post_init__(self) -> None:
        if self.timeout_s is not None:
            _check(0 < self.timeout_s <= 3600, "timeout_s", f"expected seconds 0..3600, got {self.timeout_s}")
        if self.fourcc is not None:
            _check(len(self.fourcc) == 4, "fourcc", f"expected 4 characters, got {self.fourcc!r}")
        _check(0.0 <= self.realtime_phase < 1.0, "realtime_phase",
               f"expected a fraction of a frame interval 0 <= x < 1, got {self.realtime_phase}")
        _check(self.realtime or not self.realtime_phase, "realtime_phase",
               "applies to a source delivered at its own rate only. Note: set source.realtime (--realtime)")


@dataclass(frozen=True)
class RuntimeConfig:
    """How the one pipeline runs: which processor, how many frames at once, and the run's limits.

    ``processing``: ``cpu`` (host preprocessing, the session, host decode + NMS) or ``gpu`` (letterbox
    kernel, the session on device buffers, GPU confidence filter); ``auto`` picks ``gpu`` whenever the
    backend runs on a GPU and CUDA works. ``slots``: frames processed at once, each slot with its own session
    (an execution context of one engine, or an ONNX Runtime session) and, on the GPU, its own stream; None:
    2 on the CPU (two single-threaded sessions beat one two-threaded one on a few cores), 3 on the GPU, and
    there from a batch of 8 a fourth on trial (``edgert.pipeline.processor.default_slots``).
    ``memory``, ``cuda_graph`` and ``part_batches`` apply to the GPU processor only; None means its default
    (auto / off / on where the model allows). ``part_batches``: a batch short of ``batch`` (an idle engine takes
    what is there; a source's end) runs the model at the smallest of 1, 2, 4, ... ``batch`` that holds it, where
    the model's batch is dynamic (``edgert.backends.gpu_session``); False: every call at ``batch`` (no warm-up
    run per size); True: refused where the model runs one batch size.
    ``metrics``: ``HOST:PORT`` to serve Prometheus metrics while the pipeline runs.
    """

    queue_size: int = 4
    max_frames: int | None = None
    warmup: int = 2
    processing: Literal["auto", "cpu", "gpu"] = "auto"
    slots: int | None = None
    memory: Literal["auto", "pinned", "zero-copy"] | None = None
    cuda_graph: bool | None = None
    part_batches: bool | None = None
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

    ``decoding``: ``auto`` (the default: the device decides, beam 5 on a GPU and beam 3 on the CPU, from the
    measured tables of docs/speech.md: :func:`edgert.search_rules.auto_decoding`), ``greedy`` or ``beam``
    (openai-whisper's beam search, ``beam_size`` beams). ``temperatures``: the fallback
    schedule; ``[0.0]`` decodes once, ``[0.0, 0.2, 0.4, 0.6, 0.8, 1.0]`` is openai-whisper's. The search keys
    left at None take openai-whisper's values where they apply and are refused where they cannot
    (``beam_size`` with greedy decoding, ``best_of`` without a temperature above 0, ...).
    """

    model: str = ""
    max_tokens: int = 224
    decoder: Literal["auto", "exact", "bucketed"] = "auto"
    no_speech_threshold: float | None = 0.6  # Whisper's silence rule; None: keep every text
    logprob_threshold: float = -1.0
    decoding: Literal["auto", "greedy", "beam"] = "auto"
    beam_size: int | None = None  # beam only; None: 5 (auto picks its own)
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
        _rule(decoding_problem(self.decoding), "decoding")
        beam = self.decoding == "beam"
        auto = self.decoding == "auto"
        t = self.temperatures
        _rule(temperatures_problem(t, beam or auto), "temperatures")  # auto may run beams
        sampled = any(x > 0 for x in t)
        why = (f"decoding is auto, which picks its own ({auto_decoding(True)[0]} {auto_decoding(True)[1]} on a GPU, "
               f"{auto_decoding(False)[0]} {auto_decoding(False)[1]} on the CPU): set decoding: beam" if auto
               else "decoding is greedy")
        for name in ("beam_size", "patience"):
            _check(getattr(self, name) is None or beam, name, f"applies to decoding: beam only ({why})")
        _rule(None if self.beam_size is None else at_least_one(self.beam_size), "beam_size")
        _rule(patience_problem(self.patience, self.beam_size), "patience")
        _check(self.best_of is None or sampled, "best_of",
               "applies to sampling only: add a temperature above 0 to temperatures")
        _rule(None if self.best_of is None else at_least_one(self.best_of), "best_of")
        auto_beams = auto and auto_decoding(True)[0] == auto_decoding(False)[0] == "beam"
        _check(self.length_penalty is None or beam or auto_beams or sampled, "length_penalty",
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

    chain: tuple[SpeechTask, ...] = ()
    chunk_samples: int = 512  # 32 ms at 16 kHz: one VAD window
    vad: VadConfig = field(default_factory=VadConfig)
    wakeword: WakeWordConfig = field(default_factory=WakeWordConfig)
    asr: AsrConfig = field(default_factory=AsrConfig)

    def __post_init__(self) -> None:
        _check(self.chunk_samples >= 1, "chunk_samples", f"expected >= 1, got {self.chunk_samples}")
        order = SPEECH_TASKS
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
    workers: int | None = None  # processes that track groups of sources; 0: the results thread; None: by sources

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
        if self.workers is not None:
            _check(0 <= self.workers <= MAX_TRACK_WORKERS, "workers",
                   f"expected 0..{MAX_TRACK_WORKERS} processes (0: track on the results thread), got {self.workers}")


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
    task: Task = "detect"
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
