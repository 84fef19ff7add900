"""One web preview for a run with several sources: a real pipeline (two videos written with OpenCV, a tiny real
ONNX detector, the CPU processor), the preview's routes over real sockets, and its page of tiles in a real
headless Chromium."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgert.config import (
    AnalyticsConfig,
    LineConfig,
    ModelConfig,
    PipelineConfig,
    RuntimeConfig,
    SourceConfig,
    TrackConfig,
    ZoneConfig,
)
from edgert.io.sinks.web.server import WebPreviewSink
from edgert.pipeline import Pipeline
from tests.io.chromium import Browser, find_chromium
from tests.pipeline.media import make_video, tiny_detector

cv2 = pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

SIZES = {"door": (160, 120), "lane": (128, 96)}  # (width, height): each source its own size, to tell them apart


@dataclass
class Run:
    base: str  # http://127.0.0.1:PORT/
    pipeline: Pipeline
    summary: dict[str, Any]


def _get(url: str, timeout: float = 10.0) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _sources(base: str) -> list[dict[str, Any]]:
    status, kind, body = _get(base + "sources.json")
    assert status == 200 and kind == "application/json"
    return list(json.loads(body)["sources"])


def _decode(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return np.asarray(image)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _start(tmp_path: Path, sink: Any, analytics: AnalyticsConfig | None = None) -> Iterator[Run]:
    videos = {name: make_video(tmp_path / f"{name}.avi", frames=30, size=size) for name, size in SIZES.items()}
    model = tiny_detector(tmp_path / "tiny.onnx")
    config = PipelineConfig(
        model=ModelConfig(path=str(model)),
        sources=tuple(SourceConfig(uri=str(v), loop=True, name=name) for name, v in videos.items()),
        runtime=RuntimeConfig(processing="cpu"),
        **({"track": TrackConfig(), "analytics": analytics} if analytics is not None else {}))

    def pace() -> None:  # 25 fps per source, like cameras, so the shared test machine stays usable
        time.sleep(0.04)

    pipeline = Pipeline(config, sinks=[sink], admit=pace, handle_signals=False)
    run = Run("", pipeline, {})
    errors: list[BaseException] = []

    def go() -> None:
        try:
            run.summary.update(pipeline.run())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    try:
        yield run
    finally:
        pipeline.request_stop()
        thread.join(30)
    assert not thread.is_alive() and not errors, errors


def _wait_live(base: str) -> list[dict[str, Any]]:
    """sources.json once both sources have had frames through and a first FPS figure."""
    deadline = time.monotonic() + 30
    while True:
        try:
            rows = _sources(base)
            if len(rows) == 2 and all(r["fps"] > 0 and r["width"] for r in rows):
                return rows
        except (urllib.error.URLError, ConnectionError):  # the server is not up yet: ask again
            pass
        assert time.monotonic() < deadline, "the preview did not show both sources within 30 s"
        time.sleep(0.1)


@pytest.fixture
def preview_run(tmp_path: Path) -> Iterator[Run]:
    """The preview given as an object on port 0 (the pipeline binds it)."""
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)
    with _start(tmp_path, sink) as run:
        deadline = time.monotonic() + 30
        while not sink.running and time.monotonic() < deadline:
            time.sleep(0.05)
        run.base = sink.url
        yield run


def test_one_preview_serves_each_source_of_a_run(preview_run: Run) -> None:
    base = preview_run.base
    rows = _wait_live(base)
    assert [r["name"] for r in rows] == list(SIZES)  # the run's order
    for row in rows:
        assert (row["width"], row["height"]) == SIZES[row["name"]]
        assert row["frames"] > 0 and row["dropped"] >= 0 and row["reconnects"] == 0

    for name, (width, height) in SIZES.items():
        status, kind, jpeg = _get(base + f"snapshot.jpg?source={name}")
        assert status == 200 and kind == "image/jpeg"
        assert _decode(jpeg).shape == (height, width, 3)
    status, _, jpeg = _get(base + "snapshot.jpg")  # no parameter: the first source, as with one source
    assert status == 200 and _decode(jpeg).shape == (120, 160, 3)

    for route in ("snapshot.jpg", "stream.mjpg"):
        status, kind, body = _get(base + f"{route}?source=gate")
        text = body.decode()
        assert status == 404 and kind.startswith("text/plain")
        assert text.endswith("\n") and text.count("\n") == 1 and '"gate"' in text and "door, lane" in text

    # The stream of one source: its frames only, and only the watched source is encoded all along.
    before = {r["name"]: r["encoded"] for r in _sources(base)}
    with urllib.request.urlopen(base + "stream.mjpg?source=lane", timeout=10) as response:
        assert response.headers["Content-Type"] == "multipart/x-mixed-replace; boundary=edgertframe"
        data = b""
        parts: list[bytes] = []
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end or len(parts) < 3:
            data += response.read1(65536)
            while b"\r\n\r\n" in data:
                head, rest = data.split(b"\r\n\r\n", 1)
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                if len(rest) < length:
                    break
                parts.append(rest[:length])
                data = rest[length + 2:]
        assert {_decode(p).shape for p in parts} == {(96, 128, 3)}
        during = {r["name"]: r for r in _sources(base)}
        assert during["lane"]["viewers"] == 1 and during["door"]["viewers"] == 0
    after = {r["name"]: r["encoded"] for r in _sources(base)}
    assert after["lane"] - before["lane"] >= len(parts) >= 3
    assert after["door"] == before["door"]  # nobody watched the door: no JPEG work for it

    preview_run.pipeline.request_stop()
    deadline = time.monotonic() + 30
    while not preview_run.summary and time.monotonic() < deadline:
        time.sleep(0.1)
    summary = preview_run.summary
    # one shared sink, not refused, not one per source; named by the port it really got (":0" asked for any)
    assert len(summary["sinks"]) == 1 and re.fullmatch(r"http://127\.0\.0\.1:[1-9]\d*", summary["sinks"][0])
    assert {s["name"]: s["frames"] > 0 for s in summary["sources"]} == {"door": True, "lane": True}


def test_page_shows_one_tile_per_source_in_headless_chromium(tmp_path: Path) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"  # the preview as a user writes it: a URI through the sink table
    with _start(tmp_path, uri):
        base = uri + "/"
        _wait_live(base)
        probe = """JSON.stringify([...document.querySelectorAll('.tile')].map(t => ({
            name: t.querySelector('.name').textContent, src: t.querySelector('img').getAttribute('src'),
            width: t.querySelector('img').naturalWidth, height: t.querySelector('img').naturalHeight,
            fps: t.querySelector('.fps').textContent, frames: t.querySelector('.frames').textContent})))"""
        ready = "[...document.querySelectorAll('.tile')].every(t => t.querySelector('img').naturalWidth > 0 && " \
                "t.querySelector('.fps').textContent !== '0.0 fps') && document.querySelectorAll('.tile').length"
        with Browser(chromium) as browser:
            for page, kind in (("", "stream.mjpg"), ("?tiles=poll", "snapshot.jpg")):
                browser.load(base + page, width=1000, height=700)
                assert browser.wait_for(ready, 30) == 2
                tiles = json.loads(browser.evaluate(probe))
                assert [t["name"] for t in tiles] == list(SIZES)
                for tile in tiles:
                    assert (tile["width"], tile["height"]) == SIZES[tile["name"]], tile
                    assert tile["src"].startswith(f"{kind}?source={tile['name']}")
                    assert float(tile["fps"].split()[0]) > 0 and int(tile["frames"].split()[1]) > 0
                assert browser.evaluate("document.getElementById('stream').hidden") is True
                assert browser.evaluate("document.getElementById('title').textContent") == "tiny.onnx on 2 sources"

            # A tile's name opens the single full view of that source.
            browser.load(base + "?source=lane", width=1000, height=700)
            size = browser.wait_for("(() => { const s = document.getElementById('stream'); "
                                    "return s.naturalWidth ? [s.naturalWidth, s.naturalHeight] : null; })()", 30)
            assert tuple(size) == SIZES["lane"]
            assert browser.evaluate("document.querySelectorAll('.tile').length") == 0
            assert browser.evaluate("document.getElementById('back').hidden") is False
            figures = browser.wait_for("(() => { const t = document.getElementById('source').textContent; "
                                       "return t.includes(' fps') ? t : null; })()", 10)
            assert figures.startswith("lane · ") and "dropped" in figures and "reconnects" in figures


def test_side_panel_shows_line_and_zone_counts_per_source(tmp_path: Path) -> None:
    """The tiny detector sees one still box in every frame: inside the zone that covers the frame (occupancy
    1, one entry), crossing no line. sources.json carries each source's totals; the page lists them."""
    analytics = AnalyticsConfig(lines=(LineConfig("top", ((0.0, 0.1), (1.0, 0.1))),),
                                zones=(ZoneConfig("all", ((0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0))),))
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)
    with _start(tmp_path, sink, analytics) as run:
        deadline = time.monotonic() + 30
        while not sink.running and time.monotonic() < deadline:
            time.sleep(0.05)
        base = sink.url
        _wait_live(base)
        deadline = time.monotonic() + 30
        while True:
            rows = {r["name"]: r["counts"] for r in _sources(base)}
            if all(c.get("all", {}).get("occupancy") == 1 for c in rows.values()):
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.1)
        for counts in rows.values():
            assert counts == {"top": {}, "all": {"occupancy": 1, "entered": 1}}  # a line nobody crossed: {}
        chromium = find_chromium()
        if chromium is None:
            return  # the page's half needs a browser
        with Browser(chromium) as browser:
            browser.load(base, width=1000, height=700)
            shown = browser.wait_for("document.querySelectorAll('#counts tr').length === 4 && "
                                     "[...document.querySelectorAll('#counts tr')].map(r => r.textContent)", 30)
        assert shown == ["top0", "all1 inside · 1 entered"] * 2, shown
    run.pipeline.request_stop()
