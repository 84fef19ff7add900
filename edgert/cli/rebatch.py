"""``edgert rebatch MODEL -o OUT.onnx``: make a batch-1 model's batch dimension dynamic, and check it.

The rewrite (:mod:`edgert.rewrite.batch`) follows the batch through the graph and patches the constants
that pin it at 1; ``--check`` then runs both models on ONNX Runtime CPU at each batch size and requires
every row of the rewritten output to equal the original's output for that row's input. A model whose
graph mixes the batch with another dimension is refused with one line naming the node.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "rebatch", help="make a batch-1 ONNX model's batch dimension dynamic (checked on ONNX Runtime CPU)",
        description="Rewrite MODEL.onnx, exported at batch 1, to take any batch (first dimension 'batch'), "
                    "then check that each row of a batched run equals the original model on that row.")
    p.add_argument("model", help="the batch-1 ONNX model")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="model with a dynamic batch to write")
    p.add_argument("--check", default="1,2,4", metavar="LIST",
                   help="batch sizes to check the rewrite at (default 1,2,4); 'none' skips the check")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def parse_batches(text: str, flag: str = "--check") -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; ``"none"`` or empty -> ``[]``."""
    from edgert.errors import ConfigError

    if text.strip().lower() in ("", "none", "no"):
        return []
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text}: expected batch sizes like 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{flag} {text}: batch sizes must be 1 or more")
    return sizes


def run(args: argparse.Namespace) -> int:
    import onnx

    from edgert.atomic_file import atomic_path
    from edgert.cli.progress import Progress
    from edgert.errors import ConfigError
    from edgert.rewrite.batch import check_batch_rewrite, rewrite_batch

    batches = parse_batches(args.check)
    src, out = Path(args.model), Path(args.output)
    if out.exists() and src.exists() and out.resolve() == src.resolve():
        raise ConfigError(f"-o {out}: that is the source model; write the rewrite to another file")
    with Progress(f"rebatch {src.name}", 3 if batches else 2, unit="step", quiet=args.json) as progress:
        progress.step("making the batch dynamic")
        res = rewrite_batch(src)
        if batches and not res.already_dynamic:
            progress.step(f"checking batches {','.join(str(b) for b in batches)} against the original")
        checked = check_batch_rewrite(src, res.model, batches) if batches and not res.already_dynamic else []
        progress.step(f"writing {out}")
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:  # a killed rebatch leaves the old file (or none), never half a model
            onnx.save(res.model, str(tmp))
    result = {"model": str(src), "output": str(out), "already_dynamic": res.already_dynamic,
              "changes": list(res.changes), "check": checked}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if res.already_dynamic:
        print(f"{src.name}: the batch is already dynamic; wrote an unchanged copy to {out}")
        return 0
    print(f"wrote {out}: batch dimension dynamic, {len(res.changes)} node(s) changed")
    for change in res.changes:
        print(f"  {change}")
    for c in checked:
        on = "" if c["compared"] == "float" else f", compared as {c['compared']}"
        print(f"check batch {c['batch']}: every row matches the original (max relative error "
              f"{c['max_rel_err']:.1e}{on})")
    if not checked:
        print("not checked (--check none)")
    shapes = ",".join(f"{n}:{_dims(1, r)}/{_dims(4, r)}/{_dims(8, r)}" for n, r in _batched_inputs(res.model))
    if shapes:
        print(f"TensorRT engine for batches 1-8: edgert build {out} --shapes {shapes}")
    return 0


def _dims(b: int, rest: list[int]) -> str:
    return "x".join(str(d) for d in (b, *rest))


def _batched_inputs(model: Any) -> list[tuple[str, list[int]]]:
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        dims = list(vi.type.tensor_type.shape.dim)
        if vi.name in inits or not dims or dims[0].HasField("dim_value"):
            continue
        if all(d.HasField("dim_value") for d in dims[1:]):
            out.append((vi.name, [int(d.dim_value) for d in dims[1:]]))
    return out
