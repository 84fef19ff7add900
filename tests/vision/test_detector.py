"""Detector end to end on tiny real ONNX models built here: layouts, dtypes, 0-255 input, end-to-end and
EfficientNMS outputs all through configuration alone, and the errors a user can cause.

The "rectangle finder" model is a real, if simple, detector: it reads ONE colour channel of its input
(channel 0: red when the preprocessing feeds RGB), finds the extent of the brightest pixels with
ArgMax over row and column profiles, and emits one end-to-end row [x1, y1, x2, y2, score, class]
(score = brightest value / 255) plus zero padding rows, in network-input pixels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert.config import PipelineConfig, load_config
from edgert.errors import InputError, ModelError
from edgert.vision.detector import Detector
from tests.helpers import tiny_model

pytest.importorskip("cv2")
pytest.importorskip("onnxruntime")

_ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "uint8": TensorProto.UINT8}


def _const(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value, name))


def rectangle_finder(
    path: Path,
    layout: str = "NHWC",
    dtype: str = "float32",
    size: tuple[int | str, int | str] = (100, 100),
    metadata: dict[str, str] | None = None,
    efficient_nms: bool = False,
) -> Path:
    h, w = size
    shape = [1, h, w, 3] if layout == "NHWC" else [1, 3, h, w]
    c_axis = 3 if layout == "NHWC" else 1
    x = helper.make_tensor_value_info("images", _ONNX_TYPES[dtype], shape)
    n = helper.make_node
    nodes = [
        n("Cast", ["images"], ["xf"], to=TensorProto.FLOAT),
        _const("c0", np.array(0, np.int64)),
        n("Gather", ["xf", "c0"], ["plane"], axis=c_axis),  # [1,H,W]: channel 0 only
        n("ReduceMax", ["plane"], ["col"], axes=[1], keepdims=0),  # [1,W]
        n("ReduceMax", ["plane"], ["row"], axes=[2], keepdims=0),  # [1,H]
        n("ArgMax", ["col"], ["x1i"], axis=1, keepdims=1),
        n("ArgMax", ["col"], ["x2i"], axis=1, keepdims=1, select_last_index=1),
        n("ArgMax", ["row"], ["y1i"], axis=1, keepdims=1),
        n("ArgMax", ["row"], ["y2i"], axis=1, keepdims=1, select_last_index=1),
        *[n("Cast", [f"{v}i"], [v], to=TensorProto.FLOAT) for v in ("x1", "x2", "y1", "y2")],
        _const("one", np.ones((1, 1), np.float32)),
        n("Add", ["x2", "one"], ["x2e"]),  # last bright column + 1: the box's right edge
        n("Add", ["y2", "one"], ["y2e"]),
        n("ReduceMax", ["col"], ["peak"], axes=[1], keepdims=1),
        _const("k255", np.full((1, 1), 255.0, np.float32)),
        n("Div", ["peak", "k255"], ["score"]),
        _const("cls", np.full((1, 1), 2.0, np.float32)),
    ]
    outputs: list[onnx.ValueInfoProto]
    if efficient_nms:
        nodes += [
            _const("ax0", np.array([0], np.int64)),
            n("Concat", ["x1", "y1", "x2e", "y2e"], ["box"], axis=1),
            n("Unsqueeze", ["box", "ax0"], ["box3"]),
            _const("boxpad", np.zeros((1, 9, 4), np.float32)),
            n("Concat", ["box3", "boxpad"], ["det_boxes"], axis=1),  # [1,10,4]
            _const("scorepad", np.full((1, 9), 0.99, np.float32)),  # junk beyond num_dets
            n("Concat", ["score", "scorepad"], ["det_scores"], axis=1),  # [1,10]
            _const("det_classes", np.full((1, 10), 2, np.int32)),
            _const("num_dets", np.ones((1, 1), np.int32)),
        ]
        outputs = [
            helper.make_tensor_value_info("num_dets", TensorProto.INT32, [1, 1]),
            helper.make_tensor_value_info("det_boxes", TensorProto.FLOAT, [1, 10, 4]),
            helper.make_tensor_value_info("det_scores", TensorProto.FLOAT, [1, 10]),
            helper.make_tensor_value_info("det_classes", TensorProto.INT32, [1, 10]),
        ]
    else:
        nodes += [
            _const("ax0", np.array([0], np.int64)),
            n("Concat", ["x1", "y1", "x2e", "y2e", "score", "cls"], ["row6"], axis=1),  # [1,6]
            n("Unsqueeze", ["row6", "ax0"], ["det"]),  # [1,1,6]
            _const("pad", np.zeros((1, 3, 6), np.float32)),  # end-to-end exports pad with zero rows
            n("Concat", ["det", "pad"], ["output0"], axis=1),  # [1,4,6]
        ]
        outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4, 6])]
    graph = helper.make_graph(nodes, "rectangle_finder", [x], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def frame_with_rectangles() -> np.ndarray:
    """200 x 100 black frame: a red rectangle x 60-100, y 30-70 and a blue one x 140-180, y 10-50.

    Letterboxed into 100x100 the frame scales by 0.5 exactly with 25-pixel bars above and below, so
    rectangle edges at even pixels stay sharp and the boxes map back exactly.
    """
    frame = np.zeros((100, 200, 3), np.uint8)
    frame[30:70, 60:100] = (0, 0, 255)  # BGR red
    frame[10:50, 140:180] = (255, 0, 0)  # BGR blue
    return frame


RED = [60, 30, 100, 70]
BLUE = [140, 10, 180, 50]


def config(tmp_path: Path, text: str) -> PipelineConfig:
    """A pipeline config written and loaded as a user's YAML file would be."""
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("layout", "dtype", "yaml", "box"),
    [
        ("NHWC", "float32", "preprocess: {scale: 1.0}", RED),
        ("NHWC", "uint8", "preprocess: {scale: 1.0}", RED),
        ("NCHW", "float16", "preprocess: {scale: 1.0}", RED),
        ("NCHW", "float32", "preprocess: {scale: 1.0, color: bgr}", BLUE),  # channel 0 is now blue
        ("NHWC", "float32", "preprocess: {scale: 1.0, layout: NHWC, dtype: float32}\ndecode: {kind: end2end}", RED),
    ],
)
def test_configured_models_map_boxes_back(tmp_path: Path, layout: str, dtype: str, yaml: str, box: list) -> None:
    model = rectangle_finder(tmp_path / "m.onnx", layout, dtype)
    with Detector(model, config(tmp_path, yaml)) as det:
        assert det.decoder.kind == "end2end"
        assert det.preprocessor.layout == layout and det.preprocessor.input_dtype == np.dtype(dtype)
        result = det(frame_with_rectangles())
    assert result.class_id.tolist() == [2]
    assert result.confidence[0] == pytest.approx(1.0)
    np.testing.assert_allclose(result.xyxy[0], box, atol=0.01)
    assert result.to_records()[0]["box"] == [float(v) for v in box]


def test_input_scale_comes_from_config(tmp_path: Path) -> None:
    """The same 0-255 model with the default 1/255 scaling sees a peak of 1/255: below the threshold."""
    model = rectangle_finder(tmp_path / "m.onnx")
    with Detector(model) as det:
        assert len(det(frame_with_rectangles())) == 0
    with Detector(model, config(tmp_path, "preprocess: {scale: 1.0}\ndecode: {conf: 0.001}")) as det:
        assert len(det(frame_with_rectangles())) == 1  # the zero padding rows never pass a threshold
    with Detector(model, config(tmp_path, "preprocess: {scale: 1.0}\ndecode: {classes: [0, 1]}")) as det:
        assert len(det(frame_with_rectangles())) == 0  # class filter drops class 2


def test_efficient_nms_outputs(tmp_path: Path) -> None:
    model = rectangle_finder(tmp_path / "m.onnx", efficient_nms=True)
    with Detector(model, config(tmp_path, "preprocess: {scale: 1.0}")) as det:
        assert det.decoder.kind == "efficient_nms"
        result = det(frame_with_rectangles())
    assert result.class_id.tolist() == [2]  # the padded rows score 0.99 but lie beyond num_dets
    np.testing.assert_allclose(result.xyxy[0], RED, atol=0.01)


def test_dynamic_image_size_from_ultralytics_metadata(tmp_path: Path) -> None:
    meta = {"imgsz": "[100, 100]", "names": "{0: 'a', 1: 'b', 2: 'rectangle'}"}
    model = rectangle_finder(tmp_path / "m.onnx", "NCHW", size=("height", "width"), metadata=meta)
    with Detector(model, config(tmp_path, "preprocess: {scale: 1.0}")) as det:
        assert det.session.inputs["images"].shape == (1, 3, 100, 100)
        result = det(frame_with_rectangles())
    assert result.class_names() == ["rectangle"]
    np.testing.assert_allclose(result.xyxy[0], RED, atol=0.01)


def test_detector_on_a_session_it_does_not_own(tmp_path: Path) -> None:
    from edgert.backends import SessionOptions, open_session

    meta = {"imgsz": "[100, 100]"}
    model = rectangle_finder(tmp_path / "m.onnx", "NCHW", size=("height", "width"), metadata=meta)
    cfg = config(tmp_path, "preprocess: {scale: 1.0}")
    # dynamic dims opened as 1x1: not what the preprocessing needs
    with open_session(model, "onnxruntime") as session, pytest.raises(ModelError, match=r"needs \[1, 3, 100, 100\]"):
        Detector(model, cfg, session=session)
    with open_session(model, "onnxruntime", SessionOptions(shapes={"images": (1, 3, 100, 100)})) as session:
        with Detector(model, cfg, session=session) as det:
            np.testing.assert_allclose(det(frame_with_rectangles()).xyxy[0], RED, atol=0.01)
        session.infer()  # closing the detector left the caller's session open


def test_frames_of_other_sizes(tmp_path: Path) -> None:
    model = rectangle_finder(tmp_path / "m.onnx")
    with Detector(model, config(tmp_path, "preprocess: {scale: 1.0}")) as det:
        tall = np.zeros((200, 100, 3), np.uint8)
        tall[20:60, 40:80] = (0, 0, 255)
        np.testing.assert_allclose(det(tall).xyxy[0], [40, 20, 80, 60], atol=0.01)
        np.testing.assert_allclose(det(frame_with_rectangles()).xyxy[0], RED, atol=0.01)


def test_model_matching_no_decoder(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "relu.onnx", (1, 3, 32, 32))
    with pytest.raises(ModelError) as info:
        Detector(model)
    assert "\n" not in str(info.value) and "y float32[1,3,32,32]" in str(info.value)


def test_bad_frame(tmp_path: Path) -> None:
    with Detector(rectangle_finder(tmp_path / "m.onnx"), config(tmp_path, "preprocess: {scale: 1.0}")) as det:
        with pytest.raises(InputError, match="HxWx3 uint8"):
            det(np.zeros((100, 200), np.uint8))
        with pytest.raises(InputError, match="HxWx3 uint8"):
            det(np.zeros((100, 200, 3), np.float64))


def test_drawn_sizes_follow_the_frame() -> None:
    from edgert.vision.draw import frame_style

    small, hd, uhd = (frame_style(np.zeros((h, w, 3), np.uint8)) for h, w in ((288, 384), (720, 1280), (2160, 3840)))
    assert small == (1, 0.35) and hd == (2, 0.8) and uhd == (3, 1.2)


def test_draw_detections_marks_the_box() -> None:
    from edgert.vision.detections import Detections
    from edgert.vision.draw import class_color, draw_detections

    frame = np.zeros((120, 160, 3), np.uint8)
    assert draw_detections(frame, Detections.empty()) is frame and not frame.any()
    det = Detections([[40, 50, 100, 110]], [0.87], [1], ("a", "person"))
    out = draw_detections(frame, det, thickness=2)
    assert out is frame  # drawn in place
    color = np.array(class_color(1), np.uint8)
    assert (frame[80, 40] == color).all() and (frame[80, 100] == color).all()  # left and right edges
    assert not frame[80, 70].any()  # inside stays untouched
    assert frame[35:50, 40:100].any()  # the label above the box
    tall = np.zeros((60, 60, 3), np.uint8)
    draw_detections(tall, Detections([[5, 0, 50, 55]], [0.5], [0]))  # box at the top: label inside
    assert tall[2:12, 6:40].any()


@pytest.mark.parametrize(("names", "expected"), [("coco", "car"), ("labels.txt", "pallet")])
def test_end2end_model_without_metadata_names_classes_from_config(tmp_path: Path, names: str, expected: str) -> None:
    model = rectangle_finder(tmp_path / "e2e.onnx")  # class 2, no names in its metadata
    (tmp_path / "labels.txt").write_text("person\nforklift\npallet\n")
    cfg = config(tmp_path, f"model: {model}\npreprocess: {{scale: 1.0}}\ndecode: {{names: {names}}}\n")
    assert cfg.model.path == str(model)
    with Detector(cfg.model.path, cfg) as det:
        found = det(frame_with_rectangles())
    assert det.decoder.kind == "end2end"
    assert found.class_names() == [expected]
