"""Whisper in INT8 and FP16: what goes INT8, that the folders run, build with TensorRT-RTX, and fail in one line.

Tiny Whisper-shaped models built here (conv front end, LayerNorm, attention, residual Add, a decomposed
LayerNorm, a weight stored as float16 and cast) check the placement and the rewrites quickly; the real
tiny.en folder of the assets goes through calibrate -> transcribe and convert -> transcribe.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgert._lazy import is_importable
from edgert.errors import CalibrationError, ModelError

from ..helpers import assert_one_line_error, run_cli

sf = pytest.importorskip("soundfile")
ort = pytest.importorskip("onnxruntime")
SR = 16000
H = 8  # hidden size of the tiny encoder
FRAMES = 1000  # 3000 mel frames, conv stride 3


def _init(name: str, shape: tuple[int, ...], rng: np.random.Generator, scale: float = 0.3,
          dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(dtype), name)


def tiny_encoder(seed: int = 0) -> onnx.ModelProto:
    """mel [1,80,3000] -> Conv -> LayerNorm -> attention (q, k, v, softmax) -> out proj + bias -> residual Add
    -> decomposed LayerNorm -> MatMul with a float16 weight cast to float32 -> LayerNormalization -> output."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    nodes = [
        n("Conv", ["mel", "conv_w", "conv_b"], ["c"], name="conv", strides=[3], kernel_shape=[3]),
        n("Transpose", ["c"], ["x0"], name="t0", perm=[0, 2, 1]),
        n("LayerNormalization", ["x0", "ln_g", "ln_b"], ["ln"], name="ln1", axis=-1),
        n("MatMul", ["ln", "wq"], ["q"], name="q"),
        n("MatMul", ["ln", "wk"], ["k"], name="k"),
        n("MatMul", ["ln", "wv"], ["v"], name="v"),
        n("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
        n("MatMul", ["q", "kt"], ["s"], name="qk"),
        n("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        n("MatMul", ["p", "v"], ["a"], name="pv"),
        n("MatMul", ["a", "wo"], ["o0"], name="o"),
        n("Add", ["o_b", "o0"], ["o"], name="o_bias"),
        n("Add", ["x0", "o"], ["r"], name="residual"),
        n("ReduceMean", ["r", "axes"], ["mu"], name="mean"),
        n("Sub", ["r", "mu"], ["d"], name="sub"),
        n("Pow", ["d", "two"], ["d2"], name="pow"),
        n("ReduceMean", ["d2", "axes"], ["var"], name="var"),
        n("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
        n("Sqrt", ["var_eps"], ["sd"], name="sqrt"),
        n("Div", ["d", "sd"], ["norm"], name="div"),
        n("Cast", ["w2__fp16"], ["w2"], name="w2_cast", to=TensorProto.FLOAT),
        n("MatMul", ["norm", "w2"], ["f"], name="f"),
        n("LayerNormalization", ["f", "ln_g", "ln_b"], ["encoder_out"], name="ln_post", axis=-1),
    ]
    inits = [
        _init("conv_w", (H, 80, 3), rng, 0.05), _init("conv_b", (H,), rng, 0.1),
        numpy_helper.from_array(np.ones(H, np.float32), "ln_g"),
        numpy_helper.from_array(np.zeros(H, np.float32), "ln_b"),
        _init("wq", (H, H), rng), _init("wk", (H, H), rng), _init("wv", (H, H), rng), _init("wo", (H, H), rng),
        _init("o_b", (H,), rng, 0.1), _init("w2__fp16", (H, H), rng, dtype=np.float16),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"), numpy_helper.from_array(np.float32(2.0), "two"),
        numpy_helper.from_array(np.float32(1e-5), "eps"),
    ]
    graph = helper.make_graph(
        nodes, "tiny_whisper_encoder", [helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 80, 3000])],
        [helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, FRAMES, H])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_decoder(vocab: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "tokens"], ["e"], name="embed"),
        n("ReduceMean", ["encoder_out", "axes"], ["ctx"], name="ctx", keepdims=1),
        n("Add", ["e", "ctx"], ["h"], name="add"),
        n("MatMul", ["h", "w_out"], ["logits"], name="logits"),
    ]
    inits = [_init("emb", (vocab, H), rng), _init("w_out", (H, vocab), rng),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    graph = helper.make_graph(
        nodes, "tiny_whisper_decoder",
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [1, "n"]),
         helper.make_tensor_value_info("encoder_out", TensorProto.FLOAT, [1, FRAMES, H])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    d = tmp_path / "whisper"
    d.mkdir()
    onnx.save(tiny_encoder(), str(d / "encoder.onnx"))
    onnx.save(tiny_decoder(), str(d / "decoder.onnx"))
    (d / "tokenizer.json").write_text('{"tiny": "not read by calibration or conversion"}')
    return d


@pytest.fixture
def clips(tmp_path: Path) -> Path:
    d = tmp_path / "clips"
    d.mkdir()
    rng = np.random.default_rng(0)
    t = np.arange(2 * SR) / SR
    for i, f in enumerate((220.0, 440.0)):
        audio = 0.3 * np.sin(2 * np.pi * f * t) + 0.02 * rng.standard_normal(t.size)
        sf.write(d / f"{i}.wav", audio.astype(np.float32), SR)
    return d


def _run(model: onnx.ModelProto | Path, feed: dict[str, np.ndarray]) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    src = str(model) if isinstance(model, Path) else model.SerializeToString()
    out: np.ndarray = ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    return out


def _mel(clip: Path) -> np.ndarray:
    from edgert.speech import WhisperFeatures, read_audio

    return WhisperFeatures()(read_audio(clip))


# --------------------------------------------------------------------------------------------------
# INT8 placement on the tiny encoder


def test_int8_quantizes_the_layer_inputs_and_leaves_norms_softmax_and_residuals_float(
        tiny_folder: Path, clips: Path, tmp_path: Path) -> None:
    from edgert.calib.whisper import REPORT_NAME, WhisperCalibrationOptions, calibrate_whisper

    out = tmp_path / "int8"
    report = calibrate_whisper(tiny_folder, clips, out, WhisperCalibrationOptions(check=False), progress=False)
    model = onnx.load(str(out / "encoder.onnx"))
    g = model.graph
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    producer = {t: node for node in g.node for t in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)

    def quantized_inputs(name: str) -> list[bool]:
        node = next(x for x in g.node if x.name == name)
        return [t in producer and producer[t].op_type == "DequantizeLinear" for t in node.input]

    # every layer with weights: activation and weight through Q/DQ; the bias Add reads a float initializer
    for name in ("conv", "q", "k", "v", "o", "f"):
        assert quantized_inputs(name)[:2] == [True, True], name
    assert quantized_inputs("qk") == [True, True]  # attention scores: both activations INT8
    assert quantized_inputs("pv") == [False, False]  # softmax x V stays float
    for name in ("ln1", "ln_post", "softmax", "residual", "o_bias", "mean", "sub", "pow", "var", "sqrt", "div"):
        assert not any(quantized_inputs(name)), name
    assert inits["conv_b"].dtype == np.float32 and inits["o_b"].dtype == np.float32  # biases stay float
    # only Conv and MatMul read a DequantizeLinear; weights are symmetric INT8, one scale per output channel
    dqs = [node for node in g.node if node.op_type == "DequantizeLinear"]
    assert {c.op_type for d in dqs for c in consumers[d.output[0]]} == {"Conv", "MatMul"}
    for d in dqs:
        assert not np.any(inits[d.input[2]]), d.name  # zero point 0
        if d.input[0] in inits:  # a weight
            w = inits[d.input[0]]
            axis = next(a.i for a in d.attribute if a.name == "axis")
            assert w.dtype == np.int8 and inits[d.input[1]].shape == (w.shape[axis],)
            assert axis == (0 if w.ndim == 3 else 1)
    assert "w2__fp16" not in inits  # the cast float16 weight was folded, then quantized
    # INT8 stays close to FP32 on a calibration clip
    mel = _mel(clips / "0.wav")
    ref, got = _run(tiny_encoder(), {"mel": mel}), _run(out / "encoder.onnx", {"mel": mel})
    assert float(np.mean((got - ref) ** 2) / np.mean(ref**2)) < 0.02
    # the folder is complete and the report says what stayed float
    assert (out / "decoder.onnx").read_bytes() == (tiny_folder / "decoder.onnx").read_bytes()
    assert (out / "tokenizer.json").read_text() == (tiny_folder / "tokenizer.json").read_text()
    saved = json.loads((out / REPORT_NAME).read_text())
    assert saved["clips"]["used"] == 2 and saved["summary"]["quantized_layers"] == 7
    assert {"LayerNormalization", "Softmax", "Add", "ReduceMean", "Sqrt", "Div"} <= set(saved["summary"]["float_ops"])
    assert saved["float_layers"] == {"pv": "attention MatMul reading Softmax stays float"}
    assert report["summary"]["qdq_tensors"] == len([d for d in dqs if d.input[0] not in inits])


def test_statistics_stay_histograms_whatever_the_number_of_clips(tiny_folder: Path, tmp_path: Path) -> None:
    """The collector keeps fixed-size histograms: no activation of a clip outlives its run."""
    import onnx as onnx_

    from edgert.calib.collect import ActivationCollector
    from edgert.calib.qdq import prepare_model
    from edgert.calib.whisper import plan_whisper
    from edgert.speech.calibration import CalibrationClips, whisper_encoder_fill
    from edgert.speech.precision import fold_weight_casts

    folder = tmp_path / "many"
    folder.mkdir()
    rng = np.random.default_rng(2)
    for i in range(6):
        sf.write(folder / f"{i}.wav", (0.1 * rng.standard_normal(SR // 2)).astype(np.float32), SR)
    prepared = prepare_model(fold_weight_casts(onnx_.load(str(tiny_folder / "encoder.onnx")))[0])
    plan = plan_whisper(prepared)
    sizes = []
    for num in (2, 6):
        collector = ActivationCollector(prepared, plan.quantized_tensors)
        hists = collector.run(CalibrationClips(folder, num=num), whisper_encoder_fill,
                              np.zeros((1, 80, 3000), np.float32), progress=False)
        assert collector.samples == num
        sizes.append(sum(h.counts.nbytes for h in hists.values()))
        assert hists["mel"].count == num * 80 * 3000
    assert sizes[0] == sizes[1]


# --------------------------------------------------------------------------------------------------
# FP16 on the tiny folder


def test_fp16_folder_keeps_float32_io_and_sensitive_ops(tiny_folder: Path, tmp_path: Path) -> None:
    from edgert.rewrite.fp16 import fp16_state
    from edgert.speech.precision import convert_whisper_fp16

    out = tmp_path / "fp16"
    result = convert_whisper_fp16(tiny_folder, out)
    enc, dec = onnx.load(str(out / "encoder.onnx")), onnx.load(str(out / "decoder.onnx"))
    assert fp16_state(enc) == "float16" and fp16_state(dec) == "float16"
    for model in (enc, dec):  # float32 in and out: the encoder ends in a LayerNorm the converter keeps float32
        assert [o.type.tensor_type.elem_type for o in model.graph.output] == [TensorProto.FLOAT]
    why = result["files"]["encoder.onnx"]["float32_why"]
    assert why.get("LayerNormalization (float32 op)") == 2 and why.get("Softmax (float32 op)") == 1
    assert result["files"]["encoder.onnx"]["weight_casts_folded"] == 1
    assert (out / "tokenizer.json").read_text() == (tiny_folder / "tokenizer.json").read_text()
    mel = np.random.default_rng(3).random((1, 80, 3000), dtype=np.float32)
    ref, got = _run(tiny_encoder(), {"mel": mel}), _run(out / "encoder.onnx", {"mel": mel})
    assert got.dtype == np.float32 and float(np.max(np.abs(got - ref))) < 0.05 * float(np.max(np.abs(ref)))
    feed = {"tokens": np.array([[1, 2, 3]], np.int64), "encoder_out": ref}
    assert np.allclose(_run(out / "decoder.onnx", feed), _run(tiny_decoder(), feed), atol=0.05)


def test_convert_cli_takes_a_whisper_folder(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "fp16cli"
    r = run_cli("convert", str(tiny_folder), "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    files = json.loads(r.stdout)["files"]
    assert set(files) == {"encoder.onnx", "decoder.onnx", "tokenizer.json"}
    assert sorted(p.name for p in out.iterdir()) == ["decoder.onnx", "encoder.onnx", "tokenizer.json"]


# --------------------------------------------------------------------------------------------------
# Bad input: one line, exit 1


def test_audio_folder_without_a_readable_clip(tiny_folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk")
    (bad / "b.flac").write_bytes(b"not flac at all")
    r = run_cli("calibrate", str(tiny_folder), "--audio", str(bad), "-o", str(tmp_path / "out"))
    assert_one_line_error(r, "none of its 2 audio file(s) could be read")
    assert not (tmp_path / "out" / "encoder.onnx").exists()


@pytest.mark.parametrize("command", ["calibrate", "convert", "run"])
def test_whisper_folder_without_tokenizer(tiny_folder: Path, clips: Path, tmp_path: Path, command: str) -> None:
    (tiny_folder / "tokenizer.json").unlink()
    args = {"calibrate": ["calibrate", str(tiny_folder), "--audio", str(clips), "-o", str(tmp_path / "o")],
            "convert": ["convert", str(tiny_folder), "-o", str(tmp_path / "o")],
            "run": ["run", "--task", "asr", "--model", str(tiny_folder), "--source", str(clips / "0.wav")]}[command]
    assert_one_line_error(run_cli(*args), "lacks tokenizer.json")


def _qdq_folder(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    m = onnx.load(str(dst / "encoder.onnx"))
    g = m.graph
    g.initializer.extend([numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.int8(0), "z")])
    conv = next(x for x in g.node if x.name == "conv")
    conv.input[0] = "mel_dq"
    g.node.insert(0, helper.make_node("DequantizeLinear", ["mel_q", "s", "z"], ["mel_dq"], name="dq"))
    g.node.insert(0, helper.make_node("QuantizeLinear", ["mel", "s", "z"], ["mel_q"], name="q_in"))
    onnx.save(m, str(dst / "encoder.onnx"))
    return dst


@pytest.mark.parametrize("command", ["calibrate", "convert"])
@pytest.mark.parametrize("state", ["INT8", "FP16"])
def test_already_quantized_or_fp16_folder(tiny_folder: Path, clips: Path, tmp_path: Path, command: str,
                                          state: str) -> None:
    if state == "INT8":
        folder = _qdq_folder(tiny_folder, tmp_path / "int8")
    else:
        from edgert.speech.precision import convert_whisper_fp16

        folder = tmp_path / "fp16"
        convert_whisper_fp16(tiny_folder, folder, check=False)
    args = (["calibrate", str(folder), "--audio", str(clips)] if command == "calibrate" else ["convert", str(folder)])
    assert_one_line_error(run_cli(*args, "-o", str(tmp_path / "o")), f"already {state}")


def test_calibrate_flags_that_do_not_fit_a_whisper_folder(tiny_folder: Path, clips: Path, tmp_path: Path) -> None:
    assert_one_line_error(run_cli("calibrate", str(tiny_folder), "-o", str(tmp_path / "o")), "give --audio")
    assert_one_line_error(run_cli("calibrate", str(tiny_folder), "--audio", str(clips), "--images", str(clips),
                                  "-o", str(tmp_path / "o")), "--images", "image calibration only")
    assert_one_line_error(run_cli("calibrate", str(tiny_folder / "encoder.onnx"), "--audio", str(clips),
                                  "-o", str(tmp_path / "o")), "not a folder")


def test_output_folder_must_differ_from_the_model_folder(tiny_folder: Path, clips: Path) -> None:
    from edgert.calib.whisper import calibrate_whisper
    from edgert.speech.precision import convert_whisper_fp16

    with pytest.raises(ModelError, match="the model's own folder"):
        convert_whisper_fp16(tiny_folder, tiny_folder)
    with pytest.raises(ModelError, match="the model's own folder"):
        calibrate_whisper(tiny_folder, clips, tiny_folder, progress=False)
    with pytest.raises(CalibrationError, match="no audio clips"):
        calibrate_whisper(tiny_folder, tiny_folder, tiny_folder.parent / "o", progress=False)


# --------------------------------------------------------------------------------------------------
# The real Whisper tiny.en: calibrate -> transcribe, convert -> transcribe, TensorRT-RTX builds


@pytest.fixture(scope="module")
def real_whisper(assets: Path) -> Path:
    path = assets / "models" / "speech" / "whisper-tiny.en"
    if not (path / "encoder.onnx").is_file():
        pytest.skip("Whisper tiny.en missing from the assets")
    pytest.importorskip("tokenizers")
    return path


@pytest.fixture(scope="module")
def int8_whisper(real_whisper: Path, assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whisper") / "int8"
    r = run_cli("calibrate", str(real_whisper), "--audio", str(assets / "audio" / "cards"), "--num", "2",
                "--decoder-int8", "--no-check", "--json", "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["clips"]["used"] == 2 and report["summary"]["quantized_layers"] == 22  # 2 conv, 16 linear, 4 QK
    # 4 layers x (self q/k/v/out + QK, cross q/out + kv + QK, 2 MLP) + the output projection
    assert report["decoder"]["quantized_layers"] == 37 and report["decoder"]["clips"] == 2
    for name in ("encoder.onnx", "decoder.onnx"):
        assert any(n.op_type == "DequantizeLinear" for n in onnx.load(str(out / name)).graph.node), name
    return out


@pytest.fixture(scope="module")
def fp16_whisper(real_whisper: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whisper") / "fp16"
    r = run_cli("convert", str(real_whisper), "-o", str(out), "--no-check", timeout=600)
    assert r.returncode == 0, r.stderr
    return out


def _transcribe(model: Path, clip: Path, tmp_path: Path) -> str:
    events = tmp_path / f"{model.name}.jsonl"
    r = run_cli("run", "--task", "asr", "--model", str(model), "--source", str(clip), "--backend", "onnxruntime",
                "--sink", f"jsonl://{events}", timeout=300)
    assert r.returncode == 0, r.stderr
    return " ".join(json.loads(line)["text"] for line in events.read_text().splitlines())


@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_real_whisper_folder_transcribes_like_fp32(precision: str, request: pytest.FixtureRequest, whisper: Any,
                                                   librivox: Path, tmp_path: Path) -> None:
    from edgert.speech import normalize_text, read_audio, word_errors

    folder = request.getfixturevalue(f"{precision}_whisper")
    clip = librivox / "sense_and_sensibility_01_austen_64kb-0930.wav"  # 3.3 s
    reference = whisper.transcribe(read_audio(clip)).text
    got = _transcribe(folder, clip, tmp_path)
    assert word_errors(normalize_text(reference), normalize_text(got)) <= 1, (reference, got)


@pytest.mark.skipif(not is_importable("tensorrt_rtx"), reason="tensorrt-rtx not installed: pip install 'edgert[rtx]'")
@pytest.mark.parametrize("precision", ["int8", "fp16"])
@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_real_whisper_builds_with_tensorrt_rtx(precision: str, part: str, request: pytest.FixtureRequest,
                                               tmp_path: Path) -> None:
    folder = request.getfixturevalue(f"{precision}_whisper")
    out = tmp_path / f"{part}.engine"
    shapes = ["--shapes=tokens:1x1/1x16/1x224"] if part == "decoder" else []
    r = run_cli("build", str(folder / f"{part}.onnx"), "-o", str(out), "--backend", "tensorrt-rtx", "--no-progress",
                *shapes, timeout=600)
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 1_000_000


# --------------------------------------------------------------------------------------------------
# The small speech models: FP16 through edgert convert, where the converter can


@pytest.mark.parametrize(("model", "shapes"), [
    ("openwakeword/melspectrogram.onnx", ["input:1x1760/1x1760/1x1760"]),
    ("openwakeword/embedding_model.onnx", ["input_1:1x76x32x1/1x76x32x1/1x76x32x1"]),
])
def test_openwakeword_front_end_converts_to_fp16_and_builds(tmp_path: Path, speech_models: Path, model: str,
                                                            shapes: list[str]) -> None:
    out = tmp_path / "m16.onnx"
    r = run_cli("convert", str(speech_models / model), "-o", str(out), "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    result = json.loads(r.stdout)
    # melspectrogram takes any number of samples: the one-sample random check cannot run it and says so
    assert "check_max_rel_error" in result or "check_skipped" in result
    assert result["fp16_nodes"] > 0
    if not is_importable("tensorrt_rtx"):
        pytest.skip("tensorrt-rtx not installed: FP16 conversion checked, build not")
    engine = tmp_path / "m16.engine"
    r = run_cli("build", str(out), "-o", str(engine), "--backend", "tensorrt-rtx", "--no-progress",
                *[f"--shapes={s}" for s in shapes])
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("model", ["silero_vad_op18_ifless.onnx", "openwakeword/hey_jarvis_v0.1.onnx"])
def test_models_with_if_nodes_do_not_convert_and_say_so_in_one_line(tmp_path: Path, speech_models: Path,
                                                                    model: str) -> None:
    """onnxconverter-common leaves graphs with If subgraphs invalid (the "ifless" Silero export still has
    one); the FP16 rewrite's checker stops there with one line instead of writing a broken model."""
    out = tmp_path / "m16.onnx"
    assert_one_line_error(run_cli("convert", str(speech_models / model), "-o", str(out)), "onnx's checker")
    assert not out.exists()
