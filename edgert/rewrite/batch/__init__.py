"""Make a model's batch dimension dynamic: a graph exported at batch 1 becomes one that takes any batch.

Setting the input's first dim to ``batch`` is not enough: exporters bake the batch into constants (a
Reshape to ``[1, 66, -1]``, a Slice that ends at 1 on axis 0, a shape computed by a constant subgraph).
The rewrite follows the batch axis through the graph instead of guessing:

1. A probe run at batch 1 (ONNX Runtime, every intermediate tensor an output) gives every tensor's shape
   and the value of every constant or shape tensor, folded subgraphs included.
2. The batch axis is tracked from the inputs node by node: where it goes (a Transpose moves it, a
   Squeeze shifts it), and, for shape tensors computed with ``Shape``, which elements equal the batch
   (values are kept as ``a*B + c``). A tensor nothing batched flows into is the same at every batch.
3. Constants that pin the batch are rewritten where ONNX semantics allow it: a Reshape target gets ``0``
   (copy the input's dim) at the batch position when the batch stays at the same index, else ``-1``
   with the former ``-1`` resolved to its size; a Slice that covers the whole batch axis at batch 1
   ends at INT64_MAX; a batch-independent Concat input is expanded to the batch. Anything that mixes
   the batch with another dimension (a Reshape that folds it, a Gather along it, a reduction over it,
   a Squeeze without axes) is refused with one line naming the node and why.

:func:`check_batch_rewrite` then runs both models on ONNX Runtime CPU and checks that row ``i`` of the
rewritten model's output at batch B equals the original's output for input ``i``, so a wrong rewrite is
caught rather than trusted. :func:`batched_model_path` caches the checked result by the source's sha256.

The package holds one idea a module: :mod:`.values` (``a*B + c`` and what a tensor carries), :mod:`.rules`
and :mod:`.shape_rules` (one rule per op, looked up by op type), :mod:`.apply` (probe, analysis, new
graph), :mod:`.check`, :mod:`.cache`; :mod:`.model` reads the model.
"""

from __future__ import annotations

from edgert.rewrite.batch.apply import BatchRewrite, rewrite_batch
from edgert.rewrite.batch.cache import batch_cache_dir, batched_model_path
from edgert.rewrite.batch.check import check_batch_rewrite
from edgert.rewrite.batch.model import BATCH_DIM, BatchRewriteError, has_dynamic_batch

__all__ = [
    "BATCH_DIM",
    "BatchRewrite",
    "BatchRewriteError",
    "batch_cache_dir",
    "batched_model_path",
    "check_batch_rewrite",
    "has_dynamic_batch",
    "rewrite_batch",
]
