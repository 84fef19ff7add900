"""The web preview: its HTTP routes, and the page in a real headless Chromium while a pipeline runs."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.config import ModelConfig, PipelineConfig, SourceConfig
from edgert.errors import SinkError
from edgert.io.sinks import FrameResult, StreamInfo
from edgert.io.sinks.web.server import WebPreviewSink
from edgert.pipeline import BaseObserver, Pipeline, PipelineStats
from edgert.vision.detections import Detections
from tests.io.chromium import Browser, find_chromium
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")


def _get(url: str, timeout: float = 5.0) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.headers.get("Content-Type", ""), response.read()


def test_routes_serve_page_stats_snapshot_and_stream() -> None:
    stats = PipelineStats()
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)
    sink.open(StreamInfo(96, 64, 10.0, ("person",), "tiny on test", stats))
    try:
        base = sink.url
        assert base.startswith("http://127.0.0.1:") and sink.port > 0
        kind, page = _get(base)
        assert kind.startswith("text/html") and b'id="stream"' in page and b"stats.json" in page
        kind, body = _get(base + "stats.json")
        payload = json.loads(body)
        assert kind == "application/json" and payload["title"] == "tiny on test" and payload["frames"] == 0
        with pytest.raises(urllib.error.HTTPError):
            _get(base + "nope")

        frame = np.full((64, 96, 3), 120, np.uint8)
        det = Detections.empty(("person",))
        sink.write(FrameResult(0, 0.0, det, frame))  # the first frame is encoded even with nobody watching
        kind, jpeg = _get(base + "snapshot.jpg")
        assert kind == "image/jpeg" and cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).shape == (
            64,
            96,
            3,
        )

        response = urllib.request.urlopen(base + "stream.mjpg", timeout=5.0)
        assert response.headers["Content-Type"] == "multipart/x-mixed-replace; boundary=edgertframe"

        def feed() -> None:
            for i in range(20):
                sink.write(FrameResult(i, 0.0, det, frame))
                time.sleep(0.02)

        feeder = threading.Thread(target=feed)
        feeder.start()
        head = response.read(200)
        assert head.startswith(b"--edgertframe\r\nContent-Type: image/jpeg\r\nContent-Length: ")
        assert b"\r\n\r\n\xff\xd8" in head  # a JPEG starts right after the part headers
        feeder.join()
        response.close()
    finally:
        sink.close()


def test_stats_show_a_source_not_up_yet_as_unknown_size_until_its_first_frame() -> None:
    """A camera down at start opens the sinks with 0 x 0: /stats.json says null, then the first frame's size."""
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)
    sink.open(StreamInfo(0, 0, None, ("person",), "late camera", PipelineStats(), ("cam",)))
    try:
        payload = json.loads(_get(sink.url + "stats.json")[1])
        assert payload["source"] == {"width": None, "height": None, "fps": None}
        sink.write(FrameResult(0, 0.0, Detections.empty(("person",)), np.zeros((48, 80, 3), np.uint8), source="cam"))
        payload = json.loads(_get(sink.url + "stats.json")[1])
        assert (payload["source"]["width"], payload["source"]["height"]) == (80, 48)
    finally:
        sink.close()


def test_port_in_use_is_a_one_line_error() -> None:
    first = WebPreviewSink("http://127.0.0.1:0", port=0)
    first.open(StreamInfo(8, 8))
    try:
        second = WebPreviewSink.from_uri(f"http://127.0.0.1:{first.port}")
        with pytest.raises(SinkError, match="cannot listen") as info:
            second.open(StreamInfo(8, 8))
        assert "\n" not in str(info.value)
    finally:
        first.close()


@pytest.fixture
def running_preview(tmp_path: Path) -> Iterator[WebPreviewSink]:
    """A real pipeline (tiny detector, looping video) feeding a web preview on a free port."""
    video = make_video(tmp_path / "v.avi", frames=40, size=(160, 120))
    model = tiny_detector(tmp_path / "tiny.onnx")
    config = PipelineConfig(model=ModelConfig(path=str(model)), source=SourceConfig(uri=str(video), loop=True))
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)

    class Pace:  # 25 fps, like a camera, so the test machine stays usable
        def __call__(self) -> None:
            time.sleep(0.04)

    class Watts(BaseObserver):  # what a power meter would set: 5.0 to 5.9 W, changing every frame
        def on_frame(self, stats: PipelineStats) -> None:
            stats.watts = 5.0 + (stats.frames % 10) / 10

    pipeline = Pipeline(config, sinks=[sink], observers=[Watts()], admit=Pace(), handle_signals=False)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not sink.running and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    assert sink.running, errors
    try:
        yield sink
    finally:
        pipeline.request_stop()
        thread.join(20)
        assert not thread.is_alive() and not errors


def test_page_in_headless_chromium_shows_stream_and_live_stats(running_preview: WebPreviewSink) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    with Browser(chromium) as browser:
        browser.goto(running_preview.url)
        probe = """JSON.stringify({
            width: document.getElementById('stream') ? document.getElementById('stream').naturalWidth : 0,
            height: document.getElementById('stream') ? document.getElementById('stream').naturalHeight : 0,
            frames: document.getElementById('frames') ? document.getElementById('frames').textContent : '',
            fps: document.getElementById('fps') ? document.getElementById('fps').textContent : '',
            status: document.getElementById('status') ? document.getElementById('status').textContent : ''})"""

        def read() -> dict[str, Any]:
            return dict(json.loads(browser.evaluate(probe)))

        deadline = time.monotonic() + 30
        first = read()
        while (first["width"] == 0 or not first["frames"].isdigit()) and time.monotonic() < deadline:
            time.sleep(0.2)
            first = read()
        assert (first["width"], first["height"]) == (160, 120), first  # the MJPEG stream is showing
        time.sleep(1.5)  # the page polls stats.json every 0.5 s
        second = read()
        assert int(second["frames"]) > int(first["frames"]), (first, second)  # the stats text updates
        assert float(second["fps"]) > 0 and second["status"] == "live"
        assert running_preview.stats_payload()["viewers"] >= 1


def test_page_draws_live_fps_and_watts_charts_over_a_rolling_window(running_preview: WebPreviewSink,
                                                                    tmp_path: Path) -> None:
    from tests.report.conftest import has_color, screenshot

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    probe = """JSON.stringify((() => {
        const pts = (id) => [...document.querySelectorAll('#' + id + ' polyline')].flatMap(
            p => [...p.points].map(q => [q.x, q.y]));
        const h = window.edgertHistory;
        return {fps: h.fps, watts: h.watts, t: h.t, fpsPoints: pts('fps-chart'), wattsPoints: pts('watts-chart'),
                label: document.querySelector('#watts-chart .label').textContent};
    })())"""
    with Browser(chromium) as browser:
        browser.load(running_preview.url + "?window=4", width=900, height=520)
        browser.wait_for("window.edgertHistory && edgertHistory.watts.filter(w => w !== null).length >= 4", 30)
        time.sleep(4.5)  # more than the window since the first poll: the oldest have been dropped
        state = json.loads(browser.evaluate(probe))
        fps = [v for v in state["fps"] if v is not None]
        watts = [v for v in state["watts"] if v is not None]
        # as many points drawn as the page's window holds, and the window keeps the newest 3 s only
        assert len(state["fpsPoints"]) == len(fps) and len(state["wattsPoints"]) == len(watts) >= 3
        assert state["t"][-1] - state["t"][0] <= 4.0 and 3 <= len(state["t"]) <= 10  # polled every 0.5 s
        assert all(5.0 <= w <= 5.9 for w in watts) and max(fps) > 5  # the pipeline's numbers
        assert state["label"] == f"Power: {watts[-1]:.2f} W"
        xs = [x for x, _ in state["wattsPoints"]]
        assert xs == sorted(xs)  # oldest on the left
        (_, y_low), (_, y_high) = (state["wattsPoints"][watts.index(w)] for w in (min(watts), max(watts)))
        if max(watts) > min(watts):
            assert y_high < y_low  # more watts drawn higher
        image = screenshot(browser, tmp_path, "web-preview", full_page=False)
        assert has_color(image, "#56B4E9") and has_color(image, "#E69F00")
