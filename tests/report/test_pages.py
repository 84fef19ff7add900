"""The report pages as a user gets them: written by the real CLI, opened in a real headless Chromium.

Each test finds the plotted data in the page (the points of the SVG polylines, the values of the bars)
and checks it against the numbers the run itself printed or embedded, then takes a screenshot and
checks that the series' colours were actually painted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import assert_one_line_error, run_cli
from tests.io.chromium import Browser
from tests.pipeline.media import make_video, tiny_detector
from tests.power import boards

from .conftest import has_color, screenshot

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

DATA = "JSON.parse(document.getElementById('edgert-data').textContent)"


def _points(browser: Browser, chart: str, series: str) -> list[list[float]]:
    """Every point of ``series`` in ``chart`` as drawn (SVG coordinates), across broken runs."""
    return list(browser.evaluate(f"""[...document.querySelectorAll(
        'svg[data-chart="{chart}"] polyline[data-series="{series}"]')].flatMap(
        p => [...p.points].map(q => [q.x, q.y]))"""))


def _values(browser: Browser, selector: str) -> list[float]:
    return [float(v) for v in browser.evaluate(
        f"[...document.querySelectorAll('{selector}')].map(e => e.getAttribute('data-value'))")]


def _no_temp_files(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_run_report_plots_fps_latency_and_watts_under_the_budget(browser: Browser, tmp_path: Path) -> None:
    video = make_video(tmp_path / "v.avi", frames=40, size=(160, 120))
    model = tiny_detector(tmp_path / "tiny.onnx")
    board = boards.orin_nano_jp6(tmp_path / "board")  # INA3221 in sysfs: 4.968 W on VDD_IN
    out = tmp_path / "out" / "run.html"
    out.parent.mkdir()
    r = run_cli("run", "--model", str(model), "--source", str(video), "--loop", "--max-frames", "100",
                "--power-budget", "10", "--report", str(out), "--json", env={"EDGERT_SYSROOT": str(board)})
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert f"report written to {out}" in r.stderr and out.is_file()
    _no_temp_files(out.parent)

    browser.load(out.as_uri())
    data = browser.evaluate(DATA)
    series = data["series"]
    n = series["points"]
    assert n >= 3, series  # paced by the budget controller at ~25 fps: several seconds
    assert data["summary"]["frames"] == summary["frames"] == 100 and series["frames"][-1] == 100
    assert data["summary"]["power"]["budget_w"] == 10.0  # rewritten after the run with the power summary

    fps = _points(browser, "fps", "fps")
    assert len(fps) == n == len([v for v in series["fps"] if v is not None])
    xs = [p[0] for p in fps]
    assert xs == sorted(xs) and len(set(xs)) == n
    for stage in ("capture", "preprocess", "infer", "postprocess", "total"):
        assert len(_points(browser, "latency-p50", stage)) == n
        assert len(_points(browser, "latency-p99", stage)) == n
    watts = _points(browser, "watts", "watts")
    assert len(watts) == len([w for w in series["watts"] if w is not None]) >= n - 1
    assert {w for w in series["watts"] if w is not None} == {4.968}
    assert _values(browser, 'svg[data-chart="watts"] line.hline') == [10.0]
    budget_y = browser.evaluate("+document.querySelector('svg[data-chart=\"watts\"] line.hline').getAttribute('y1')")
    assert all(y > budget_y for _, y in watts)  # 5 W is drawn below the 10 W line
    cells = browser.evaluate("[...document.querySelectorAll('table.summary th')].map(t => t.textContent)")
    assert {"frames", "fps", "latency_ms", "power", "stopped_by"} <= set(cells)

    image = screenshot(browser, tmp_path, "run-report")
    assert has_color(image, "#0072B2") and has_color(image, "#D55E00") and has_color(image, "#009E73")


def test_run_report_path_problems_are_one_line_errors_before_the_run(tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "tiny.onnx")
    video = make_video(tmp_path / "v.avi", frames=5)
    r = run_cli("run", "--model", str(model), "--source", str(video), "--report", str(tmp_path / "no" / "r.html"))
    assert_one_line_error(r, "does not exist")
    assert "frames" not in r.stdout  # nothing ran
    r = run_cli("run", "--model", str(model), "--source", str(video), "--report", str(tmp_path))
    assert_one_line_error(r, "is a directory")


def test_bench_report_plots_each_iteration_percentiles_and_watts(browser: Browser, tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "tiny.onnx")
    board = boards.orin_nano_jp6(tmp_path / "board")
    out = tmp_path / "bench.html"
    r = run_cli("bench", str(model), "--backend", "onnxruntime", "--iterations", "3000", "--warmup", "5",
                "--power", "--report", str(out), "--json", env={"EDGERT_SYSROOT": str(board)})
    assert r.returncode == 0, r.stderr
    result: dict[str, Any] = json.loads(r.stdout)
    browser.load(out.as_uri())
    data = browser.evaluate(DATA)
    assert data["results"][0]["iterations"] == result["iterations"] == 3000
    trace = data["traces"][0]
    # 3000 iterations are drawn as 1000 bins (mean, and max in grey): as many points as the series
    assert len(trace["latency_ms"]) == len(trace["latency_max_ms"]) == 1000
    assert len(_points(browser, "trace", "bin mean")) == 1000 == len(_points(browser, "trace", "bin max"))
    assert max(trace["latency_max_ms"]) == pytest.approx(result["latency_ms"]["max"], rel=1e-3)
    lat = result["latency_ms"]
    bars = _values(browser, 'svg[data-chart="latency-percentiles"] rect.bar')
    assert bars == pytest.approx([lat[k] for k in ("mean", "p50", "p90", "p95", "p99")], rel=1e-5)
    assert _values(browser, 'svg[data-chart="throughput"] rect.bar') == pytest.approx([result["throughput_fps"]],
                                                                                      rel=1e-5)
    assert sum(_values(browser, 'svg[data-chart="histogram"] rect.bar')) == 3000
    assert _values(browser, 'svg[data-chart="power"] rect.bar') == pytest.approx([4.968, 4.968])
    assert len(_points(browser, "trace-watts", "watts")) == len(trace["watts"]) >= 2
    image = screenshot(browser, tmp_path, "bench-report")
    assert has_color(image, "#0072B2") and has_color(image, "#009E73")


def test_bench_report_without_a_meter_says_why(tmp_path: Path) -> None:
    model = tiny_detector(tmp_path / "tiny.onnx")
    out = tmp_path / "bench.html"
    r = run_cli("bench", str(model), "--backend", "onnxruntime", "--iterations", "50", "--report", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    assert "Watts not measured: run with --power" in text and 'data-chart="power"' not in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched from anywhere
    r = run_cli("bench", str(model), "--backend", "onnxruntime", "--report", str(tmp_path / "no" / "b.html"))
    assert_one_line_error(r, "does not exist")


def test_calibration_report_plots_every_tensor_range_and_layer_sensitivity(browser: Browser, tmp_path: Path) -> None:
    from tests.calib.models import tiny_detector as calib_detector
    from tests.calib.models import write_images

    model = calib_detector(tmp_path / "det.onnx")
    write_images(tmp_path / "images", 6)
    out = tmp_path / "out" / "det.int8.onnx"
    # --max-drop 0 is a target INT8 misses (exit 3); --no-strict: the page is what is tested here
    r = run_cli("calibrate", str(model), "--images", str(tmp_path / "images"), "--max-drop", "0.0", "--max-float",
                "1", "--no-strict", "-o", str(out))
    assert r.returncode == 0, r.stderr
    page = tmp_path / "out" / "det.int8.report.html"
    report = json.loads((tmp_path / "out" / "det.int8.report.json").read_text())
    assert report["files"]["report_html"] == str(page) and str(page) in r.stdout and page.is_file()
    sens = report["sensitivity"]
    assert sens and sens["most_sensitive"], "the tiny detector should need the sensitivity pass at --max-drop 0"

    browser.load(page.as_uri())
    tensors = report["tensors"]
    amax = browser.evaluate("""[...document.querySelectorAll('svg[data-chart="ranges"] circle.point')]
        .filter(c => c.getAttribute('data-series').startsWith('amax'))
        .map(c => [c.querySelector('title').textContent.split(' (')[0], +c.getAttribute('data-value')])""")
    assert sorted(amax) == sorted([t["tensor"], pytest.approx(t["amax"], rel=1e-5)] for t in tensors)
    assert len(_values(browser, 'svg[data-chart="clip-ratio"] circle.point')) == len(tensors)
    bars = _values(browser, 'svg[data-chart="sensitivity"] rect.bar')
    assert bars == pytest.approx([m["error"] for m in sens["most_sensitive"]], rel=1e-5)
    steps = [s for s in sens["steps"] if s.get("map50_95") is not None]
    assert len(_values(browser, 'svg[data-chart="sensitivity-steps"] circle.point')) == len(steps)
    # the trade-off: one point per option tried, accuracy against the share of MACs in float
    assert len(_values(browser, 'svg[data-chart="accuracy-vs-float"] circle.point')) == len(steps)
    rows = browser.evaluate("document.querySelectorAll('table.tensors tr').length")
    assert rows == len(tensors) + 1
    image = screenshot(browser, tmp_path, "calibration-report")
    assert has_color(image, "#0072B2") and has_color(image, "#E69F00")


def test_bench_report_compares_settings_side_by_side(browser: Browser, tmp_path: Path) -> None:
    """Two real bench runs (a 32 px and a 64 px detector) on one page, as --precisions gives them."""
    from edgert.backends import SessionOptions, get_backend
    from edgert.cli.bench import bench_session
    from edgert.report.bench import bench_report
    from edgert.report.page import write_page

    results, traces = [], []
    for size in (32, 64):
        model = tiny_detector(tmp_path / f"tiny{size}.onnx", size=size)
        trace: dict[str, Any] = {}
        with get_backend("onnxruntime").open(model, SessionOptions(threads=1)) as session:
            res = bench_session(session, iterations=200, warmup=5, trace=trace)
        res["model"] = str(model)
        results.append(res)
        traces.append(trace)
    out = write_page(tmp_path / "two.html", bench_report(results, traces))
    browser.load(out.as_uri())
    legend = browser.evaluate("""[...document.querySelectorAll('svg[data-chart="latency-percentiles"] rect.bar')]
        .map(r => r.getAttribute('data-series'))""")
    assert legend == ["onnxruntime tiny32.onnx"] * 5 + ["onnxruntime tiny64.onnx"] * 5
    fps = _values(browser, 'svg[data-chart="throughput"] rect.bar')
    assert fps == pytest.approx([r["throughput_fps"] for r in results], rel=1e-5)
    headings = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)")
    assert headings[:2] == ["onnxruntime tiny32.onnx", "onnxruntime tiny64.onnx"]
    assert [len(t) for t in browser.evaluate("[...document.querySelectorAll('svg[data-chart=\"trace\"]')]"
                                             ".map(s => [...s.querySelector('polyline').points])")] == [200, 200]
    screenshot(browser, tmp_path, "bench-two-settings")
