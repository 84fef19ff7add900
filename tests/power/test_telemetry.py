"""Board telemetry (edgert.power.telemetry) on sysfs trees laid out as the documented boards, through the
reader, ``edgert power --json`` in a subprocess, the run hooks' observer and the metrics endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgert.pipeline.hooks import TelemetryObserver
from edgert.power.telemetry import TelemetryWatch, read_telemetry
from edgert.service.metrics import MetricsObserver
from edgert.stats import PipelineStats
from tests.power.telemetry_boards import BOARDS, make_board, set_value

EXPECT = {  # zones, GPU MHz, EMC MHz, GPU load
    "orin-nano-jp6": ({"cpu", "gpu", "soc0", "soc1", "soc2", "tj"}, 624.8, 2133.0, 0.423),
    "orin-nx-jp5": ({"cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2", "tj"}, 918.0, 3199.0, 0.615),
    "agx-orin-jp6": ({"cpu", "gpu", "cv0", "cv1", "cv2", "soc0", "soc1", "soc2", "tj"}, 1300.5, 3199.0, 0.88),
    "xavier-nx-jp5": ({"AO", "CPU", "GPU", "AUX", "Tdiode_tegra", "Tboard_tegra", "thermal-fan-est"}, 510.0,
                      1600.0, 0.12),
}


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_power_json_lists_temperatures_clocks_load_and_throttle(board: str, tmp_path: Path) -> None:
    root = make_board(tmp_path, board)
    env = {**os.environ, "EDGERT_SYSROOT": str(root)}
    proc = subprocess.run([sys.executable, "-m", "edgert.cli.main", "power", "--json"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    t = json.loads(proc.stdout)["telemetry"]
    zones, gpu_mhz, emc_mhz, load = EXPECT[board]
    assert set(t["temperatures_c"]) == zones  # PMIC-Die (a fixed reading) is left out
    assert all(20 < c < 60 for c in t["temperatures_c"].values())
    assert t["clocks_mhz"]["gpu"] == gpu_mhz and t["clocks_mhz"]["emc"] == emc_mhz and t["clocks_mhz"]["cpu"] > 1000
    assert t["load"]["gpu"] == load and 0 < t["load"]["emc"] <= 1
    assert t["throttle"] == []
    assert 0 < t["fan_ratio"] <= 1


def test_plain_output_has_a_telemetry_line(tmp_path: Path) -> None:
    root = make_board(tmp_path, "orin-nano-jp6")
    proc = subprocess.run([sys.executable, "-m", "edgert.cli.main", "power"], capture_output=True, text=True,
                          env={**os.environ, "EDGERT_SYSROOT": str(root)}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("telemetry"))
    assert "cpu 51.2C" in line and "gpu 625MHz" in line and "throttle: none" in line


def test_passive_trip_point_is_thermal_throttling(tmp_path: Path) -> None:
    root = make_board(tmp_path, "orin-nx-jp5", passive_c=47.0)  # cpu and tj at 47.5 C
    assert sorted(read_telemetry(root, nvml=False)["throttle"]) == ["thermal:cpu", "thermal:tj"]


def test_watch_records_episodes_and_overcurrent(tmp_path: Path) -> None:
    root = make_board(tmp_path, "agx-orin-jp6")
    watch = TelemetryWatch(root)
    assert watch.update(0.0, 30.0)["throttle"] == []
    set_value(root, "sys/class/hwmon/hwmon5/oc1_event_cnt", 3)  # the SoC cut clocks for over-current
    assert watch.update(1.0, 22.0)["throttle"] == ["overcurrent"]
    set_value(root, "sys/devices/virtual/thermal/thermal_zone1/temp", 101000)  # gpu past its passive trip
    assert watch.update(2.0, 18.0)["throttle"] == ["thermal:gpu"]
    set_value(root, "sys/devices/virtual/thermal/thermal_zone1/temp", 60000)
    watch.update(3.0, 30.0)
    s = watch.summary()
    assert s["readings"] == 4 and s["throttled_readings"] == 2
    assert s["throttle_episodes"] == [{"start_s": 1.0, "end_s": 2.0, "reasons": ["overcurrent", "thermal:gpu"],
                                       "fps_before": 30.0, "min_fps": 18.0}]
    assert s["peak_temperatures_c"]["gpu"] == 101.0


def test_observer_fills_stats_and_the_metrics_endpoint(tmp_path: Path) -> None:
    parser = pytest.importorskip("prometheus_client.parser")
    root = make_board(tmp_path, "xavier-nx-jp5")
    observer = TelemetryObserver(TelemetryWatch(root))
    stats = PipelineStats()
    import numpy as np

    from edgert.stats import STAGES

    stats.record_frame(np.full(len(STAGES), 0.01), detections=0)
    observer.on_frame(stats)
    assert stats.telemetry is not None and stats.telemetry["clocks_mhz"]["gpu"] == 510.0
    metrics = MetricsObserver()
    metrics.on_frame(stats)
    fams = {f.name: f for f in parser.text_string_to_metric_families(metrics.render())}
    temps = {s.labels["zone"]: s.value for s in fams["edgert_temperature_celsius"].samples}
    assert temps["GPU"] == 37.5
    clocks = {s.labels["unit"]: s.value for s in fams["edgert_clock_hertz"].samples}
    assert clocks["emc"] == 1600e6


def test_a_run_on_a_board_summarises_its_telemetry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real pipeline (tiny detector, a short video) with the sysroot of an AGX Orin that throttles midway."""
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    from edgert.config import ModelConfig, PipelineConfig, SourceConfig
    from edgert.pipeline import BaseObserver, Pipeline
    from tests.pipeline.media import make_video, tiny_detector

    root = make_board(tmp_path / "sys", "agx-orin-jp6")
    monkeypatch.setenv("EDGERT_SYSROOT", str(root))

    class Heat(BaseObserver):  # the GPU passes its passive trip point from frame 40 on
        def on_frame(self, stats: PipelineStats) -> None:
            if stats.frames == 40:
                set_value(root, "sys/devices/virtual/thermal/thermal_zone1/temp", 100500)

    config = PipelineConfig(model=ModelConfig(path=str(tiny_detector(tmp_path / "tiny.onnx"))),
                            source=SourceConfig(uri=str(make_video(tmp_path / "v.avi", frames=90, size=(96, 64)))))
    summary = Pipeline(config, observers=[Heat()], handle_signals=False).run()
    t = summary["telemetry"]
    assert t["readings"] == 3  # frames 1, 31, 61
    assert t["peak_temperatures_c"]["gpu"] == 100.5 and t["throttled_readings"] == 1
    assert t["throttle_episodes"][0]["reasons"] == ["thermal:gpu"]


def test_report_charts_the_hottest_zone() -> None:
    import numpy as np

    from edgert.report.html import run_report
    from edgert.report.series import SeriesRecorder
    from edgert.stats import STAGES

    now = [100.0]
    stats = PipelineStats()
    rec = SeriesRecorder(interval_s=1.0, max_points=4, clock=lambda: now[0])
    rec.on_start({"stats": stats})
    for i in range(70):  # seven seconds at 10 fps, the GPU warming by a degree a second
        now[0] += 0.1
        stats.telemetry = {"temperatures_c": {"cpu": 40.0, "gpu": 45.0 + i // 10}, "throttle": []}
        stats.record_frame(np.full(len(STAGES), 0.01), detections=0)
        rec.on_frame(stats)
    series = rec.to_dict()
    assert series["merges"] >= 1  # 6-7 points into 4: pairs merged, keeping the hotter
    temps = [t for t in series["temperature_c"] if t is not None]
    assert max(temps) >= 50.0 and temps == sorted(temps)
    assert "Hottest thermal zone" in run_report(series, {"fps": 10.0})
    assert "Hottest thermal zone" not in run_report({**series, "temperature_c": []}, {"fps": 10.0})


def test_a_budget_run_records_the_boards_own_throttling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a power budget (INA3221 rails of an Orin Nano), the board's own thermal cut is recorded apart from
    the controller's pacing, in the power summary."""
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    from edgert.config import ModelConfig, PipelineConfig, PowerConfig, SourceConfig
    from edgert.pipeline import BaseObserver, Pipeline
    from tests.pipeline.media import make_video, tiny_detector
    from tests.power.boards import orin_nano_jp6

    root = tmp_path / "sys"
    orin_nano_jp6(root)
    make_board(root, "orin-nano-jp6")
    monkeypatch.setenv("EDGERT_SYSROOT", str(root))

    class Heat(BaseObserver):
        def on_frame(self, stats: PipelineStats) -> None:
            if stats.frames == 35:
                set_value(root, "sys/devices/virtual/thermal/thermal_zone0/temp", 99500)  # cpu at its trip

    config = PipelineConfig(model=ModelConfig(path=str(tiny_detector(tmp_path / "tiny.onnx"))),
                            source=SourceConfig(uri=str(make_video(tmp_path / "v.avi", frames=70, size=(96, 64)))),
                            power=PowerConfig(budget_w=50.0, meter="ina", sample_hz=20))
    summary = Pipeline(config, observers=[Heat()], handle_signals=False).run()
    episodes = summary["power"]["board_throttle_episodes"]
    assert [e["reasons"] for e in episodes] == [["thermal:cpu"]]
    assert summary["telemetry"]["throttle_episodes"] == episodes


def test_preview_stats_carry_the_telemetry(tmp_path: Path) -> None:
    root = make_board(tmp_path, "orin-nano-jp6")
    stats = PipelineStats()
    assert stats.snapshot()["telemetry"] is None
    stats.telemetry = read_telemetry(root, nvml=False)
    snap = json.loads(json.dumps(stats.snapshot()))  # what /stats.json sends
    assert snap["telemetry"]["temperatures_c"]["cpu"] == 51.25 and snap["telemetry"]["throttle"] == []


def test_preview_page_shows_the_board_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The web preview in headless Chromium, on a pipeline whose sysroot is an AGX Orin: the Board row."""
    pytest.importorskip("cv2")
    pytest.importorskip("onnxruntime")
    import threading
    import time

    from edgert.config import ModelConfig, PipelineConfig, SourceConfig
    from edgert.io.sinks.web.server import WebPreviewSink
    from edgert.pipeline import Pipeline
    from tests.io.chromium import Browser, find_chromium
    from tests.pipeline.media import make_video, tiny_detector

    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium not installed (Debian: apt-get install -y chromium)")
    monkeypatch.setenv("EDGERT_SYSROOT", str(make_board(tmp_path / "sys", "agx-orin-jp6")))
    config = PipelineConfig(model=ModelConfig(path=str(tiny_detector(tmp_path / "tiny.onnx"))),
                            source=SourceConfig(uri=str(make_video(tmp_path / "v.avi", frames=40, size=(160, 120))),
                                                loop=True))
    sink = WebPreviewSink("http://127.0.0.1:0", port=0)
    pipeline = Pipeline(config, sinks=[sink], admit=lambda: time.sleep(0.04), handle_signals=False)
    thread = threading.Thread(target=pipeline.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not sink.running and time.monotonic() < deadline:
            time.sleep(0.05)
        with Browser(chromium) as browser:
            browser.goto(sink.url)
            text = ""
            deadline = time.monotonic() + 30
            while "MHz" not in text and time.monotonic() < deadline:
                time.sleep(0.3)
                text = str(browser.evaluate("document.getElementById('board').textContent"))
        assert text == "cpu 55.1 \u00b0C, GPU 1301 MHz, not throttling", text  # the hottest zone: cpu and tj
    finally:
        pipeline.request_stop()
        thread.join(20)
    assert not thread.is_alive()
