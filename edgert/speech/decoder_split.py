"""Hoist the encoder-only part out of a Whisper decoder exported without a KV cache.

Such a decoder recomputes the cross-attention keys and values from ``encoder_out`` (1500 frames x 384
for tiny) at every decoding step, although they depend only on the audio: in tiny.en that is 1.8 GMAC
of a step's work. :func:`split_decoder` cuts the graph in two with no change to the arithmetic:

* ``cross``: ``encoder_out`` -> the tensors that depend on it alone (per layer, the K/V projections),
  run once per 30 s window;
* ``step``: ``tokens`` + those tensors -> ``logits``, run once per token.

The cut is found from the graph (which nodes depend on which input), not from node names, so it fits
other Whisper sizes and exporters; when there is nothing to hoist, None is returned and the decoder runs
whole.

:func:`add_last_logits` makes the per-token part project only the last positions onto the vocabulary.
Without a KV cache the decoder projects every position each step (in tiny.en 384 x 51864 multiply-adds a
position, more than the rest of the step), while the search reads only the last one.
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper, numpy_helper

__all__ = ["LAST_LOGITS", "TAIL", "add_last_logits", "split_decoder"]

LAST_LOGITS = "edgert_last_logits"
TAIL = "edgert_tail"  # -k: the positions n-k .. n-1 are projected
_INT64_MAX = 2**63 - 1

log = logging.getLogger(__name__)


def _backward(graph: onnx.GraphProto, outputs: list[str], stop: set[str]) -> list[onnx.NodeProto]:
    """Nodes needed to compute ``outputs``, not looking past ``stop`` tensors, in graph order."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output}
    keep: set[int] = set()
    todo = [t for t in outputs if t not in stop]
    while todo:
        name = todo.pop()
        i = producer.get(name)
        if i is None or i in keep:
            continue
        keep.add(i)
        todo += [t for t in graph.node[i].input if t and t not in stop]
    return [graph.node[i] for i in sorted(keep)]


def _model(source: onnx.ModelProto, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], name: str) -> onnx.ModelProto:
    used = {t for node in nodes for t in node.input}
    inits = [init for init in source.graph.initializer if init.name in used]
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=list(source.opset_import))
    model.ir_version = source.ir_version
    return model


def _constant(graph: onnx.GraphProto, name: str) -> onnx.TensorProto | None:
    """The value of an initializer or a Constant node's output, or None."""
    for init in graph.initializer:
        if init.name == name:
            found: onnx.TensorProto = init
            return found
    for node in graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            value: onnx.TensorProto | None = next((a.t for a in node.attribute if a.name == "value"), None)
            return value
    return None


def _is_zero_index(graph: onnx.GraphProto, name: str) -> bool:
    value = _constant(graph, name)
    return value is not None and value.data_type == onnx.TensorProto.INT64 and \
        [int(v) for v in numpy_helper.to_array(value).ravel()] == [0]


def split_decoder(model: onnx.ModelProto, tokens: str = "tokens",
                  encoder_out: str = "encoder_out") -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]] | None:
    """(cross model, step model, names of the hoisted tensors), or None when nothing can be hoisted.

    Exporters shape the cross-attention keys and values with the batch size read from the tokens' side
    (``Shape(q)[0]``), which would keep their Reshape and Transpose in the per-token part (in tiny.en
    about a fifth of a step). A batch size is fixed for a window, so a tensor computed from the audio and
    batch sizes alone is hoisted too: the cross part computes it for one sequence (the batch size 1, as
    ``encoder_out`` has) and the caller repeats it along axis 0 for a batch, as for the other hoisted tensors.
    """
    graph = model.graph
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in graph.node for a in n.attribute):
        return None  # control flow: keep it simple and run the graph whole
    consts = {i.name for i in graph.initializer} | {n.output[0] for n in graph.node if n.op_type == "Constant"} | {""}
    on_tokens, on_audio = {tokens}, {encoder_out}
    shapes: set[str] = set()  # Shape() of a token tensor
    batch: set[str] = set()  # computed from batch sizes (Shape(...)[0]) and constants alone
    roots: dict[str, onnx.NodeProto] = {}  # the Gather(Shape(...), 0) that read a batch size
    for node in graph.node:  # ONNX graphs are stored in topological order
        ins = list(node.input)
        if all(t in consts for t in ins):  # weights (a Cast of FP16 initializers, say)
            consts.update(node.output)
        elif node.op_type == "Shape" and ins[0] in on_tokens:
            shapes.update(node.output)
            on_tokens.update(node.output)
        elif node.op_type == "Gather" and ins[0] in shapes and len(ins) > 1 and _is_zero_index(graph, ins[1]):
            batch.update(node.output)
            roots[node.output[0]] = node
        elif any(t in on_tokens for t in ins):
            on_tokens.update(node.output)
        elif any(t in on_audio for t in ins) and all(t in on_audio or t in batch or t in consts for t in ins):
            on_audio.update(node.output)
        elif ins and any(t in batch for t in ins) and all(t in batch or t in consts for t in ins):
            batch.update(node.output)
    on_audio.discard(encoder_out)
    hoisted: list[str] = []
    for node in graph.node:
        if node.output and node.output[0] in on_tokens:
            hoisted += [t for t in node.input if t in on_audio and t not in hoisted]
    if not hoisted:
        return None
    elem = next((i.type.tensor_type.elem_type for i in graph.input if i.name == encoder_out), None)
    audio_nodes = _backward(graph, hoisted, set(roots))
    if elem is None or any(n.op_type == "Cast" for n in audio_nodes if n.output[0] in on_audio):
        return None  # the hoisted tensors' type would need shape inference; not worth it
    used = {t for n in audio_nodes for t in n.input}
    ones = [helper.make_node("Constant", [], [name], name=f"edgert_batch_one/{name}",
                             value=helper.make_tensor(name, onnx.TensorProto.INT64, list(
                                 numpy_helper.to_array(_constant(graph, root.input[1])).shape), [1]))  # type: ignore[arg-type]
            for name, root in roots.items() if name in used]
    audio_in = [i for i in graph.input if i.name == encoder_out]
    token_in = [i for i in graph.input if i.name == tokens]
    hoisted_vi = [helper.make_tensor_value_info(t, elem, None) for t in hoisted]
    cross = _model(model, ones + audio_nodes, audio_in, hoisted_vi, "whisper_cross_kv")
    step_nodes = _backward(graph, [o.name for o in graph.output], set(hoisted) | {tokens})
    step = _model(model, step_nodes, token_in + hoisted_vi, list(graph.output), "whisper_decoder_step")
    log.debug("decoder split: %d nodes run once per window, %d per token", len(audio_nodes), len(step_nodes))
    return cross, step, hoisted


def add_last_logits(model: onnx.ModelProto) -> str | None:
    """Make the graph's only output :data:`LAST_LOGITS`: the vocabulary projection of the last k positions.

    k is a new input, :data:`TAIL` (int64 [1], holding -k): 1 for a search step, 2 for the start tokens (the
    no-speech probability is read at <|startoftranscript|>, one before the last), n for every position.
    The graph's first output must come from a MatMul or Gemm (the projection), possibly through Reshapes,
    whose data input is [batch, n, d] itself or a Reshape of it: the branch slices positions n-k.. there and
    repeats the nodes after it ([batch * k, vocab] or [batch, k, vocab] out). The full output is removed, and
    what only it needed: ONNX Runtime runs every node of a graph whatever outputs are asked for, so the
    projection of every position (in tiny.en 384 x 51864 multiply-adds each, the whole embedding read from
    memory) would still run at every step beside the branch. The caller checks k = 1 against k = n before
    trusting it. Returns the output's name, or None (the graph unchanged) when it does not have that shape.
    """
    graph = model.graph
    if not graph.output:
        return None
    producer = {out: node for node in graph.node for out in node.output}
    node = producer.get(graph.output[0].name)
    while node is not None and node.op_type == "Reshape":
        node = producer.get(node.input[0])
    if node is None or node.op_type not in ("MatMul", "Gemm"):
        return None
    chain = [node]
    data = node.input[0]
    # An INT8 decoder (edgert calibrate --decoder-int8) has a Quantize/DequantizeLinear pair (and a Cast in
    # some exports) between the Reshape and the projection: elementwise with per-tensor scales, so they
    # are repeated on the sliced branch too.
    passing: list[onnx.NodeProto] = []
    before = producer.get(data)
    while before is not None and before.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast"):
        passing.insert(0, before)
        before = producer.get(before.input[0])
    if before is not None and before.op_type == "Reshape":
        chain = [before, *passing, node]
        data = before.input[0]
    elif passing:
        chain = [*passing, node]
        data = passing[0].input[0]
    if node.op_type == "Gemm" and chain[0].op_type != "Reshape":
        return None  # a Gemm reads [batch * n, d]: position n-1 cannot be sliced on axis 1 there
    prefix = "edgert_last/"
    graph.initializer.extend([helper.make_tensor(prefix + "ends", onnx.TensorProto.INT64, [1], [_INT64_MAX]),
                              helper.make_tensor(prefix + "axes", onnx.TensorProto.INT64, [1], [1])])
    current = prefix + "sliced"
    new = [helper.make_node("Slice", [data, TAIL, prefix + "ends", prefix + "axes"], [current],
                            name=prefix + "Slice")]
    for i, old in enumerate(chain):
        out = LAST_LOGITS if i == len(chain) - 1 else f"{prefix}{i}"
        copy = helper.make_node(old.op_type, [current, *old.input[1:]], [out], name=f"{prefix}{old.op_type}_{i}")
        copy.attribute.extend(old.attribute)
        new.append(copy)
        current = out
    graph.node.extend(new)
    elem = graph.output[0].type.tensor_type.elem_type
    graph.input.append(helper.make_tensor_value_info(TAIL, onnx.TensorProto.INT64, [1]))
    kept = _backward(graph, [LAST_LOGITS], {i.name for i in graph.input})
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info(LAST_LOGITS, elem, None))
    del graph.node[:]
    graph.node.extend(kept)
    used = {t for n in kept for t in n.input}
    inits = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    return LAST_LOGITS
