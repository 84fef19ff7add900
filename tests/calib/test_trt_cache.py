"""The TensorRT calibration cache text format."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from edgert.calib.trt_cache import format_cache, parse_cache, read_cache, scale_to_hex, trt_version_number, write_cache
from edgert.errors import CalibrationError


def test_version_numbers_follow_nv_tensorrt_version() -> None:
    assert trt_version_number("7.1.3") == 7103
    assert trt_version_number("8.5.2") == 8502
    assert trt_version_number("8.6.2") == 8602
    assert trt_version_number("10.3.0") == 100300
    with pytest.raises(CalibrationError):
        trt_version_number("eight")


def test_scale_hex_is_the_float_bits_most_significant_first() -> None:
    assert scale_to_hex(1.0) == "3f800000"
    assert scale_to_hex(1.0 / 127.0) == "3c010204"  # a [0,1] input, as in TensorRT's MNIST sample cache
    s = 0.0123
    # NVIDIA TAO writes hex(struct.unpack("i", struct.pack("f", s))[0]): the same digits
    assert scale_to_hex(s) == hex(struct.unpack("i", struct.pack("f", s))[0])[2:]


def test_cache_round_trip(tmp_path: Path) -> None:
    scales = {"images": 1 / 127, "/model.0/conv/Conv_output_0": 0.0421, "Pad_1:0": 0.5}
    path = write_cache(tmp_path / "m.calib", scales, "8.6.2")
    text = path.read_text()
    lines = text.splitlines()
    assert lines[0] == "TRT-8602-EntropyCalibration2"
    assert lines[1] == "images: 3c010204"
    assert text.endswith("\n")
    version, algo, back = read_cache(path)
    assert (version, algo) == (8602, "EntropyCalibration2")
    for k, v in scales.items():
        assert back[k] == pytest.approx(v, rel=1e-7)
    assert format_cache(scales, "10.3.0", "MinMaxCalibration").startswith("TRT-100300-MinMaxCalibration\n")


@pytest.mark.parametrize("text", ["", "hello\n", "TRT-8602-EntropyCalibration2\nx 3c010204\n",
                                  "TRT-8602-EntropyCalibration2\nx: 3c010204\nx: 3c010204\n"])
def test_malformed_caches_are_one_line_errors(text: str) -> None:
    with pytest.raises(CalibrationError):
        parse_cache(text)


def test_names_that_would_break_the_format_are_refused() -> None:
    with pytest.raises(CalibrationError):
        format_cache({"a\nb": 0.1}, "8.6.2")
