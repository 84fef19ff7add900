"""The build progress label where TensorRT has no progress monitor (8.x: JetPack 5): read from the builder's log.

The last test takes a real builder's log (TensorRT-RTX, which builds on this CPU-only machine) through the same
reader; the first reads TensorRT 8.x's own message forms.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgert._lazy import is_importable
from edgert.builder.progress import BuildProgress, progress_percent
from tests.helpers import run_cli, tiny_model

needs_rtx = pytest.mark.skipif(not is_importable("tensorrt_rtx"),
                               reason="tensorrt_rtx not installed: pip install 'edgert[rtx]'")

# TensorRT 8.x's verbose messages in the order a build with two profiles logs them (the message text as the
# logger receives it; the console prefixes "[TRT] [V]")
TRT8_BUILD = [
    "Original: 31 layers",
    "After dead-layer removal: 31 layers",
    "After final dead-layer removal: 24 layers",
    "After concat removal: 22 layers",
    "Graph construction and optimization completed in 0.041 seconds.",
    "Constructing optimization profile number 0 [1/2].",
    "--------------- Timing Runner: Optimizer Reformat(images -> <out>) (Reformat)",
    "--------------- Timing Runner: conv_0 + leaky_1 (CaskConvolution)",
    "Tactic: 0x1d2c3b4a Time: 0.0123",
    "--------------- Timing Runner: conv_0 + leaky_1 (CaskFlattenConvolution)",
    "--------------- Timing Runner: pool_2 (TiledPooling)",
    "Constructing optimization profile number 1 [2/2].",
    "--------------- Timing Runner: conv_0 + leaky_1 (CaskConvolution)",
    "--------------- Timing Runner: head/Conv2D + PWN(head/Sigmoid) (CaskConvolution)",
    "Engine generation completed in 212.4 seconds.",
]


def labels(progress: BuildProgress, messages: list[str]) -> list[str]:
    seen = []
    for message in messages:
        progress.from_log(message)
        if not seen or seen[-1] != progress.phase:
            seen.append(progress.phase)
    return seen


def test_the_label_follows_tensorrt_8s_profiles_and_timed_layers() -> None:
    seen = labels(BuildProgress("yolov3-tiny.onnx", enabled=False), TRT8_BUILD)
    assert seen == [
        "",
        "profile 1/2: 1 of 22 layers timed (conv_0 + leaky_1)",  # a reformat is not a layer; a layer counts once
        "profile 1/2: 2 of 22 layers timed (pool_2)",
        "profile 2/2: 1 of 22 layers timed (conv_0 + leaky_1)",
        "profile 2/2: 2 of 22 layers timed (head/Conv2D + PWN(head/Sigmoid))",
        "writing the engine",
    ]


def test_without_a_terminal_progress_is_a_line_for_each_tenth_reached(capsys: pytest.CaptureFixture[str]) -> None:
    """--progress where stderr is no terminal (a journal, the model-update child): lines, read back by
    progress_percent. Layers timed of the graph's count within each profile make the fraction."""
    progress = BuildProgress("yolov3-tiny.onnx", enabled=True)
    assert progress.lines
    with progress:
        labels(progress, TRT8_BUILD)
    err = capsys.readouterr().err.splitlines()
    assert [progress_percent(line) for line in err] == [2, 52, 100], err
    assert err[1] == "building yolov3-tiny.onnx: 52 % (profile 2/2: 1 of 22 layers timed (conv_0 + leaky_1); 0 s)"
    assert progress_percent("built m.engine [tensorrt 8.5.3.1, fp16, 18.9 MB] in 212.4 s") is None


def test_more_layers_timed_than_the_graph_said_drops_the_total() -> None:
    progress = BuildProgress("m.onnx", enabled=False)
    labels(progress, ["After concat removal: 1 layers", "Constructing optimization profile number 0 [1/1].",
                      "--------------- Timing Runner: a (CaskConvolution)",
                      "--------------- Timing Runner: b (CaskConvolution)"])
    assert progress.phase == "profile 1/1: 2 layers timed (b)"


@needs_rtx
def test_the_logger_feeds_the_label_only_where_tensorrt_has_no_monitor() -> None:
    import tensorrt_rtx as trt

    from edgert.engine.trt_logger import make_logger

    logger, progress = make_logger(trt), BuildProgress("m.onnx", enabled=True)
    assert not progress.follow_log(trt, logger)  # TensorRT-RTX has IProgressMonitor: its phases are used
    assert logger.listener is None
    without_monitor = SimpleNamespace(ILogger=trt.ILogger)  # a TensorRT before 10, as far as follow_log asks
    assert not BuildProgress("m.onnx", enabled=False).follow_log(without_monitor, logger)  # no bar, no verbose
    assert progress.follow_log(without_monitor, logger)
    assert logger.min_severity == trt.ILogger.Severity.VERBOSE
    logger.log(trt.ILogger.Severity.VERBOSE, "Constructing optimization profile number 0 [1/1].")
    logger.log(trt.ILogger.Severity.VERBOSE, "--------------- Timing Runner: conv (CaskConvolution)")
    assert progress.phase == "profile 1/1: 1 layers timed (conv)"


@needs_rtx
def test_a_real_builders_log_moves_the_label_through_every_profile(tmp_path: Path) -> None:
    from edgert.builder import parse_shapes
    from edgert.builder.engine_builder import BuildOptions, build_engine

    model = tiny_model(tmp_path / "m.onnx", shape=("n", 3, 8, 8))
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logger, keep = logging.getLogger("edgert.tensorrt"), Keep(level=5)
    level = logger.level
    logger.setLevel(5)  # before the build makes its TensorRT logger, which asks the level once
    logger.addHandler(keep)
    try:
        build_engine(model, tmp_path / "m.engine",
                     BuildOptions(backend="tensorrt-rtx", precision="fp16", contexts=3, timing_cache=False,
                                  cache_dir=tmp_path, profiles=tuple(parse_shapes(["x:1x3x8x8/2x3x8x8/4x3x8x8"]))))
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    seen = labels(BuildProgress("m.onnx", enabled=False), messages)
    for i in (1, 2, 3):
        assert any(s.startswith(f"profile {i}/3: 1 ") and "layers timed" in s for s in seen), seen


@needs_rtx
def test_edgert_build_progress_writes_lines_only_when_asked(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "m.onnx")
    env = {"EDGERT_CACHE_DIR": str(tmp_path / "cache")}
    asked = run_cli("build", str(model), "--backend", "tensorrt-rtx", "--progress", "-o", str(tmp_path / "a.engine"),
                    env=env, timeout=300)
    assert asked.returncode == 0, asked.stderr
    said = [p for p in map(progress_percent, asked.stderr.splitlines()) if p is not None]
    assert said and said == sorted(said) and said[-1] <= 100, asked.stderr
    quiet = run_cli("build", str(model), "--backend", "tensorrt-rtx", "-o", str(tmp_path / "b.engine"), env=env,
                    timeout=300)
    assert quiet.returncode == 0 and "building " not in quiet.stderr, quiet.stderr
