"""INT8 calibration of a Whisper folder: the encoder in Q/DQ INT8 from a folder of speech clips.

``calibrate_whisper(WHISPER_DIR, CLIPS, OUT_DIR)`` writes OUT_DIR as a Whisper folder that
``edgert run --task asr --model OUT_DIR`` runs: ``encoder.onnx`` explicitly quantized, ``decoder.onnx``
and ``tokenizer.json`` copied, and ``calibration.report.json`` (+ ``.html``).

What is INT8 and what is not. Quantizing every layer of Whisper makes it transcribe nonsense (public
reports on ONNX Runtime's ``quantize_static`` over the whole graph), and the detector placement
(:func:`edgert.calib.qdq.plan_quantization`) does not fit either: it keeps everything after the last Conv
in float as a "decoding tail", which in the encoder is the whole transformer. So the plan here is its own
(:func:`plan_whisper`), written by the same Q/DQ writer:

* INT8: the inputs of Conv, Gemm and MatMul; weights symmetric per output channel, activations
  symmetric per tensor, biases float (the form TensorRT's ONNX parser takes). The attention score
  MatMul (Q x K^T, both inputs activations) is INT8 too unless ``attention=False``;
* float: LayerNormalization (and its decomposed form ReduceMean/Sub/Pow/Sqrt/Div), the residual Adds,
  Softmax and the MatMul that reads it (softmax x V: per-tensor INT8 of attention probabilities took
  the encoder output's normalized error on tiny.en from 0.011 to 0.24), the GELU, everything else:
  Q/DQ only go in front of the layers above.

Statistics are histograms streamed out of ONNX Runtime (:class:`~edgert.calib.collect.ActivationCollector`):
memory is one clip's exposed activations plus 32 KiB per tensor, whatever the number of clips. Ranges
come from :mod:`edgert.calib.histograms`. After writing, with ``check``, FP32 and INT8 transcribe the
first ``check_clips`` calibration clips and the report gives the INT8 word error rate against the FP32
transcripts and the encoder output's normalized error (a sanity check on clips calibration saw, not an
evaluation: ``scripts/wer.py --model OUT_DIR`` measures WER against references).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from edgert.calib.collect import ActivationCollector
from edgert.calib.histograms import Method, TensorRange
from edgert.calib.qdq import GraphPlan, QuantTarget, prepare_model, weighted_inputs, write_qdq
from edgert.calib.summary import peak_rss_mb, tensor_rows, write_report
from edgert.errors import CalibrationError
from edgert.rewrite.graph import activation_graph, reads_softmax

__all__ = ["REPORT_NAME", "WhisperCalibrationOptions", "calibrate_whisper", "format_whisper_table", "plan_whisper"]

log = logging.getLogger(__name__)

REPORT_NAME = "calibration.report.json"
#: Layer types whose inputs go INT8 in the encoder.
WHISPER_OPS: tuple[str, ...] = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class WhisperCalibrationOptions:
    num: int | None = 32
    method: Method = "percentile"
    percentile: float = 99.99
    seed: int = 0
    attention: bool = True  # the attention score MatMul (Q x K^T) in INT8 too
    decoder: bool = False  # the decoder in INT8 too (calibrated on FP32's own transcripts of the clips)
    check: bool = True
    check_clips: int = 3
    budget_mb: float = 512.0
    threads: int = 0
    exclude_nodes: tuple[str, ...] = ()


def _float_tensors(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    return {vi.name for vi in [*g.input, *g.value_info, *g.output]
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == TensorProto.FLOAT}


def plan_whisper(model: onnx.ModelProto, attention: bool = True, exclude_nodes: Collection[str] = ()) -> GraphPlan:
    """Which layers of a Whisper encoder (from :func:`~edgert.calib.qdq.prepare_model`) run in INT8."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    act = activation_graph(model)
    floats = _float_tensors(model)

    def is_act(t: str) -> bool:
        return t in act.dynamic and t in floats and t not in inits

    def weight(t: str) -> bool:
        init = inits.get(t)
        return init is not None and init.data_type == TensorProto.FLOAT

    graph_inputs = [i.name for i in g.input if i.name not in inits]
    activation_tensors = [t for t in graph_inputs if t in floats]
    activation_tensors += [t for n in act.dynamic_nodes for t in n.output if t and t in floats]
    targets: list[QuantTarget] = []
    skipped: dict[str, str] = {}
    excluded = set(exclude_nodes)
    for node in act.dynamic_nodes:
        op = node.op_type
        if op not in WHISPER_OPS:
            skipped[node.name] = f"{op} stays float"
            continue
        if node.name in excluded:
            skipped[node.name] = "left in float (user choice)"
            continue
        found = weighted_inputs(node, inits, weight)
        if found is None:
            skipped[node.name] = "weights are not a constant float tensor"
            continue
        w, axis, acts = found
        if w is None:  # no constant weight: an attention MatMul of two activations, or nothing to quantize
            if not all(is_act(t) for t in acts):
                skipped[node.name] = "weights are not a constant float tensor"
                continue
            if reads_softmax(node, act.producer):
                # softmax x V: one per-tensor INT8 scale over attention probabilities rounds the small ones
                # to zero; measured on tiny.en, it alone takes the encoder output's error from 1% to 24%
                skipped[node.name] = "attention MatMul reading Softmax stays float"
                continue
            if not attention:
                skipped[node.name] = "attention MatMul (attention=False)"
                continue
        if not all(is_act(t) for t in acts):
            skipped[node.name] = "an input is not a float activation"
            continue
        targets.append(QuantTarget(node.name, op, tuple(dict.fromkeys(acts)), w, axis))
    return GraphPlan(targets, activation_tensors, [], set(), set(), skipped)


def _key(encoder: Path, opts: WhisperCalibrationOptions, used: list[str]) -> str:
    from edgert._version import __version__

    h = hashlib.sha256()
    with open(encoder, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    fields = {"method": opts.method, "percentile": opts.percentile, "num": opts.num, "seed": opts.seed,
              "attention": opts.attention, "decoder": opts.decoder, "exclude": list(opts.exclude_nodes),
              "clips": used, "edgert": __version__}
    h.update(json.dumps(fields, sort_keys=True).encode())
    return h.hexdigest()[:24]


def _method_name(opts: WhisperCalibrationOptions) -> str:
    return f"percentile {opts.percentile:g}" if opts.method == "percentile" else opts.method


def _check(reference_dir: Path, quantized_dir: Path, clips: list[tuple[Path, np.ndarray]],
           threads: int) -> dict[str, Any]:
    """INT8 against FP32 on ``clips``: WER of INT8 transcripts against FP32 ones, encoder output error."""
    from edgert.backends.onnxruntime import load_ort_session
    from edgert.speech.asr import MAX_TOKENS, Transcriber
    from edgert.speech.features import N_SAMPLES, WhisperFeatures
    from edgert.speech.wer import normalize_text, wer, word_errors

    texts: dict[str, list[str]] = {"fp32": [], "int8": []}
    longest = 0
    enc: dict[str, list[np.ndarray]] = {"fp32": [], "int8": []}
    for name, folder in (("fp32", reference_dir), ("int8", quantized_dir)):
        sess = load_ort_session(folder / "encoder.onnx", ["CPUExecutionProvider"], threads)
        mel = sess.get_inputs()[0]
        features = WhisperFeatures(mel.shape[1] if isinstance(mel.shape[1], int) else 80)
        for _, audio in clips:
            enc[name].append(np.asarray(sess.run(None, {mel.name: features(audio[:N_SAMPLES])})[0], np.float64))
        del sess
        # INT8 gone wrong repeats a word until max_tokens: twice FP32's longest transcript is enough to see it
        limit = MAX_TOKENS if name == "fp32" else min(MAX_TOKENS, 2 * longest + 8)
        with Transcriber(folder, backend="onnxruntime", threads=threads, max_tokens=limit) as asr:
            results = [asr.transcribe(audio) for _, audio in clips]
        texts[name] = [r.text for r in results]
        longest = max([len(r.tokens) for r in results] + [longest])
    nmse = [float(np.mean((b - a) ** 2) / max(float(np.mean(a**2)), 1e-12)) for a, b in zip(enc["fp32"], enc["int8"])]
    rows = [{"clip": str(p), "fp32": f, "int8": q, "errors": word_errors(normalize_text(f), normalize_text(q))}
            for (p, _), f, q in zip(clips, texts["fp32"], texts["int8"])]
    return {"clips": len(clips), "wer_vs_fp32": round(wer(texts["fp32"], texts["int8"]), 4),
            "encoder_out_nmse": round(float(np.mean(nmse)), 6), "transcripts": rows,
            "note": "calibration clips, INT8 against FP32 transcripts: a sanity check, not a WER against references"}


def _calibrate_decoder(src: Path, audio: str | Path, dst: Path, opts: WhisperCalibrationOptions,
                       meta: dict[str, str]) -> dict[str, Any]:
    """The decoder in Q/DQ INT8, same placement as the encoder, written to ``dst``; returns its summary.

    Its calibration input is what it reads when transcribing: FP32's own greedy transcript of each clip
    (the first 30 s) after the start tokens, with the FP32 encoder's output. The decoder is causal, so one
    run over the whole token sequence sees every step's activations. It has two inputs, which
    :class:`~edgert.calib.collect.ActivationCollector` does not feed, so the loop is here; it streams into
    the same histograms (memory: one clip's exposed activations, a few MB at these lengths).
    """
    from edgert.backends.onnxruntime import cpu_session, load_ort_session
    from edgert.calib.histograms import TensorHistogram
    from edgert.speech.asr import START_TOKENS, Transcriber
    from edgert.speech.calibration import CalibrationClips
    from edgert.speech.features import N_SAMPLES, WhisperFeatures
    from edgert.speech.precision import fold_weight_casts, load_onnx, restore_weight_casts, save_onnx

    dec_path = src / "decoder.onnx"
    original = load_onnx(dec_path)
    prepared = prepare_model(fold_weight_casts(original)[0])
    plan = plan_whisper(prepared, opts.attention, opts.exclude_nodes)
    inputs = sorted(i.name for i in prepared.graph.input if i.name not in {x.name for x in prepared.graph.initializer})
    if inputs != ["encoder_out", "tokens"] or not plan.targets:
        raise CalibrationError(f"{dec_path}: not a Whisper decoder without KV cache (inputs {', '.join(inputs)})")
    tensors = plan.quantized_tensors  # encoder_out (the cross-attention K/V input) and activations
    exposed = onnx.ModelProto()
    exposed.CopyFrom(prepared)
    outputs = {o.name for o in exposed.graph.output}
    exposed.graph.output.extend(onnx.helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
                                for t in tensors if t not in outputs and t != "encoder_out")
    session = cpu_session(exposed, opts.threads, spin_wait=True, what="calibrating the Whisper decoder")
    del exposed
    encoder = load_ort_session(src / "encoder.onnx", ["CPUExecutionProvider"], opts.threads)
    mel = encoder.get_inputs()[0]
    features = WhisperFeatures(mel.shape[1] if isinstance(mel.shape[1], int) else 80)
    histograms = {t: TensorHistogram(t) for t in tensors}
    clips = tokens = 0
    fetch = [t for t in tensors if t != "encoder_out"]
    with Transcriber(src, backend="onnxruntime", threads=opts.threads) as asr:
        for _, clip in CalibrationClips(audio, num=opts.num, seed=opts.seed):
            window = clip[:N_SAMPLES]
            encoder_out = encoder.run(None, {mel.name: features(window)})[0]
            sequence = np.array([[*START_TOKENS, *asr.transcribe(window).tokens]], np.int64)
            if "encoder_out" in histograms:
                histograms["encoder_out"].update(encoder_out)
            for name, value in zip(fetch, session.run(fetch, {"tokens": sequence, "encoder_out": encoder_out})):
                histograms[name].update(value)
            clips += 1
            tokens += sequence.shape[1]
    del session, encoder
    amax = {n: h.result(opts.method, opts.percentile).amax for n, h in histograms.items()}
    qdq = write_qdq(prepared, plan, amax, metadata=meta)
    restore_weight_casts(qdq, original)
    save_onnx(qdq, dst / dec_path.name)
    return {"quantized_layers": len(plan.targets), "qdq_tensors": len(tensors), "clips": clips, "tokens": tokens,
            "float_layers": {n: why for n, why in plan.skipped.items()
                             if any(x.name == n and x.op_type in WHISPER_OPS for x in prepared.graph.node)}}


def calibrate_whisper(model_dir: str | Path, audio: str | Path, out_dir: str | Path,
                      options: WhisperCalibrationOptions | None = None, progress: bool = True) -> dict[str, Any]:
    """Calibrate the encoder of the Whisper folder ``model_dir`` on the clips in ``audio``; write ``out_dir``."""
    from edgert.speech.calibration import CalibrationClips, whisper_encoder_fill
    from edgert.speech.features import N_FRAMES
    from edgert.speech.precision import (
        check_float32_folder,
        check_output_folder,
        copy_file,
        fold_weight_casts,
        load_onnx,
        restore_weight_casts,
        save_onnx,
    )

    t_start = time.perf_counter()
    opts = options or WhisperCalibrationOptions()
    src, dst = Path(model_dir), Path(out_dir)
    enc_path, dec_path, tok_path = check_float32_folder(src, "INT8 calibration")
    check_output_folder(src, dst)
    clips = CalibrationClips(audio, num=opts.num, seed=opts.seed)

    fp32, folded = fold_weight_casts(load_onnx(enc_path))
    prepared = prepare_model(fp32)
    del fp32
    plan = plan_whisper(prepared, opts.attention, opts.exclude_nodes)
    if not plan.targets:
        raise CalibrationError(f"{enc_path}: no Conv/Gemm/MatMul with constant weights: not a Whisper encoder")
    tensors = plan.quantized_tensors
    collector = ActivationCollector(prepared, tensors, budget_mb=opts.budget_mb, threads=opts.threads)
    mel = next(i for i in prepared.graph.input if i.name == collector.input_name)
    dims = [d.dim_value for d in mel.type.tensor_type.shape.dim]
    n_mels = dims[1] if len(dims) == 3 and dims[1] > 0 else 80
    buffer = np.zeros((1, n_mels, N_FRAMES), np.float32)

    t0 = time.perf_counter()
    histograms = collector.run(clips, whisper_encoder_fill, buffer, progress=progress, total=len(clips))
    collector.close()
    t_collect = time.perf_counter() - t0
    if not clips.used:
        first = next(iter(clips.skipped.values()), "")
        raise CalibrationError(f"{audio}: none of its {len(clips.files)} audio file(s) could be read ({first})")

    t0 = time.perf_counter()
    ranges: dict[str, TensorRange] = {n: h.result(opts.method, opts.percentile) for n, h in histograms.items()}
    t_ranges = time.perf_counter() - t0
    bad = sorted(n for n, r in ranges.items() if r.nonfinite)
    if bad:
        raise CalibrationError(f"{enc_path}: non-finite activations in {', '.join(bad[:3])} on the calibration clips")
    used = [str(p) for p in clips.used]
    key = _key(enc_path, opts, used)
    meta = {"edgert.calibration": json.dumps({"key": key, "method": _method_name(opts), "clips": len(used)})}
    op_of = {n.name: n.op_type for n in prepared.graph.node}
    float_ops = collections.Counter(op_of[n] for n in plan.skipped)
    qdq = write_qdq(prepared, plan, {n: r.amax for n, r in ranges.items()}, metadata=meta)
    del prepared
    restore_weight_casts(qdq, load_onnx(enc_path))
    save_onnx(qdq, dst / enc_path.name)
    del qdq
    decoder: dict[str, Any] | None = None
    t_decoder = 0.0
    if opts.decoder:
        t0 = time.perf_counter()
        decoder = _calibrate_decoder(src, audio, dst, opts, meta)
        t_decoder = time.perf_counter() - t0
    else:
        copy_file(dec_path, dst / dec_path.name)
    copy_file(tok_path, dst / tok_path.name)

    accuracy: dict[str, Any] | None = None
    t_check = 0.0
    if opts.check:
        t0 = time.perf_counter()
        chosen = list(itertools.islice(CalibrationClips(audio, num=opts.num, seed=opts.seed), max(opts.check_clips, 0)))
        accuracy = _check(src, dst, chosen, opts.threads) if chosen else None
        t_check = time.perf_counter() - t0


    report_path = dst / REPORT_NAME
    report: dict[str, Any] = {
        "key": key, "model": str(src), "output": str(dst), "method": _method_name(opts), "seed": opts.seed,
        "clips": {"folder": str(audio), "asked": opts.num, "used": len(used), "skipped": len(clips.skipped),
                  "used_files": used, "skipped_files": dict(clips.skipped)},
        "summary": {
            "quantized_layers": len(plan.targets), "qdq_tensors": len(tensors),
            "attention_int8": opts.attention, "weight_casts_folded": folded,
            "float_layers": len(plan.skipped), "float_ops": dict(sorted(float_ops.items())),
        },
        "float_layers": {n: why for n, why in plan.skipped.items() if op_of[n] in WHISPER_OPS},
        "decoder": decoder,
        "accuracy": accuracy,
        "timing_s": {"collect": round(t_collect, 2), "ranges": round(t_ranges, 2), "decoder": round(t_decoder, 2),
                     "check": round(t_check, 2),
                     "total": round(time.perf_counter() - t_start, 2)},
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "files": {"encoder": str(dst / enc_path.name), "decoder": str(dst / dec_path.name),
                  "tokenizer": str(dst / tok_path.name), "report": str(report_path)},
        "tensors": tensor_rows(ranges, tensors, [], set(), set()),
    }
    write_report(report_path, report)
    report["table"] = format_whisper_table(report)
    return report


def format_whisper_table(report: dict[str, Any]) -> str:
    s, c, t = report["summary"], report["clips"], report["timing_s"]
    lines = [
        f"model        {report['model']}  ->  {report['output']}",
        f"method       {report['method']}  clips {c['used']} (skipped {c['skipped']})  seed {report['seed']}",
        f"quantized    encoder: {s['quantized_layers']} layers INT8 (Conv/MatMul inputs, per-channel weights), "
        f"{s['qdq_tensors']} activation Q/DQ pairs; float: "
        + ", ".join(f"{k} {v}" for k, v in s["float_ops"].items()),
    ]
    dec = report.get("decoder")
    lines.append(f"decoder      {dec['quantized_layers']} layers INT8, calibrated on {dec['tokens']} tokens of FP32 "
                 f"transcripts of {dec['clips']} clip(s)" if dec else "decoder      copied (float)")
    acc = report.get("accuracy")
    if acc:
        lines.append(f"check        on {acc['clips']} calibration clip(s): WER of INT8 vs FP32 transcripts "
                     f"{acc['wer_vs_fp32'] * 100:.1f}%, encoder output normalized MSE {acc['encoder_out_nmse']:.2e}")
    lines.append(f"time         {t['total']} s (statistics {t['collect']} s, ranges {t['ranges']} s, "
                 f"decoder {t['decoder']} s, check {t['check']} s)")
    lines.append(f"peak memory  {report['peak_rss_mb']} MiB RSS")
    lines.append(f"wrote        {', '.join(report['files'].values())}")
    return "\n".join(lines)
