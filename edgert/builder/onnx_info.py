"""What the builder needs to know about an ONNX file before TensorRT sees it.

Reading the graph with ``onnx`` (not TensorRT) lets edgert name a failing node's op type on every
TensorRT version, tell whether a model carries explicit Q/DQ quantization, and check ``--shapes``
against the model's real inputs before a long build starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgert.engine.file import file_sha256
from edgert.errors import ConfigError, ModelError

__all__ = [
    "OnnxInfo",
    "ShapeProfile",
    "TensorInfo",
    "file_sha256",
    "inspect_onnx",
    "parse_shapes",
]

@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: dims are ints, or a name / -1 for dynamic axes."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    @property
    def is_dynamic(self) -> bool:
        return any(not isinstance(d, int) or d < 0 for d in self.shape)


@dataclass(frozen=True)
class ShapeProfile:
    """Min / opt / max shapes of one dynamic input (a TensorRT optimization profile entry)."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class OnnxInfo:
    path: Path
    sha256: str
    opset: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    node_names: tuple[str, ...]  # in graph order: TensorRT 8.x parser errors give only the index
    node_ops: tuple[str, ...]
    has_qdq: bool
    metadata: dict[str, str] = field(default_factory=dict)
    qdq_scale_types: tuple[str, ...] = ()  # numpy names of the Q/DQ scales' types ("float32", "float16")

    def node_label(self, index: int) -> tuple[str, str]:
        """(name, op type) of the node at ``index``, or ("?", "?") when out of range."""
        if 0 <= index < len(self.node_names):
            return self.node_names[index] or f"#{index}", self.node_ops[index]
        return "?", "?"

    def input(self, name: str) -> TensorInfo | None:
        return next((t for t in self.inputs if t.name == name), None)


def _tensor(value: Any) -> TensorInfo:
    import onnx

    t = value.type.tensor_type
    dims: list[int | str] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        else:
            dims.append(d.dim_param or -1)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else "undefined"
    return TensorInfo(value.name, tuple(dims), dtype)


def inspect_onnx(path: str | Path) -> OnnxInfo:
    """Read ``path``'s interface without its weights. Damaged files become :class:`ModelError`."""
    import onnx

    from edgert.onnx_file import QDQ_OPS, has_qdq, read_onnx

    p = Path(path)
    model = read_onnx(p, weights=False)
    graph = model.graph
    if not graph.node:
        raise ModelError(f"{p}: the ONNX graph has no nodes (truncated or empty file?)")
    initializers = {i.name for i in graph.initializer}
    types = {i.name: i.data_type for i in graph.initializer}
    scales = {types[n.input[1]] for n in graph.node
              if n.op_type in QDQ_OPS and len(n.input) > 1 and n.input[1] in types}
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return OnnxInfo(
        path=p,
        sha256=file_sha256(p),
        opset=opset,
        inputs=tuple(_tensor(v) for v in graph.input if v.name not in initializers),
        outputs=tuple(_tensor(v) for v in graph.output),
        node_names=tuple(n.name for n in graph.node),
        node_ops=tuple(n.op_type for n in graph.node),
        has_qdq=has_qdq(graph),
        metadata={m.key: m.value for m in model.metadata_props},
        qdq_scale_types=tuple(sorted(onnx.helper.tensor_dtype_to_np_dtype(t).name for t in scales)),
    )


_DIMS = re.compile(r"^\d+(x\d+)*$")


def _dims(text: str, where: str) -> tuple[int, ...]:
    text = text.strip().lower()
    if not _DIMS.match(text):
        raise ConfigError(f"--shapes {where}: {text!r} is not a shape. Note: write dims joined by x, e.g. 1x3x640x640")
    return tuple(int(x) for x in text.split("x"))


def parse_shapes(specs: list[str] | tuple[str, ...]) -> list[ShapeProfile]:
    """``name:1x3x640x640`` (fixed) or ``name:MIN/OPT/MAX`` per entry; entries may also be comma-joined."""
    profiles: list[ShapeProfile] = []
    seen: set[str] = set()
    for spec in specs:
        for entry in (e for e in spec.split(",") if e.strip()):
            name, sep, rest = entry.strip().rpartition(":")
            if not sep or not name:
                raise ConfigError(
                    f"--shapes {entry!r}: expected NAME:MIN/OPT/MAX or NAME:DIMS, e.g. images:1x3x640x640")
            parts = rest.split("/")
            if len(parts) == 1:
                parts = parts * 3
            if len(parts) != 3:
                raise ConfigError(f"--shapes {entry!r}: expected one shape or three (MIN/OPT/MAX), got {len(parts)}")
            lo, opt, hi = (_dims(x, name) for x in parts)
            if not len(lo) == len(opt) == len(hi):
                raise ConfigError(f"--shapes {name}: MIN, OPT and MAX must have the same rank")
            if any(not a <= b <= c for a, b, c in zip(lo, opt, hi)):
                raise ConfigError(f"--shapes {name}: need MIN <= OPT <= MAX in every dimension")
            if name in seen:
                raise ConfigError(f"--shapes: input {name} given twice")
            seen.add(name)
            profiles.append(ShapeProfile(name, lo, opt, hi))
    return profiles


def check_profiles(info: OnnxInfo, profiles: list[ShapeProfile]) -> list[ShapeProfile]:
    """Validate ``profiles`` against the model and fill fixed inputs; dynamic inputs without one fail."""
    by_name = {p.name: p for p in profiles}
    for p in profiles:
        t = info.input(p.name)
        if t is None:
            valid = ", ".join(i.name for i in info.inputs)
            raise ConfigError(f"--shapes {p.name}: not an input of {info.path.name}. Note: inputs are {valid}")
        if len(t.shape) != len(p.opt):
            raise ConfigError(f"--shapes {p.name}: rank {len(p.opt)} given, the model's input has rank {len(t.shape)}")
        for axis, d in enumerate(t.shape):
            if isinstance(d, int) and d >= 0 and not p.min[axis] == p.opt[axis] == p.max[axis] == d:
                raise ConfigError(f"--shapes {p.name}: axis {axis} is fixed at {d} in the model")
    missing = [t for t in info.inputs if t.is_dynamic and t.name not in by_name]
    if missing:
        t = missing[0]
        dims = ", ".join("?" if isinstance(d, int) and d < 0 else str(d) for d in t.shape)
        raise ConfigError(
            f"input {t.name} has dynamic shape [{dims}]: give --shapes {t.name}:MIN/OPT/MAX "
            f"(e.g. {t.name}:{'x'.join('1' if not isinstance(d, int) or d < 0 else str(d) for d in t.shape)})"
        )
    return [by_name[t.name] for t in info.inputs if t.name in by_name]
