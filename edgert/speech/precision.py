"""What precision a Whisper folder is in, and FP32 to FP16 for the whole folder.

A Whisper model is a folder (``encoder.onnx``, ``decoder.onnx``, ``tokenizer.json``), so precision
rewrites take and give a folder: ``edgert convert WHISPER_DIR -o OUT_DIR`` converts both ONNX files and
copies the tokenizer, and the result runs as it is (``edgert run --task asr --model OUT_DIR``).

Two things differ from a detector's conversion (:mod:`edgert.rewrite.fp16`):

* there is no decoding tail to keep in float32: the detector rule ("everything after the last Conv")
  would keep the whole transformer of the encoder, whose only Convs are its two input layers, in
  float32. The sensitive ops (Softmax, LayerNormalization and its decomposed form, Erf of the GELU)
  stay float32 wherever they are, as the FP16 rewrite does for every model;
* the asset exports store their weights as float16 and cast them to float32 in the graph.
  :func:`fold_weight_casts` turns each such ``Cast(initializer)`` into a float32 initializer first, so
  the FP16 converter and the INT8 calibrator see ordinary float32 weights (a Cast left in front of a
  MatMul weight hides it from per-channel quantization).
"""

from __future__ import annotations

import copy
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto, numpy_helper

from edgert.atomic_file import atomic_path
from edgert.errors import ModelError
from edgert.onnx_file import read_onnx
from edgert.speech.asr import whisper_files

__all__ = [
    "check_float32_folder",
    "convert_whisper_fp16",
    "float32_outputs",
    "fold_weight_casts",
    "is_whisper_folder",
    "load_onnx",
    "restore_weight_casts",
    "save_onnx",
    "whisper_precision",
]

log = logging.getLogger(__name__)

_FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE, TensorProto.FLOAT)


def is_whisper_folder(path: str | Path) -> bool:
    """A folder that holds an ``encoder.onnx`` or ``decoder.onnx``: what the CLI treats as a Whisper model
    (the other files are then checked by :func:`~edgert.speech.asr.whisper_files`, with a one-line error)."""
    p = Path(path)
    return p.is_dir() and ((p / "encoder.onnx").is_file() or (p / "decoder.onnx").is_file())


def load_onnx(path: Path) -> onnx.ModelProto:
    return read_onnx(path)


def save_onnx(model: onnx.ModelProto, path: Path) -> None:
    """Write ``model`` to ``path`` whole or not at all."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            onnx.save(model, str(tmp))
    except OSError as exc:
        raise ModelError(f"{path}: cannot write the model: {exc}") from exc


def fold_weight_casts(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy where every ``Cast(to=float)`` of a floating-point initializer is that initializer in
    float32 (same output name); returns the model and how many casts were folded."""
    out = copy.deepcopy(model)
    g = out.graph
    inits = {i.name: i for i in g.initializer}
    readers: dict[str, int] = {}
    for node in g.node:
        for t in node.input:
            readers[t] = readers.get(t, 0) + 1
    graph_outputs = {o.name for o in g.output}
    keep: list[onnx.NodeProto] = []
    folded: list[onnx.TensorProto] = []
    for node in g.node:
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        src = inits.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if src is None or to != TensorProto.FLOAT or src.data_type not in _FLOATS or node.output[0] in graph_outputs:
            keep.append(node)
            continue
        folded.append(numpy_helper.from_array(numpy_helper.to_array(src).astype("float32"), node.output[0]))
    if not folded:
        return out, 0
    del g.node[:]
    g.node.extend(keep)
    used = {t for n in keep for t in n.input} | graph_outputs
    kept = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + folded)
    return out, len(folded)


def restore_weight_casts(model: onnx.ModelProto, original: onnx.ModelProto) -> int:
    """Put back the float16 storage :func:`fold_weight_casts` undid, for the weights ``model`` still reads in
    float (those INT8 did not replace: biases, norms, the decoder's token embedding); returns how many.

    Exact: the float32 values came from those float16 ones. Without it the INT8 decoder file would carry
    its 80 MB embedding in float32 for the Gather beside the INT8 copy the output projection reads."""
    inits = {i.name: i for i in original.graph.initializer}
    stored: dict[str, onnx.NodeProto] = {}
    for node in original.graph.node:
        src = inits.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if src is not None and src.data_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
            stored[node.output[0]] = node
    g = model.graph
    names = {i.name for i in g.initializer}
    casts: list[onnx.NodeProto] = []
    kept: list[onnx.TensorProto] = []
    for init in g.initializer:
        cast = stored.get(init.name)
        if cast is None or init.data_type != TensorProto.FLOAT or cast.input[0] in names:
            kept.append(init)
            continue
        kept.append(copy.deepcopy(inits[cast.input[0]]))
        casts.append(copy.deepcopy(cast))
    if casts:
        del g.initializer[:]
        g.initializer.extend(kept)
        nodes = casts + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    return len(casts)


def float32_outputs(model: onnx.ModelProto, reference: onnx.ModelProto) -> int:
    """Give back float32 to the graph outputs the FP16 converter left float16; returns how many.

    onnxconverter-common's ``keep_io_types`` misses an output made by a node it keeps in float32 (the
    encoder ends in LayerNormalization): it casts that float32 result to float16 for the output. The
    Cast is dropped and its float32 input renamed to the output, which is exact."""
    g = model.graph
    wanted = {o.name for o in reference.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    producer = {t: n for n in g.node for t in n.output}
    fixed = 0
    for out in g.output:
        tt = out.type.tensor_type
        if out.name not in wanted or tt.elem_type != TensorProto.FLOAT16:
            continue
        cast = producer.get(out.name)
        to = next((a.i for a in cast.attribute if a.name == "to"), None) if cast is not None else None
        source = producer.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
        if to != TensorProto.FLOAT16 or source is None or cast is None:
            raise ModelError(f"output {out.name} came out of the FP16 conversion as float16")  # converter change
        readers = [n for n in g.node if cast.input[0] in n.input and n is not cast]
        for n in readers:
            n.input[:] = [out.name if t == cast.input[0] else t for t in n.input]
        source.output[:] = [out.name if t == cast.input[0] else t for t in source.output]
        g.node.remove(cast)
        tt.elem_type = TensorProto.FLOAT
        fixed += 1
    return fixed


def whisper_precision(model: onnx.ModelProto) -> str:
    """``"int8"`` (Q/DQ), ``"float16"``, ``"float32"`` or ``"none"`` for one Whisper ONNX file."""
    from edgert.rewrite.fp16 import fp16_state

    state = fp16_state(model)
    return "int8" if state == "qdq" else state


def check_float32_folder(model_dir: str | Path, wanted: str) -> tuple[Path, Path, Path]:
    """The folder's three files, or a one-line ModelError when a file lacks or the encoder is not FP32.

    ``wanted`` names the target (``"INT8"``, ``"FP16"``) for the message."""
    enc, dec, tok = whisper_files(model_dir)
    state = whisper_precision(load_onnx(enc))
    if state == "int8":
        raise ModelError(f"{enc}: already INT8 (the encoder has Q/DQ nodes); {wanted} starts from the FP32 "
                         "Whisper folder")
    if state == "float16":
        raise ModelError(f"{enc}: already FP16 (its layers compute in float16); {wanted} starts from the FP32 "
                         "Whisper folder")
    if state == "none":
        raise ModelError(f"{enc}: no float32 layer: not a Whisper encoder to convert")
    return enc, dec, tok


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return b.exists() and a.resolve() == b.resolve()
    except OSError:
        return False


def check_output_folder(model_dir: Path, out_dir: Path) -> None:
    if _same_folder(model_dir, out_dir):
        raise ModelError(f"{out_dir}: the output folder is the model's own folder; give another -o")
    if out_dir.exists() and not out_dir.is_dir():
        raise ModelError(f"{out_dir}: exists and is not a folder; a Whisper model is written as a folder")


def copy_file(src: Path, dst: Path) -> None:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)
    except OSError as exc:
        raise ModelError(f"{dst}: cannot copy {src.name}: {exc}") from exc


def convert_whisper_fp16(model_dir: str | Path, out_dir: str | Path, check: bool = True) -> dict[str, Any]:
    """``out_dir`` = ``model_dir`` with encoder and decoder in FP16 (float32 inputs and outputs) and the
    tokenizer copied; returns a summary per file (nodes, casts, bytes; with ``check``, the largest output
    difference on one random input, ONNX Runtime CPU)."""
    from edgert.rewrite.fp16 import converter_version, output_agreement, to_fp16

    src, dst = Path(model_dir), Path(out_dir)
    enc, dec, tok = check_float32_folder(src, "FP16")
    check_output_folder(src, dst)
    dec_model = load_onnx(dec)
    if whisper_precision(dec_model) in ("int8", "float16"):
        raise ModelError(f"{dec}: already {whisper_precision(dec_model).upper()}; FP16 starts from the FP32 "
                         "Whisper folder")
    result: dict[str, Any] = {"model": str(src), "output": str(dst),
                              "converter": f"onnxconverter-common {converter_version()}", "files": {}}
    for path, model in ((enc, load_onnx(enc)), (dec, dec_model)):
        t0 = time.perf_counter()
        folded, casts = fold_weight_casts(model)
        # keep_tail=False: the detector tail rule would keep the encoder's whole transformer in float32
        fp16 = to_fp16(folded, path.name, keep_tail=False)
        float32_outputs(fp16.model, folded)
        try:
            onnx.checker.check_model(fp16.model)
        except onnx.checker.ValidationError as exc:
            raise ModelError(f"{path.name}: the FP16 model does not pass onnx's checker: "
                             f"{' '.join(str(exc).split())}") from exc
        target = dst / path.name
        save_onnx(fp16.model, target)
        entry: dict[str, Any] = {"output": str(target), **fp16.summary(), "weight_casts_folded": casts,
                                 "bytes": [path.stat().st_size, target.stat().st_size],
                                 "seconds": round(time.perf_counter() - t0, 2)}
        if check and path == enc:
            # the decoder takes int64 tokens: output_agreement draws float inputs only
            entry["check_max_rel_error"] = output_agreement(path, target)
        result["files"][path.name] = entry
        del folded, fp16
    copy_file(tok, dst / tok.name)
    result["files"][tok.name] = {"output": str(dst / tok.name), "copied": True}
    return result
