"""Model updates on a running pipeline: a model dropped into ``model.update_dir`` mid-run is built and checked in
a child process, then swapped in between two batches; a model the gate refuses leaves the old one running.

Real pipeline (CPU processor, the shared video, a JSONL sink, ByteTrack), real models from the assets, a real
child process for the build and the gate, the real /metrics endpoint.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.config import PipelineConfig
from edgert.config.convert import from_mapping
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats
from edgert.pipeline.model_update import merge_names

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")
pytest.importorskip("prometheus_client")

#: the longest a test waits for the background build and gate (2 shared cores, a nice-19 child process)
_WAIT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(assets: Path, tmp: Path, **model: Any) -> PipelineConfig:
    return from_mapping(PipelineConfig, {
        "model": {"path": str(assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"),
                  "update_dir": str(tmp / "updates"), "update_sample": 6, **model},
        "source": {"uri": str(assets / "video/vtest.avi")},
        "track": {"tracker": "bytetrack"},
        "runtime": {"max_frames": 260, "slots": 2, "metrics": f"127.0.0.1:{_free_port()}"},
    })


class DropMidRun(BaseObserver):
    """Drops ``model`` into the update folder at frame ``at`` (the way a fleet tool does: write, then rename),
    and holds the capture at frame ``hold`` until the update is decided, so the decision lands mid-run however
    slow the machine; scrapes /metrics once it is."""

    def __init__(self, model: Path, folder: Path, at: int = 30, hold: int = 120) -> None:
        self.model, self.folder, self.at, self.hold = model, folder, at, hold
        self.dropped = False
        self.decided = threading.Event()
        self.metrics = ""
        self.url: str | None = None
        self.stats: PipelineStats | None = None
        self.then: tuple[int, str] | None = None  # a second hold: at this frame, until this state

    def on_start(self, info: Any) -> None:
        self.url = info.get("metrics")
        self.stats = info["stats"]

    def on_frames(self, stats: PipelineStats) -> None:
        if not self.dropped and stats.frames >= self.at:
            self.dropped = True
            partial = self.folder / f"{self.model.name}.partial"
            shutil.copyfile(self.model, partial)  # a partial name is never taken
            partial.rename(self.folder / self.model.name)

    def admit(self) -> None:
        stats = self.stats
        if stats is None:
            return
        if stats.frames >= self.hold and not self.decided.is_set():
            self._wait_for(stats, "swapped", "rejected")
            if self.url:
                with urllib.request.urlopen(self.url, timeout=10) as r:  # the endpoint itself
                    self.metrics = r.read().decode()
            self.decided.set()
        if self.then is not None and stats.frames >= self.then[0]:
            self._wait_for(stats, self.then[1])
            self.then = None

    @staticmethod
    def _wait_for(stats: PipelineStats, *states: str) -> None:
        """Until the update has been through one of ``states`` (it may be in a later one already)."""
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline and not any((stats.model_update or {}).get("counts", {}).get(s)
                                                       for s in states):
            time.sleep(0.05)


def _records(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [r for r in lines if "type" not in r], [r for r in lines if r.get("type") == "model_swap"]


@pytest.mark.slow
def test_a_dropped_model_swaps_in_mid_run(assets: Path, tmp_path: Path) -> None:
    config = _config(assets, tmp_path)
    events = tmp_path / "out.jsonl"
    drop = DropMidRun(assets / "models/detection/yolov3-tiny-coco-416.onnx", tmp_path / "updates")
    pipeline = Pipeline(config, sinks=[f"jsonl://{events}"], observers=[drop], admit=drop.admit, handle_signals=False)
    summary = pipeline.run()
    frames, swaps = _records(events)
    # the run never stopped: every frame exactly once, in order
    assert [r["frame"] for r in frames] == list(range(260))
    assert summary["frames"] == 260
    update = summary["model_update"]
    assert update["state"] == "swapped", update
    assert [h["state"] for h in update["history"]] == ["queued", "building", "checking", "swapped"]
    assert update["model"] == "yolov3-tiny-coco-416.onnx" and update["generation"] == 1
    # the swap frame is recorded once, at a frame both models' neighbours were written for
    assert len(swaps) == 1 and swaps[0]["model"] == "yolov3-tiny-coco-416.onnx"
    at = swaps[0]["frame"]
    assert 30 < at < 260
    # counts and track ids continue: the same class table, tracks that live on across the swap
    assert len(pipeline.state.names) == 80
    before = {d["track_id"] for r in frames[max(0, at - 10):at] for d in r["detections"] if d.get("track_id", -1) >= 0}
    after = {d["track_id"] for r in frames[at:at + 10] for d in r["detections"] if d.get("track_id", -1) >= 0}
    assert before & after, (before, after)
    assert sum(summary["detections_per_class"].values()) == sum(len(r["detections"]) for r in frames)
    # /metrics showed the state while the run went on
    assert 'edgert_model_update_state{model="yolov3-tiny-coco-416.onnx",state="swapped"} 1.0' in drop.metrics
    assert 'edgert_model_updates_total{state="swapped"} 1.0' in drop.metrics
    assert pipeline.stats.snapshot()["model_update"]["state"] == "swapped"  # the preview's /stats.json
    # the state file: a restart comes back on the new model
    state = json.loads((tmp_path / "updates/state.json").read_text())
    assert state["current"]["label"] == "yolov3-tiny-coco-416.onnx"
    assert state["previous"]["label"] == "nanodet-m-416-coco-v8layout.onnx"


def _broken_int8(src: Path, dst: Path) -> None:
    """The FP32 detector with a Quantize/Dequantize pair on its input whose scales are zeroed (an INT8 build gone
    wrong: every pixel quantizes to nothing)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src))
    graph = model.graph
    name = graph.input[0].name
    graph.initializer.extend([helper.make_tensor("broken_scale", TensorProto.FLOAT, [], [0.0]),
                              helper.make_tensor("broken_zero", TensorProto.UINT8, [], [0])])
    for node in graph.node:
        node.input[:] = ["dq_" + name if i == name else i for i in node.input]
    zeroed = ["broken_scale", "broken_zero"]
    graph.node.insert(0, helper.make_node("DequantizeLinear", ["q_" + name, *zeroed], ["dq_" + name]))
    graph.node.insert(0, helper.make_node("QuantizeLinear", [name, *zeroed], ["q_" + name]))
    onnx.save(model, str(dst))


@pytest.mark.slow
def test_the_gate_refuses_a_broken_int8_model_and_the_run_goes_on(assets: Path, tmp_path: Path) -> None:
    config = _config(assets, tmp_path)
    fp32 = assets / "models/detection/nanodet-m-416-coco-v8layout.onnx"
    broken = tmp_path / "nanodet-int8.onnx"
    _broken_int8(fp32, broken)
    folder = tmp_path / "updates"
    folder.mkdir()
    (folder / "nanodet-int8.onnx.json").write_text(json.dumps({"reference": str(fp32)}))  # settings first
    events = tmp_path / "out.jsonl"
    drop = DropMidRun(broken, folder)
    summary = Pipeline(config, sinks=[f"jsonl://{events}"], observers=[drop], admit=drop.admit,
                       handle_signals=False).run()
    frames, swaps = _records(events)
    assert [r["frame"] for r in frames] == list(range(260)) and not swaps
    update = summary["model_update"]
    assert update["state"] == "rejected" and update["generation"] == 0
    why = update["history"][-1]["why"]
    assert "mAP@0.5:0.95" in why and "FP32 reference" in why, why
    assert (folder / "rejected/nanodet-int8.onnx.why.txt").read_text().strip() == why
    assert 'state="rejected"' in drop.metrics
    assert not (folder / "state.json").exists()  # nothing changed for a restart


def test_class_tables_merge_by_name() -> None:
    assert merge_names(("person", "car"), ("person", "car")) == (("person", "car"), None)
    table, mapping = merge_names(("person", "car"), ("car", "bike"))
    assert table == ("person", "car", "bike")
    assert mapping is not None and mapping.tolist() == [1, 2]
    assert np.asarray(mapping).dtype == np.int32


@pytest.mark.slow
def test_a_slower_model_is_rolled_back_in_its_probation(assets: Path, tmp_path: Path) -> None:
    """A bound of 1x: the swapped-in yolov3-tiny (several times nanodet's work) is rolled back after its first
    batches, on the same run, and every frame is still written once."""
    config = _config(assets, tmp_path, update_max_slowdown=1.0)
    events = tmp_path / "out.jsonl"
    drop = DropMidRun(assets / "models/detection/yolov3-tiny-coco-416.onnx", tmp_path / "updates")
    drop.then = (200, "rolled back")  # 80 frames on the new model, then wait for the door's verdict
    summary = Pipeline(config, sinks=[f"jsonl://{events}"], observers=[drop], admit=drop.admit,
                       handle_signals=False).run()
    frames, swaps = _records(events)
    assert [r["frame"] for r in frames] == list(range(260))
    update = summary["model_update"]
    assert [h["state"] for h in update["history"]][-2:] == ["swapped", "rolled back"], update
    assert "ms a batch against" in update["history"][-1]["why"]
    assert update["model"] == "nanodet-m-416-coco-v8layout.onnx"
    assert [s["model"] for s in swaps] == ["yolov3-tiny-coco-416.onnx", "nanodet-m-416-coco-v8layout.onnx"]
    assert swaps[0]["frame"] < swaps[1]["frame"]
    state = json.loads((tmp_path / "updates/state.json").read_text())
    assert state["current"]["label"] == "nanodet-m-416-coco-v8layout.onnx" and "probation" not in state
