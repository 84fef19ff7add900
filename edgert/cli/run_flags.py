"""The flags of ``edgert run``, one row each: the parser, the flags' config keys, their refusals and the docs' list.

A row names the flag, the config key its value goes to, the tasks it can apply to, its help and how its text is
parsed. :func:`add_run_flags` builds the parser from the rows, :func:`apply_flags` lays the given ones over a
config (a config's validation error names the flag, not the key), :func:`refuse_flags` stops a run that was given
a flag its task cannot use (one line naming every such flag: a flag is never warned about and ignored), and
:func:`flags_markdown` writes the list the README shows. Adding a flag is one row.

Building the parser must stay cheap (``edgert --help`` on a board): this module imports the config and
the task names only; the backends' names are read when the help is written.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from edgert.config import FieldError, PipelineConfig, TrackConfig
from edgert.errors import ConfigError
from edgert.search_rules import AUTO_CPU, AUTO_GPU, DECODINGS
from edgert.tasks import DETECT, TASKS, stages_run

__all__ = ["ALL", "ASR", "FALLBACK_TEMPERATURES", "GROUPS", "RUN_FLAGS", "RunFlag", "add_run_flags", "apply_flags",
           "flags_markdown", "parse_watts", "refuse_flags"]

#: Tasks a row applies to.
ALL: tuple[str, ...] = TASKS
DETECTION: tuple[str, ...] = (DETECT,)
ASR: tuple[str, ...] = ("asr",)

#: openai-whisper's fallback schedule (edgert.speech.decoding.FALLBACK_TEMPERATURES; a test keeps them equal)
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)

#: Argument groups of ``edgert run --help``, by a row's ``group``; "" is the main list.
GROUPS: dict[str, str] = {
    "processing": "processing (runtime.processing, runtime.slots ...; docs/pipeline.md)",
    "asr": "speech recognition (--task asr; speech.asr.decoding ...; docs/speech.md)",
}

#: How a refusal names the tasks a flag is for.
_TASK_WORDS = {DETECT: "detection", "asr": "task asr (or a speech.chain with asr)"}

Applier = Callable[[PipelineConfig, Any, "RunFlag", argparse.Namespace], PipelineConfig]


@dataclass(frozen=True)
class RunFlag:
    """One flag of ``edgert run``.

    ``key`` is the dotted config key the value goes to (``decode.conf``; ``source.*`` keys go to every source);
    None for a flag the command reads itself (``--json``). ``value`` turns what argparse parsed into the
    config's value (``--fixed-batch`` -> ``part_batches: false``); ``apply`` replaces the plain key setting for
    a flag that does more (``--source`` several times makes several sources). ``minimum`` refuses smaller
    numbers before the config sees them. ``tasks`` are the tasks that can use it; any other task refuses it.
    """

    flag: str
    help: str
    key: str | None = None
    tasks: tuple[str, ...] = ALL
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    action: str = "store"  # store, store_true, append
    nargs: str | None = None
    const: Any = None
    group: str = ""
    minimum: int | None = None
    value: Callable[[Any], Any] | None = None
    apply: Applier | None = None

    @property
    def dest(self) -> str:
        return self.flag[2:].replace("-", "_")

    def given(self, args: argparse.Namespace) -> Any:
        """The parsed value, or None when the flag was not given (a switch off, no repeat of an append flag)."""
        value = getattr(args, self.dest, None)
        return None if value is False or value == [] else value

    def help_text(self) -> str:
        if self.flag == "--backend":  # the backends' names come from their registry, read when help is written
            from edgert.backends import backend_names

            return self.help.format(backends=", ".join(["auto", *backend_names()]))
        return self.help


def parse_watts(text: str) -> float:
    """``10``, ``10W``, ``7.5 w`` -> watts (argparse type: a bad value is a usage error naming it)."""
    value = text.strip()
    if value[-1:] in ("W", "w"):
        value = value[:-1].strip()
    try:
        watts = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected watts such as 10 or 10W, got {text!r}") from None
    if not watts > 0:
        raise argparse.ArgumentTypeError(f"expected watts > 0, got {text!r}")
    return watts


# --------------------------------------------------------------------------------------------------
# Flags that do more than set one key


def _replace(obj: Any, flag: str, **changes: Any) -> Any:
    """``dataclasses.replace`` whose validation error is one line naming ``flag``."""
    try:
        return dataclasses.replace(obj, **changes)
    except FieldError as exc:
        raise ConfigError(f"{flag}: {exc.message}") from None


def _apply_sources(config: PipelineConfig, uris: list[str], row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    """One ``--source``: the config's source; several (or any beside a config's sources): each takes its settings."""
    if len(uris) > 1 or config.sources:
        base = config.sources[0] if config.sources else config.source
        sources = tuple(dataclasses.replace(base, uri=u, name=None, sinks=()) for u in uris)
        changed: PipelineConfig = _replace(config, row.flag, source=dataclasses.replace(config.source, uri=""),
                                           sources=sources)
        return changed
    one: PipelineConfig = _replace(config, row.flag, source=_replace(config.source, row.flag, uri=uris[0]))
    return one


def _per_source(config: PipelineConfig, value: Any, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    """A ``source.*`` key set on the source and on every one of several sources."""
    field = str(row.key).split(".", 1)[1]
    source = _replace(config.source, row.flag, **{field: value}) if config.source.uri else config.source
    sources = tuple(_replace(s, row.flag, **{field: value}) for s in config.sources)
    return dataclasses.replace(config, source=source, sources=sources)


def _stagger(config: PipelineConfig, value: Any, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    sources = config.sources
    if len(sources) < 2:
        raise ConfigError("--stagger: one source has no other to be out of step with. Note: give several --source")
    if not all(s.realtime for s in sources):
        raise ConfigError("--stagger: spreads sources delivered at their own rate only. Note: add --realtime")
    return dataclasses.replace(config, sources=tuple(dataclasses.replace(s, realtime_phase=i / len(sources))
                                                     for i, s in enumerate(sources)))


def _gpu_pipeline(config: PipelineConfig, value: Any, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    if args.processing not in (None, "gpu"):
        raise ConfigError(f"--gpu-pipeline means --processing gpu; it contradicts --processing {args.processing}")
    return _set(config, "runtime.processing", "gpu", row.flag)


def _track(config: PipelineConfig, tracker: str, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    return dataclasses.replace(config, track=_replace(config.track or TrackConfig(), row.flag, tracker=tracker))


def _track_workers(config: PipelineConfig, workers: int, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    if config.track is None:
        raise ConfigError("--track-workers: nothing to track. Note: add --track (or a track section)")
    return dataclasses.replace(config, track=_replace(config.track, row.flag, workers=workers))


def _classes(config: PipelineConfig, text: str, row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    from edgert.cli.class_flag import class_ids, model_class_names

    ids = class_ids(text, model_class_names(config.model.path, config.decode.names))
    return dataclasses.replace(config, decode=dataclasses.replace(config.decode, classes=ids))


def _rules(config: PipelineConfig, texts: list[str], row: RunFlag, args: argparse.Namespace) -> PipelineConfig:
    from edgert.analytics.table import with_rules

    return dataclasses.replace(config, analytics=with_rules(config.analytics, row.flag, texts))


# --------------------------------------------------------------------------------------------------
# The table. Rows are applied in this order (--source before the per-source flags, --track before
# --track-workers); --help lists them in it too.

RUN_FLAGS: tuple[RunFlag, ...] = (
    RunFlag("--model", "ONNX model or engine (overrides model.path)", "model.path", metavar="PATH"),
    RunFlag("--config", "pipeline YAML (task, model, preprocess, decode, source, sinks, runtime, power)",
            metavar="PATH"),
    RunFlag("--source", "input URI (overrides source.uri); repeat it for several sources in one pipeline",
            "source.uri", action="append", metavar="URI", apply=_apply_sources),
    RunFlag("--sink", "output URI, repeatable (replaces the config's sinks)", "sinks", action="append",
            metavar="URI", value=tuple),
    RunFlag("--task", "override the config's task", "task", choices=TASKS),
    RunFlag("--max-frames", "stop after N frames", "runtime.max_frames", type=int, metavar="N", minimum=0),
    RunFlag("--backend", "{backends} (overrides model.backend)", "model.backend", metavar="NAME"),
    RunFlag("--threads", "CPU threads for the backend (0: its default)", "model.threads", type=int, metavar="N",
            minimum=0),
    RunFlag("--conf", "confidence threshold (decode.conf)", "decode.conf", DETECTION, type=float, metavar="X"),
    RunFlag("--iou", "NMS IoU threshold (decode.iou)", "decode.iou", DETECTION, type=float, metavar="X"),
    RunFlag("--classes", "keep only these classes, by name or id (person,car or 0,2; decode.classes)",
            "decode.classes", DETECTION, metavar="NAME[,NAME]", apply=_classes),
    RunFlag("--loop", "restart a video or image folder at its end", "source.loop", DETECTION,
            action="store_true", apply=_per_source),
    RunFlag("--realtime", "deliver a video file at its own frame rate, as a camera would (source.realtime)",
            "source.realtime", DETECTION, action="store_true", apply=_per_source),
    RunFlag("--stagger", "with --realtime, spread the sources over one frame interval (source i comes i/N of it "
            "late), as unsynchronized cameras do (source.realtime_phase)", "source.realtime_phase", DETECTION,
            action="store_true", apply=_stagger),
    RunFlag("--queue-size", "frames in flight between stages (runtime.queue_size)", "runtime.queue_size",
            type=int, metavar="N", minimum=0),
    RunFlag("--power-budget", "pace the pipeline to stay under WATTS (10 or 10W)", "power.budget_w",
            type=parse_watts, metavar="WATTS"),
    RunFlag("--rail", "power rail the budget applies to (power.rail)", "power.rail", metavar="RAIL"),
    RunFlag("--metrics", "serve Prometheus metrics at HOST:PORT/metrics", "runtime.metrics", metavar="HOST:PORT"),
    RunFlag("--json", "print the final summary as JSON on stdout", action="store_true"),
    RunFlag("--track", "track objects across frames (bytetrack by default; sort, ocsort): a track_id per box",
            "track.tracker", DETECTION, nargs="?", const="bytetrack", metavar="TRACKER", apply=_track),
    RunFlag("--track-workers", "processes that track groups of sources (track.workers; 0: on the results thread; "
            "default: one per 4 sources from 8 sources on a machine of 4 cores or more)", "track.workers",
            DETECTION, type=int, metavar="N", apply=_track_workers),
    RunFlag("--line", "a counting line (repeatable; pixels or 0..1 fractions; :classes=A,B filters classes; "
            "needs --track; added to the config's analytics.lines)", "analytics.lines", DETECTION,
            action="append", metavar="NAME:x1,y1,x2,y2[:in|out|both]", apply=_rules),
    RunFlag("--zone", "a zone (repeatable; :crowded_at=N emits zone_crowded/zone_clear; :classes=A,B; needs "
            "--track; added to analytics.zones)", "analytics.zones", DETECTION, action="append",
            metavar="NAME:x1,y1,x2,y2,x3,y3,...", apply=_rules),
    RunFlag("--report", "write an HTML page with FPS, latency and watts over time and the summary at the end",
            metavar="PATH.html"),
    RunFlag("--processing", "cpu: host preprocessing and decoding; gpu: letterbox kernel and the confidence filter "
            "on the GPU; auto (default): gpu whenever the backend runs on a GPU and CUDA works",
            "runtime.processing", DETECTION, choices=("auto", "cpu", "gpu"), group="processing"),
    RunFlag("--gpu-pipeline", "the same as --processing gpu", "runtime.processing", DETECTION,
            action="store_true", group="processing", apply=_gpu_pipeline),
    RunFlag("--slots", "batches processed at once, each on its own session (CPU 2; GPU 3, 4 from batch 8 if fast)",
            "runtime.slots", DETECTION, type=int, metavar="N", group="processing", minimum=0),
    RunFlag("--memory", "GPU processing: frame memory, zero-copy (mapped, Jetson) or pinned copies; auto by device",
            "runtime.memory", DETECTION, choices=("auto", "pinned", "zero-copy"), group="processing"),
    RunFlag("--cuda-graph", "GPU processing: replay the model as a CUDA graph (ORT enable_cuda_graph)",
            "runtime.cuda_graph", DETECTION, action="store_true", group="processing"),
    RunFlag("--fixed-batch", "GPU processing: run every engine call at the full batch (runtime.part_batches: "
            "false; default: a part batch runs at the smallest of 1, 2, 4, ... that holds it)",
            "runtime.part_batches", DETECTION, action="store_true", group="processing", value=lambda _: False),
    RunFlag("--batch", "frames per engine call across sources (runtime.batch; default: one per source on the GPU, "
            "1 on the CPU)", "runtime.batch", DETECTION, type=int, metavar="N", group="processing", minimum=0),
    RunFlag("--batch-timeout-ms", "how long a batch waits for slower sources while another is in flight "
            "(runtime.batch_timeout_ms, default 10)", "runtime.batch_timeout_ms", DETECTION, type=float,
            metavar="MS", group="processing"),
    RunFlag("--preload", "decode the whole file source into memory before the clock starts (benchmarks)",
            "source.preload", DETECTION, action="store_true", group="processing", apply=_per_source),
    RunFlag("--capture", "how sources are decoded (source.capture): thread (in this process), process (a worker "
            "process per source into a shared frame ring), auto (default: process from 4 sources on 4+ cores)",
            "source.capture", DETECTION, choices=("auto", "thread", "process"), group="processing",
            apply=_per_source),
    RunFlag("--decoding", f"Whisper's token search: auto (default: {AUTO_GPU[0]} {AUTO_GPU[1]} on a GPU, "
            f"{AUTO_CPU[0]} {AUTO_CPU[1]} on the CPU), greedy, or openai-whisper's beam search",
            "speech.asr.decoding", ASR, choices=DECODINGS, group="asr"),
    RunFlag("--beam-size", "beams with --decoding beam (default 5)", "speech.asr.beam_size", ASR, type=int,
            metavar="N", group="asr"),
    RunFlag("--fallback", "openai-whisper's temperature fallback: a repetitive or improbable window is decoded "
            "again at 0.2, 0.4 ... 1.0 by sampling", "speech.asr.temperatures", ASR, action="store_true",
            group="asr", value=lambda _: FALLBACK_TEMPERATURES),
    RunFlag("--best-of", "samples per fallback temperature (default 5)", "speech.asr.best_of", ASR, type=int,
            metavar="N", group="asr"),
)


# --------------------------------------------------------------------------------------------------


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Every row of :data:`RUN_FLAGS` as an argument of ``p`` (grouped by :data:`GROUPS`)."""
    groups: dict[str, Any] = {"": p}
    for row in RUN_FLAGS:
        target = groups.get(row.group)
        if target is None:
            target = groups[row.group] = p.add_argument_group(GROUPS.get(row.group, row.group))
        kwargs: dict[str, Any] = {"help": row.help_text(), "dest": row.dest}
        if row.action == "store_true":
            kwargs["action"] = "store_true"
        else:
            kwargs.update(metavar=row.metavar, default=None)
            if row.action == "append":
                kwargs["action"] = "append"
            if row.type is not None:
                kwargs["type"] = row.type
            if row.choices is not None:
                kwargs["choices"] = list(row.choices)
            if row.nargs is not None:
                kwargs.update(nargs=row.nargs, const=row.const)
        target.add_argument(row.flag, **kwargs)


def refuse_flags(task: str, chain: tuple[str, ...], args: argparse.Namespace) -> None:
    """Raise :class:`ConfigError` naming every given flag that no stage of a run of ``task`` can use."""
    runs = set(stages_run(task, chain))
    wrong = [row for row in RUN_FLAGS if row.given(args) is not None and not runs & set(row.tasks)]
    if wrong:
        words = sorted({" or ".join(_TASK_WORDS.get(t, f"task {t}") for t in row.tasks) for row in wrong})
        raise ConfigError(f"{', '.join(row.flag for row in wrong)}: for {' / '.join(words)} only, not task {task}")


def apply_flags(config: PipelineConfig, args: argparse.Namespace) -> PipelineConfig:
    """``config`` with every given flag of :data:`RUN_FLAGS` laid over it; an error names the flag."""
    refuse_flags(args.task or config.task, tuple(config.speech.chain), args)
    given = [(row, row.given(args)) for row in RUN_FLAGS if row.key is not None and row.given(args) is not None]
    for row, value in given:
        if row.minimum is not None and value < row.minimum:
            raise ConfigError(f"{row.flag}: expected a number >= {row.minimum}, got {value}")
    # Plain keys of one section are set together (a section validates its fields together), then the others.
    plain: dict[str, dict[str, tuple[Any, str]]] = {}
    for row, value in given:
        if row.apply is None:
            parent, _, field = str(row.key).rpartition(".")
            plain.setdefault(parent, {})[field] = (row.value(value) if row.value else value, row.flag)
    for parent, fields in plain.items():
        config = _set_fields(config, parent, fields)
    for row, value in given:
        if row.apply is not None:
            config = row.apply(config, row.value(value) if row.value else value, row, args)
    return config


def _set(config: PipelineConfig, key: str, value: Any, flag: str) -> PipelineConfig:
    parent, _, field = key.rpartition(".")
    return _set_fields(config, parent, {field: (value, flag)})


def _set_fields(config: PipelineConfig, parent: str, fields: dict[str, tuple[Any, str]]) -> PipelineConfig:
    """``config`` with the fields of the section at ``parent`` ("" the config itself, "speech.asr") replaced."""
    path = parent.split(".") if parent else []
    chain: list[Any] = [config]
    for name in path:
        chain.append(getattr(chain[-1], name))
    try:
        obj = dataclasses.replace(chain[-1], **{k: v for k, (v, _) in fields.items()})
    except FieldError as exc:
        flag = fields[exc.field_name][1] if exc.field_name in fields else ".".join([*path, exc.field_name])
        raise ConfigError(f"{flag}: {exc.message}") from None
    for name, holder in zip(reversed(path), reversed(chain[:-1])):
        obj = dataclasses.replace(holder, **{name: obj})
    return obj  # type: ignore[no-any-return]


def flags_markdown() -> str:
    """The flag list the README shows (a test keeps the README's copy equal): one row per flag."""
    lines = ["| flag | config key | tasks | what it does |", "|---|---|---|---|"]
    for row in RUN_FLAGS:
        arg = f" {row.metavar}" if row.metavar and row.action != "store_true" else ""
        if row.choices and not row.metavar:
            arg = " " + "|".join(row.choices)
        tasks = "all" if row.tasks == ALL else ", ".join(row.tasks)
        text = row.help.format(backends="auto or a backend name").replace("|", "\\|")
        lines.append(f"| `{row.flag}{arg.replace('|', '/')}` | {f'`{row.key}`' if row.key else '-'} | {tasks} | "
                     f"{text} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m edgert.cli.run_flags > table.md
    print(flags_markdown())
