"""``edgert calibrate`` and ``edgert compare`` run as a user runs them: in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgert.calib.trt_cache import read_cache
from tests.helpers import assert_one_line_error, run_cli

from .models import tiny_detector, write_images

pytest.importorskip("cv2")
ort = pytest.importorskip("onnxruntime")


@pytest.fixture()
def messy_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    good = write_images(folder, 5) + write_images(folder / "nested", 2, seed=1)
    (folder / "corrupt.jpg").write_bytes(good[0].read_bytes()[:150])
    (folder / "readme.txt").write_text("calibration photos")
    (folder / "empty_subfolder").mkdir()
    return folder


def test_calibrate_writes_qdq_cache_and_report_and_counts_skips(tmp_path: Path, messy_folder: Path) -> None:
    model = tiny_detector(tmp_path / "det.onnx", neg_inf_pad=True)
    out = tmp_path / "out" / "det.int8.onnx"
    # --num 0: every image, so the corrupt one is met (a draw of fewer may never decode it)
    r = run_cli("calibrate", str(model), "--images", str(messy_folder), "--num", "0", "--trt-version", "8.6.2",
                "--full-int8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "skipped 2 file(s): 1 unreadable image(s), 1 not an image" in r.stderr
    assert "Traceback" not in r.stderr
    assert "quantized" in r.stdout and "peak memory" in r.stdout

    qdq = onnx.load(str(out))
    assert sum(n.op_type == "QuantizeLinear" for n in qdq.graph.node) >= 2
    x = np.random.default_rng(0).uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    assert np.isfinite(ort.InferenceSession(str(out)).run(None, {"images": x})[0]).all()

    version, algorithm, scales = read_cache(tmp_path / "out" / "det.int8.calib")
    assert (version, algorithm) == (8602, "EntropyCalibration2")
    assert "images" in scales and "r1" in scales
    assert "padded" not in scales and "output0" not in scales  # -inf padding and the tail are not in the cache

    report = json.loads((tmp_path / "out" / "det.int8.report.json").read_text())
    assert report["images"]["used"] == 7 and report["images"]["skipped"] == 2
    assert report["summary"]["nonfinite_tensors"] == ["padded"]
    assert report["peak_rss_mb"] > 0 and report["timing_s"]["total"] > 0
    assert {row["tensor"] for row in report["tensors"] if row["role"] == "qdq"} == {"images", "pooled", "r2"}


def test_excluded_layers_stay_float_in_the_model_and_the_cache(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    r = run_cli("calibrate", str(model), "--images", str(folder), "--exclude", "conv2", "--no-check",
                "--trt-version", "10.3.0", "-o", str(out))
    assert r.returncode == 0, r.stderr
    conv2 = next(n for n in onnx.load(str(out)).graph.node if n.name == "conv2")
    assert list(conv2.input) == ["r1", "w2", "b2"]
    _, _, scales = read_cache(tmp_path / "det.int8.calib")
    assert "c1" in scales and "c2" not in scales  # no scale for its output: TensorRT keeps it out of INT8


def test_outputs_are_reused_when_up_to_date_and_rebuilt_when_stale(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    paths = write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    args = ("calibrate", str(model), "--images", str(folder), "--num", "3", "--no-check", "-o", str(out))
    assert run_cli(*args).returncode == 0
    key = json.loads((tmp_path / "det.int8.report.json").read_text())["key"]
    second = run_cli(*args)
    assert second.returncode == 0 and "up to date" in second.stdout
    paths[0].write_bytes(paths[1].read_bytes())  # the image set changed: the outputs are stale
    third = run_cli(*args)
    assert third.returncode == 0 and "up to date" not in third.stdout
    assert json.loads((tmp_path / "det.int8.report.json").read_text())["key"] != key
    fourth = run_cli(*args[:-2], "--method", "minmax", "-o", str(out))  # another method: stale too
    assert "up to date" not in fourth.stdout


def test_empty_folder_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    model = tiny_detector(tmp_path / "det.onnx")
    r = run_cli("calibrate", str(model), "--images", str(tmp_path / "empty"), "-o", str(tmp_path / "o.onnx"))
    assert_one_line_error(r, "no images to calibrate with")


def test_bad_model_and_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 2)
    r = run_cli("calibrate", str(tmp_path / "missing.onnx"), "--images", str(folder), "-o", str(tmp_path / "o.onnx"))
    assert_one_line_error(r, "model file not found")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    assert_one_line_error(run_cli("calibrate", str(junk), "--images", str(folder), "-o", str(tmp_path / "o.onnx")),
                          "not a readable ONNX model")
    model = tiny_detector(tmp_path / "det.onnx")
    assert_one_line_error(run_cli("calibrate", str(model), "--images", str(folder), "--max-drop", "2",
                                  "-o", str(tmp_path / "o.onnx")), "--max-drop")


def test_compare_reports_map_and_output_errors(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 4)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    assert run_cli("calibrate", str(model), "--images", str(folder), "--num", "2", "--no-check",
                   "-o", str(out)).returncode == 0
    r = run_cli("compare", str(model), str(out), "--images", str(folder), "--skip-used",
                str(tmp_path / "det.int8.report.json"), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["frames"] == 2  # the two images calibration did not use
    assert report["outputs"][0]["output"] == "output0"
    same = json.loads(run_cli("compare", str(model), str(model), "--images", str(folder), "--json").stdout)
    assert same["outputs"][0]["max_abs_error"] == 0.0
    assert same["map"]["map50_95"] in (1.0, None)
    assert_one_line_error(run_cli("compare", str(model), str(out)), "nothing to compare on")


def test_recipe_supplies_settings_and_flags_win(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 4)
    model = tiny_detector(tmp_path / "det.onnx")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("images: imgs\nnum: 2\nmethod: minmax\npreprocess:\n  pad_value: 0\n")
    out = tmp_path / "det.int8.onnx"
    r = run_cli("calibrate", str(model), "--recipe", str(recipe), "--no-check", "--json", "-o", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["images"]["used"] == 2 and report["method"] == "minmax"
    assert report["preprocess"]["pad_value"] == 0
    r = run_cli("calibrate", str(model), "--recipe", str(recipe), "--num", "3", "--method", "entropy",
                "--no-check", "--json", "-o", str(out))
    report = json.loads(r.stdout)
    assert report["images"]["used"] == 3 and report["method"] == "entropy"
    recipe.write_text("images: imgs\nnum: 2\nmethd: minmax\n")
    assert_one_line_error(run_cli("calibrate", str(model), "--recipe", str(recipe), "-o", str(out)),
                          "r.yaml:3: methd: unknown key")


def test_shipped_recipes_load() -> None:
    from edgert.calib.recipe import load_recipe
    from tests.helpers import ROOT

    for path in sorted((ROOT / "calibration").glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.images.endswith("shared/assets/images") and recipe.num == 32


def fake_tensorrt(root: Path, version: str, implicit_int8: bool) -> Path:
    """A stand-in ``tensorrt`` package (the real one needs a GPU install): a version and, like TensorRT
    8-10 but not 11, an INT8 calibrator class."""
    pkg = root / "tensorrt"
    pkg.mkdir(parents=True)
    body = f"__version__ = {version!r}\n"
    if implicit_int8:
        body += "class IInt8EntropyCalibrator2:\n    pass\n"
    (pkg / "__init__.py").write_text(body)
    return root


@pytest.mark.parametrize(("version", "implicit", "header"), [("10.3.0.30", True, 100300), ("8.5.2.2", True, 8502),
                                                             ("11.0.0.1", False, None)])
def test_cache_header_names_the_installed_tensorrt(tmp_path: Path, version: str, implicit: bool,
                                                   header: int | None) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    site = fake_tensorrt(tmp_path / "site", version, implicit)
    r = run_cli("calibrate", str(model), "--images", str(folder), "--no-check", "-o", str(out),
                env={"PYTHONPATH": f"{site}:{Path(__file__).resolve().parents[2]}"})
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "det.int8.calib"
    report = json.loads((tmp_path / "det.int8.report.json").read_text())
    if header is None:
        assert not cache.exists() and report["trt_cache"]["written"] is False
        assert "no implicit INT8" in r.stdout
    else:
        assert read_cache(cache)[0] == header and report["trt_cache"]["version"] == version.rsplit(".", 1)[0]


def test_no_tensorrt_writes_no_cache_unless_a_version_is_given(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    r = run_cli("calibrate", str(model), "--images", str(folder), "--no-check", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "det.int8.calib").exists() and "--trt-version" in r.stdout
    r = run_cli("calibrate", str(model), "--images", str(folder), "--no-check", "--trt-version", "8.6.2",
                "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert read_cache(tmp_path / "det.int8.calib")[0] == 8602
    assert_one_line_error(run_cli("calibrate", str(model), "--images", str(folder), "--trt-version", "11.0.0",
                                  "-o", str(out)), "no implicit INT8")


def test_already_quantized_model_is_a_one_line_error(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    write_images(folder, 3)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    assert run_cli("calibrate", str(model), "--images", str(folder), "--full-int8", "-o", str(out)).returncode == 0
    assert_one_line_error(run_cli("calibrate", str(out), "--images", str(folder), "-o", str(tmp_path / "again.onnx")),
                          "already quantized")
    assert_one_line_error(run_cli("calibrate", str(model), "--images", str(folder), "--full-int8", "--max-drop",
                                  "0.05", "-o", str(out)), "contradict")


def test_default_checks_on_calibration_images_mirrored_small_and_tiled_never_the_held_out_ones(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    paths = write_images(folder, 6)
    model = tiny_detector(tmp_path / "det.onnx")
    out = tmp_path / "det.int8.onnx"
    r = run_cli("calibrate", str(model), "--images", str(folder), "--num", "4", "-o", str(out))
    report = json.loads((tmp_path / "det.int8.report.json").read_text())
    assert r.returncode == (4 if report["verdict"]["collapse"] else 0), r.stderr  # the default target is a figure
    assert report["accuracy"]["frames"] == 16  # 4 calibration images x (as is, mirrored, half size, 3x3 mosaic)
    assert "mirror" in report["accuracy"]["frames_from"] and "3x3 mosaics" in report["accuracy"]["frames_from"]
    used = {Path(p) for p in report["images"]["used_files"]}
    assert len(used) == 4 and used < set(paths)
    m = report["accuracy"]["map"]["map50_95"]
    sens = report["sensitivity"]
    if m is not None and m < 0.99:  # then the default mixed-precision pass ran and says how far it got
        assert sens is not None and "budget_macs" in sens
    r = run_cli("calibrate", str(model), "--images", str(folder), "--num", "4", "--full-int8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "det.int8.report.json").read_text())["sensitivity"] is None
