"""Every "to add an X" row of docs/architecture.md, done for real: register a tiny X and run it.

Each test adds one part the way the table says (one class here, one registry line) and runs it through
the real code path: a source and a sink through a real Pipeline run on a tiny ONNX model, a decoder chosen
by ``decode.kind`` from a YAML config and run by that pipeline, a meter through the power sampler, a backend
test double that runs the pipeline's model. The registries are restored after each test.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from edgert import backends, decoder_kinds
from edgert.backends import BACKENDS, Backend, BackendProbe, Session, SessionOptions
from edgert.config import DecodeConfig, ModelConfig, PipelineConfig, PowerConfig, SourceConfig, load_config
from edgert.decoder_kinds import DECODERS, DecoderKind, register_decoder
from edgert.errors import ConfigError
from edgert.io import sources
from edgert.io.sinks import SINKS, FrameResult, Sink, SinkKind, StreamInfo, open_sink, register_sink
from edgert.io.sources import SOURCES, FrameSource, SourceKind, open_source, register_source
from edgert.io.uri import scheme
from edgert.pipeline import Pipeline
from edgert.pipeline.hooks import open_power_sampler
from edgert.power import meters
from edgert.power.meter import PowerMeter, PowerReading
from edgert.power.meters import METERS, MeterKind, open_meter, register_meter
from edgert.types import TensorSpec
from edgert.vision.decoders import make_decoder
from edgert.vision.decoders._common import DecoderBase, fixed, single_output
from edgert.vision.detections import Detections
from edgert.vision.preprocess import LetterboxTransform
from tests.helpers import ROOT
from tests.pipeline.media import tiny_detector

pytest.importorskip("onnxruntime")

ARCHITECTURE = ROOT / "docs" / "architecture.md"


@pytest.fixture(autouse=True)
def restore_registries() -> Iterator[None]:
    saved = (list(SOURCES), list(SINKS), dict(DECODERS), list(METERS), dict(BACKENDS))
    yield
    SOURCES[:] = saved[0]
    SINKS[:] = saved[1]
    DECODERS.clear()
    DECODERS.update(saved[2])
    METERS[:] = saved[3]
    BACKENDS.clear()
    BACKENDS.update(saved[4])


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_detector(tmp_path_factory.mktemp("reg") / "tiny.onnx")


# ---------------------------------------------------------------------------------------------------------
# The tiny parts


class CountingSource(FrameSource):
    """``count://N``: N synthetic 64x48 frames, frame i filled with grey level i."""

    kind = "count"

    def __init__(self, uri: str, frames: int) -> None:
        super().__init__(uri)
        self.frames = frames
        self.next = 0

    def open(self) -> None:
        self.width, self.height, self.fps = 64, 48, 10.0
        self._opened = True

    def read(self, out: np.ndarray | None = None) -> np.ndarray | None:
        if self.next >= self.frames:
            self.end_reason = "end of input"
            return None
        frame = out if out is not None and out.shape == (48, 64, 3) else np.empty((48, 64, 3), np.uint8)
        frame[...] = self.next
        self.next += 1
        return frame

    def close(self) -> None:
        pass  # holds nothing to release


def counting_source(uri: str, config: SourceConfig) -> FrameSource:
    return CountingSource(uri, int(uri[len("count://"):]))


class RecordingSink(Sink):
    """``record://NAME``: keeps every frame's index, detections and the mean of its image in memory."""

    needs_image = True
    lossless = True
    opened: ClassVar[dict[str, RecordingSink]] = {}

    def __init__(self, uri: str) -> None:
        super().__init__(uri)
        self.info: StreamInfo | None = None
        self.frames: list[tuple[int, int, float]] = []
        self.closed = False

    def open(self, info: StreamInfo) -> None:
        self.info = info
        RecordingSink.opened[self.uri] = self

    def write(self, result: FrameResult) -> None:
        mean = float(result.image.mean()) if result.image is not None else -1.0
        self.frames.append((result.index, len(result.detections), mean))

    def close(self) -> None:
        self.closed = True


class CentreDecoder(DecoderBase):
    """``decode.kind: centre``: one box of the frame's centre quarter, class 0, score = the model's first score.

    It reads the tiny detector's [1,4+C,N] output but ignores its boxes, so a run shows which decoder ran.
    """

    kind = "centre"

    @classmethod
    def from_outputs(cls, config: DecodeConfig, specs: Sequence[TensorSpec],
                     metadata: Mapping[str, str]) -> CentreDecoder:
        single = single_output(specs)
        assert single is not None and fixed(single.shape[1]) is not None
        return cls(config, ("centre",), single.name)

    def __init__(self, config: DecodeConfig, names: tuple[str, ...], output: str) -> None:
        super().__init__(config, names)
        self.output = output
        self.calls = 0

    def __call__(self, outputs: Mapping[str, np.ndarray], transform: LetterboxTransform) -> Detections:
        self.calls += 1
        score = float(outputs[self.output][0, 4, 0])
        w, h = transform.src_width, transform.src_height
        xyxy = np.array([[w / 4, h / 4, 3 * w / 4, 3 * h / 4]], np.float32)
        return Detections(xyxy, np.array([score], np.float32), np.zeros(1, np.int32), self.names)


class SteadyMeter(PowerMeter):
    """Two rails at a constant 3 W and 2 W."""

    kind = "steady"

    def __init__(self, clock: Any = None) -> None:
        super().__init__(clock)
        self._rails = ("CPU", "GPU")
        self.reads = 0

    def read(self) -> PowerReading:
        self.reads += 1
        watts = {"CPU": 3.0, "GPU": 2.0}
        return PowerReading(self.clock.now(), watts, self._sum_total(watts))


class CountingBackend(Backend):
    """A backend test double: ONNX Runtime underneath, counting the sessions it opened."""

    name = "counting"
    opened = 0

    def probe(self) -> BackendProbe:
        return BackendProbe(self.name, True, "ONNX Runtime, counted")

    def open(self, model: str | Path, options: SessionOptions | None = None) -> Session:
        CountingBackend.opened += 1
        return backends.get_backend("onnxruntime").open(model, options)


class EngineBackend(CountingBackend):
    """A backend that says it builds engines."""

    name = "engine-double"
    builds_engines = True
    build_module = "edgert_no_such_builder"


# ---------------------------------------------------------------------------------------------------------
# The table of docs/architecture.md names every registry, and each one is importable


def _architecture_rows() -> dict[str, str]:
    """The "to add an X" table: part -> the registry it names (``module.NAME``)."""
    rows: dict[str, str] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("source", "sink", "decoder", "backend", "meter"):
            found = re.search(r"`(edgert\.[\w.]+)`", cells[2])
            assert found, f"docs/architecture.md: the {cells[0]} row names no registry: {line}"
            rows[cells[0]] = found.group(1)
    return rows


def test_the_architecture_table_names_every_registry() -> None:
    import importlib

    rows = _architecture_rows()
    assert set(rows) == {"source", "sink", "decoder", "backend", "meter"}
    expected = {"source": SOURCES, "sink": SINKS, "decoder": DECODERS, "backend": BACKENDS, "meter": METERS}
    for part, dotted in rows.items():
        module_name, _, name = dotted.rpartition(".")
        table = getattr(importlib.import_module(module_name), name)
        assert table is expected[part], f"{part}: {dotted} is not the registry the code reads"
        assert len(table) >= 4  # the built-in rows are there


# ---------------------------------------------------------------------------------------------------------
# Each row, done


def test_a_new_source_and_sink_run_through_a_real_pipeline(model: Path) -> None:
    register_source(SourceKind("count", "count://N", scheme("count://"), counting_source))
    register_sink(SinkKind("record", "record://NAME", scheme("record://"), lambda uri, title: RecordingSink(uri)),
                  before="folder")
    assert isinstance(open_source("count://3"), CountingSource)
    assert "count://N" in sources.source_help()
    config = PipelineConfig(model=ModelConfig(path=str(model)), source=SourceConfig(uri="count://12"))
    summary = Pipeline(config, sinks=["record://a"], handle_signals=False).run()
    sink = RecordingSink.opened["record://a"]
    assert summary["frames"] == 12 and summary["stopped_by"] == "end of input"
    assert sink.info is not None and (sink.info.width, sink.info.height) == (64, 48)
    assert [index for index, _, _ in sink.frames] == list(range(12))
    assert all(n == 1 for _, n, _ in sink.frames)  # the tiny model finds one box per frame
    # the boxes are drawn on the frames, but away from most pixels: the mean follows the grey level
    means = [mean for _, _, mean in sink.frames]
    assert means[0] < means[6] < means[11]
    assert sink.closed


def test_an_unknown_sink_error_lists_a_registered_one() -> None:
    register_sink(SinkKind("record", "record://NAME", scheme("record://"), lambda uri, title: RecordingSink(uri)))
    from edgert.errors import SinkError

    with pytest.raises(SinkError, match="record://NAME"):
        open_sink("nothing-known://x")
    with pytest.raises(ValueError, match="registered already"):
        register_sink(SinkKind("jsonl", "x", scheme("x://"), lambda uri, title: RecordingSink(uri)))


def test_a_new_decoder_is_a_valid_decode_kind_and_runs_in_the_pipeline(model: Path, tmp_path: Path) -> None:
    yaml = tmp_path / "p.yaml"
    yaml.write_text(f"model: {model}\nsource: count://5\ndecode:\n  kind: centre\n")
    with pytest.raises(ConfigError, match=r"p\.yaml:4: decode\.kind: expected one of auto, .*got the string 'centre'"):
        load_config(yaml)
    register_decoder("centre", DecoderKind(f"{__name__}:CentreDecoder", "[1,4+C,N], boxes ignored"))
    config = load_config(yaml)
    assert config.decode.kind == "centre" and "centre" in decoder_kinds.decode_kinds()
    register_source(SourceKind("count", "count://N", scheme("count://"), counting_source))
    results: list[FrameResult] = []
    summary = Pipeline(config, sinks=[results.append], handle_signals=False).run()
    assert summary["frames"] == 5
    assert summary["detections_per_class"] == {"centre": 5}
    first = results[0].detections
    assert first.xyxy.tolist() == [[16.0, 12.0, 48.0, 36.0]]  # the centre quarter of a 64x48 frame
    assert first.confidence[0] == pytest.approx(0.9)  # the tiny model's first class score
    # auto never picks it (it recognizes nothing), so existing models decode as before
    specs = [TensorSpec("output0", (1, 6, 16), np.dtype(np.float32))]
    assert make_decoder(DecodeConfig(), specs).kind == "yolov8"


def test_a_new_meter_measures_through_the_power_sampler() -> None:
    register_meter(MeterKind("steady", f"{__name__}:SteadyMeter"))
    assert "steady" in meters.meter_kinds()
    meter = open_meter("steady")
    assert isinstance(meter, SteadyMeter)
    meter.close()
    sampler = open_power_sampler(PipelineConfig(power=PowerConfig(meter="steady", sample_hz=50.0)))
    assert sampler is not None and isinstance(sampler.meter, SteadyMeter)
    try:
        for _ in range(10):
            sampler.frame_done()
            time.sleep(0.03)
    finally:
        sampler.stop()
    summary = sampler.summary()
    assert summary["meter"] == "steady" and summary["samples"] >= 3
    assert summary["avg_w"] == pytest.approx(5.0)
    assert summary["per_rail"]["CPU"]["avg_w"] == pytest.approx(3.0)
    assert summary["frames"] == 10 and summary["mj_per_frame"] > 0


def test_a_new_backend_runs_the_pipeline_and_says_whether_it_builds(model: Path) -> None:
    BACKENDS["counting"] = f"{__name__}:CountingBackend"
    BACKENDS["engine-double"] = f"{__name__}:EngineBackend"
    assert "counting" in backends.backend_names()
    assert not backends.builds_engines("counting")
    assert backends.builds_engines("engine-double") and backends.builds_engines("tensorrt")
    assert "engine-double" in backends.engine_builders() and "counting" not in backends.engine_builders()
    from edgert.builder.target import build_modules

    assert build_modules()["engine-double"] == "edgert_no_such_builder"
    # GPU sessions are the backend's own word, not a list of names: a host-buffer double is not one of them
    assert "counting" not in backends.gpu_backends() and "onnxruntime" not in backends.gpu_backends()
    assert {"tensorrt", "tensorrt-rtx", "onnxruntime-cuda"} <= set(backends.gpu_backends())
    register_source(SourceKind("count", "count://N", scheme("count://"), counting_source))
    before = CountingBackend.opened
    config = PipelineConfig(model=ModelConfig(path=str(model), backend="counting"),
                            source=SourceConfig(uri="count://4"))
    summary = Pipeline(config, handle_signals=False).run()
    assert summary["frames"] == 4 and summary["detections_per_class"] == {"class0": 4}
    assert CountingBackend.opened > before
