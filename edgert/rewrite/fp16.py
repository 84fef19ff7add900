"""FP32 ONNX to FP16 ONNX, with float32 inputs and outputs and the numerically sensitive ops in float32.

The conversion itself is onnxconverter-common's ``convert_float_to_float16`` (the converter ONNX Runtime's
own transformers tools use); this module decides what stays float32 and checks the result:

* graph inputs and outputs stay float32 (``keep_io_types``), so preprocessing, decoders and engines'
  bindings do not change;
* the decoding tail stays float32: every node after the last Conv on the way to the outputs, where a
  Conv or MatMul that reads a Softmax (YOLOv8's DFL: an expectation over 16 box-offset bins) counts as
  decoding. Box coordinates of a 640-pixel input need more than FP16's 11 bits to land within a
  fraction of a pixel after the anchor offsets are added, and a blocked region that reaches the
  outputs costs one Cast per tail entry instead of casts around each small kernel;
* ops whose range or precision FP16 does not hold anywhere in the graph: Softmax, Exp, Log, Pow, Sqrt,
  Reciprocal, the normalisations (LayerNormalization, InstanceNormalization, GroupNormalization,
  LpNormalization, ReduceMean/ReduceSumSquare of a hand-written norm) and the converter's own list
  (Resize, TopK, NonMaxSuppression, Range, ...).

Weights outside ``[-65504, 65504]`` or below FP16's smallest normal are clamped by the converter
(``max_finite_val`` / ``min_positive_val``): a weight needing that is named in the report.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from edgert._lazy import lazy_import
from edgert.atomic_file import atomic_path
from edgert.backends.onnxruntime import cpu_session
from edgert.errors import ModelError
from edgert.onnx_file import has_qdq, read_onnx
from edgert.rewrite.graph import WEIGHTED, activation_graph, name_nodes

__all__ = [
    "FP32_OPS",
    "Fp16Result",
    "convert_file",
    "converter_version",
    "decoding_tail",
    "fp16_state",
    "output_agreement",
    "to_fp16",
]

log = logging.getLogger(__name__)

#: Ops kept in float32 wherever they are (besides the decoding tail and the converter's own list).
FP32_OPS: tuple[str, ...] = (
    "Softmax", "LogSoftmax", "Exp", "Log", "Pow", "Sqrt", "Reciprocal", "Erf",
    "LayerNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization",
    "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp",
)
FP16_MAX = 65504.0
#: Ops of the converter's default block list that ONNX Runtime (CPU and CUDA), TensorRT and TensorRT-RTX
#: all run in FP16: blocking them only puts a pair of casts around each (NanoDet has four Resizes).
FP16_OK_OPS: tuple[str, ...] = ("Resize", "Upsample", "Min", "Max")


@dataclass(frozen=True)
class Fp16Result:
    model: onnx.ModelProto
    float32_nodes: dict[str, str]  # node -> why it stays float32
    casts: int  # Cast nodes the conversion added
    clamped_weights: list[str] = field(default_factory=list)  # initializers beyond FP16's range

    def summary(self) -> dict[str, Any]:
        reasons: dict[str, int] = {}
        for why in self.float32_nodes.values():
            reasons[why] = reasons.get(why, 0) + 1
        fp16 = sum(1 for n in self.model.graph.node if n.op_type != "Cast") - len(self.float32_nodes)
        return {"fp16_nodes": fp16, "float32_nodes": len(self.float32_nodes), "float32_why": reasons,
                "casts_added": self.casts, "clamped_weights": self.clamped_weights}


def converter_version() -> str:
    """The installed onnxconverter-common's version (part of the engine cache key of converted builds)."""
    occ = lazy_import("onnxconverter_common", "FP16 conversion")
    return str(getattr(occ, "__version__", "?"))


def decoding_tail(model: onnx.ModelProto) -> list[str]:
    """Names of the nodes after the last (non-decoding) Conv on the way to the outputs; models without
    convolutions anchor on Gemm/MatMul. Nodes must be named (see :func:`_named`)."""
    return activation_graph(model).tail_nodes


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every node named uniquely (block lists and reports go by node name)."""
    model = copy.deepcopy(model)
    name_nodes(model)
    return model


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx raises InferenceError or plain errors; types then come from the graph alone
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]
             if vi.type.HasField("tensor_type")}
    types.update({i.name: i.data_type for i in g.initializer})
    return types


def fp16_state(model: onnx.ModelProto) -> str:
    """``"float32"``: weighted layers compute in float32 (convertible); ``"float16"``: some already compute
    in float16; ``"qdq"``: explicitly quantized; ``"none"``: no floating-point weighted layer at all.

    Weights stored as float16 and cast to float32 in the graph (the Whisper assets) count as float32:
    the layers compute in float32.
    """
    g = model.graph
    if has_qdq(g):
        return "qdq"
    types = _elem_types(model)
    weighted = [n for n in g.node if n.op_type in WEIGHTED and n.input]
    kinds = {types.get(n.input[0]) for n in weighted}
    if TensorProto.FLOAT16 in kinds:
        return "float16"
    io16 = any(vi.type.tensor_type.elem_type == TensorProto.FLOAT16 for vi in [*g.input, *g.output])
    if io16:
        return "float16"
    if TensorProto.FLOAT in kinds or (not weighted and TensorProto.FLOAT in types.values()):
        return "float32"
    return "none"


def _clamped(model: onnx.ModelProto, skip: Collection[str]) -> list[str]:
    out = []
    for init in model.graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name in skip:
            continue
        a = numpy_helper.to_array(init)
        if a.size and float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) > FP16_MAX:
            out.append(init.name)
    return out


def _initializers_of(model: onnx.ModelProto, nodes: Collection[str]) -> set[str]:
    inits = {i.name for i in model.graph.initializer}
    return {t for n in model.graph.node if n.name in nodes for t in n.input if t in inits}


def _tail_subgraph(model: onnx.ModelProto, tail: Collection[str]) -> tuple[onnx.ModelProto, list[onnx.NodeProto],
                                                                       list[onnx.TensorProto]]:
    """Split ``model`` into a body (everything but ``tail``) and the tail's nodes and float32 initializers.

    The body's outputs become the tensors the tail reads from it, each through an Identity named
    ``X__fp32`` (the converter casts a graph output back to float32 by renaming its producer's output,
    which would leave the body's own consumers of ``X`` reading float32); the tail is rewired to read
    ``X__fp32``. Constant subgraphs (no path from an input) that feed the tail are copied into it,
    and the initializers the tail reads are copied under ``NAME__fp32``, so nothing the tail reads is
    converted. Returns the body, then the tail's nodes and initializers to append after conversion.
    """
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    graph_inputs = {i.name for i in g.input if i.name not in inits}
    producer = {t: n for n in g.node for t in n.output if t}
    tail_nodes = [n for n in g.node if n.name in tail]
    tail_out = {t for n in tail_nodes for t in n.output if t}
    # constant feeders of the tail (Constant nodes, shape arithmetic on initializers)
    const_nodes: dict[str, onnx.NodeProto] = {}
    need_inits: set[str] = set()
    boundary: list[str] = []
    todo = [t for n in tail_nodes for t in n.input if t and t not in tail_out]
    dynamic_cache: dict[str, bool] = {}

    def is_dynamic(t: str) -> bool:
        if t in dynamic_cache:
            return dynamic_cache[t]
        stack, seen, found = [t], set(), False
        while stack and not found:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in graph_inputs:
                found = True
            elif x in producer:
                stack.extend(i for i in producer[x].input if i)
        dynamic_cache[t] = found
        return found

    while todo:
        t = todo.pop()
        if t in inits:
            need_inits.add(t)
        elif t in graph_inputs:
            continue  # the tail reads a float32 graph input directly
        elif is_dynamic(t):
            if t not in boundary:
                boundary.append(t)
        elif t in producer and producer[t].name not in const_nodes:
            const_nodes[producer[t].name] = producer[t]
            todo.extend(i for i in producer[t].input if i)
    rename = {t: f"{t}__fp32" for t in boundary}
    rename.update({t: f"{t}__fp32" for t in need_inits})
    for node in const_nodes.values():
        rename.update({t: f"{t}__fp32" for t in node.output if t})
    ordered_consts = [n for n in g.node if n.name in const_nodes]
    new_tail: list[onnx.NodeProto] = []
    for node in [*ordered_consts, *tail_nodes]:
        copy_ = copy.deepcopy(node)
        if node.name in const_nodes:
            copy_.name = f"{node.name}__fp32"
            copy_.output[:] = [rename.get(t, t) for t in node.output]
        copy_.input[:] = [rename.get(t, t) for t in node.input]
        new_tail.append(copy_)
    tail_inits = []
    for t in sorted(need_inits):
        init = copy.deepcopy(inits[t])
        init.name = rename[t]
        tail_inits.append(init)

    body = copy.deepcopy(model)
    bg = body.graph
    keep = [n for n in bg.node if n.name not in tail]
    del bg.node[:]
    bg.node.extend(keep)
    types = _value_infos(model)
    del bg.output[:]
    for t in boundary:
        bg.node.append(onnx.helper.make_node("Identity", [t], [rename[t]], name=f"{t}__to_fp32"))
        vi = copy.deepcopy(types[t]) if t in types else onnx.helper.make_tensor_value_info(
            rename[t], TensorProto.FLOAT, None)
        vi.name = rename[t]
        bg.output.append(vi)
    # a tail-only initializer stays in the body unused; drop those the body no longer reads
    used = {t for n in bg.node for t in n.input}
    kept = [i for i in bg.initializer if i.name in used]
    del bg.initializer[:]
    bg.initializer.extend(kept)
    return body, new_tail, tail_inits


#: Inputs the ONNX spec types as float32 whatever the data's type: Resize's roi and scales.
_FLOAT_ONLY_INPUTS: dict[str, tuple[int, ...]] = {"Resize": (1, 2)}


def _float_only_inputs(model: onnx.ModelProto) -> None:
    """Give back float32 to the inputs the converter turned to float16 but the spec wants float32."""
    g = model.graph
    inits = {i.name: i for i in g.initializer}
    consts = {n.output[0]: n for n in g.node if n.op_type == "Constant" and n.output}
    for node in g.node:
        for i in _FLOAT_ONLY_INPUTS.get(node.op_type, ()):
            if i >= len(node.input) or not node.input[i]:
                continue
            t = node.input[i]
            src: onnx.TensorProto | None = None
            if t in inits:
                src = inits[t]
            elif t in consts:
                src = next((a.t for a in consts[t].attribute if a.name == "value"), None)
            if src is None or src.data_type != TensorProto.FLOAT16:
                continue
            fixed = numpy_helper.from_array(numpy_helper.to_array(src).astype(np.float32), f"{t}__fp32")
            if fixed.name not in inits:
                g.initializer.append(fixed)
                inits[fixed.name] = fixed
            node.input[i] = fixed.name


def _value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # types then come from the graph alone
        inferred = model
    g = inferred.graph
    return {vi.name: vi for vi in [*g.input, *g.value_info, *g.output]}


def to_fp16(model: onnx.ModelProto, name: str = "model", keep_tail: bool = True,
            fp32_ops: Collection[str] = FP32_OPS, fp32_nodes: Collection[str] = ()) -> Fp16Result:
    """``model`` with its float32 compute in float16 except what the module docstring lists.

    ``name`` is used in error messages (the file name). Raises ModelError for a model that is already
    FP16, already Q/DQ, or has no float layer; BackendUnavailable without onnxconverter-common.
    """
    state = fp16_state(model)
    if state == "float16":
        raise ModelError(f"{name}: already FP16 (its layers compute in float16); nothing to convert")
    if state == "qdq":
        raise ModelError(f"{name}: an INT8 Q/DQ model; convert the FP32 model to FP16 instead")
    if state == "none":
        raise ModelError(f"{name}: no float32 layer to convert")
    float16 = lazy_import("onnxconverter_common.float16", "FP16 conversion")
    named = _named(model)
    why: dict[str, str] = {}
    tail = decoding_tail(named) if keep_tail else []
    why.update(dict.fromkeys(tail, "decoding tail"))
    blocked_ops = (set(fp32_ops) | set(float16.DEFAULT_OP_BLOCK_LIST)) - set(FP16_OK_OPS)
    for node in named.graph.node:
        if node.name not in why and node.op_type in blocked_ops:
            why[node.name] = f"{node.op_type} (float32 op)"
    for n in fp32_nodes:
        why.setdefault(n, "asked")
    tail_set = set(tail)
    clamped = _clamped(named, _initializers_of(named, why))
    if clamped:
        log.warning("%s: %d weight tensor(s) beyond FP16's range are clamped to +-%g: %s", name, len(clamped),
                    FP16_MAX, ", ".join(clamped[:5]))
    casts_before = sum(1 for n in named.graph.node if n.op_type == "Cast")
    body, tail_nodes, tail_inits = _tail_subgraph(named, tail_set) if tail_set else (named, [], [])
    inner_block = sorted(n for n in why if n not in tail_set)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            converted = float16.convert_float_to_float16(
                body, keep_io_types=True, max_finite_val=FP16_MAX, op_block_list=sorted(blocked_ops),
                node_block_list=inner_block, check_fp16_ready=False)  # fp16_state checked
    except (ValueError, RuntimeError, KeyError, onnx.checker.ValidationError) as exc:
        raise ModelError(f"{name}: FP16 conversion failed: {' '.join(str(exc).split())}") from exc
    truncated = sum(1 for w in caught if "truncated" in str(w.message))
    if truncated:
        log.info("%s: %d constant value(s) outside FP16's range were moved to its nearest value", name, truncated)
    if tail_set:
        g = converted.graph
        g.node.extend(tail_nodes)
        g.initializer.extend(tail_inits)
        del g.output[:]
        g.output.extend(copy.deepcopy(list(named.graph.output)))
        del g.value_info[:]  # stale around the seam; consumers infer them again
    _float_only_inputs(converted)
    used = {t for n in converted.graph.node for t in n.input} | {o.name for o in converted.graph.output}
    kept = [i for i in converted.graph.initializer if i.name in used]
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(kept)
    casts = sum(1 for n in converted.graph.node if n.op_type == "Cast") - casts_before
    present = {n.name for n in converted.graph.node}
    return Fp16Result(converted, {n: w for n, w in why.items() if n in present}, casts, clamped)


def convert_file(src: str | Path, dst: str | Path, keep_tail: bool = True,
                 fp32_nodes: Collection[str] = ()) -> dict[str, Any]:
    """Convert the ONNX file ``src`` to FP16 at ``dst``; returns what :meth:`Fp16Result.summary` says."""
    src, dst = Path(src), Path(dst)
    model = read_onnx(src)
    result = to_fp16(model, src.name, keep_tail=keep_tail, fp32_nodes=fp32_nodes)
    try:
        onnx.checker.check_model(result.model)
    except onnx.checker.ValidationError as exc:
        raise ModelError(f"{src.name}: the FP16 model does not pass onnx's checker: {' '.join(str(exc).split())}"
                         ) from exc
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(dst) as tmp:  # removed again when the save fails: no stray .tmp beside the output
            onnx.save(result.model, str(tmp))
    except OSError as exc:
        raise ModelError(f"{dst}: cannot write the FP16 model: {exc}") from exc
    return {"model": str(src), "output": str(dst), "converter": f"onnxconverter-common {converter_version()}",
            **result.summary(), "bytes": [src.stat().st_size, dst.stat().st_size]}


def output_agreement(reference: str | Path, candidate: str | Path, seed: int = 0) -> dict[str, float]:
    """Largest output difference of ``candidate`` against ``reference`` on one random input in [0, 1)
    (ONNX Runtime CPU), relative to each output's largest magnitude. Dynamic dims are taken as 1."""
    # (ORT's log lines off: the converted model's seam leaves unused initializers ORT warns about)
    ref = cpu_session(Path(reference), what="checking the FP16 model")
    cand = cpu_session(Path(candidate), what="checking the FP16 model")
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for i in ref.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]
        if i.type == "tensor(float)":
            feeds[i.name] = rng.random(shape, dtype=np.float32)
        else:
            return {}  # not a float-input model: nothing meaningful to draw
    out: dict[str, float] = {}
    for o, a, b in zip(ref.get_outputs(), ref.run(None, feeds), cand.run(None, feeds)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) or 1.0
        both = np.isfinite(a) & np.isfinite(b)
        out[o.name] = float(np.max(np.abs(a - b)[both], initial=0.0)) / scale
    return out
