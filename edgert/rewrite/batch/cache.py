"""The checked rewrite cached by the source's sha256, beside a JSON record (or the reason it cannot be done)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from edgert.atomic_file import replace_file, sha256_file
from edgert.errors import ModelError
from edgert.rewrite.batch.apply import rewrite_batch
from edgert.rewrite.batch.check import check_batch_rewrite
from edgert.rewrite.batch.model import BatchRewriteError, has_dynamic_batch, load_model

__all__ = ["batch_cache_dir", "batched_model_path"]

log = logging.getLogger(__name__)


def batch_cache_dir() -> Path:
    """``$EDGERT_CACHE_DIR/batch`` (or ``$XDG_CACHE_HOME/edgert/batch``, ``~/.cache/edgert/batch``).

    The same root as the engine and timing caches (edgert.builder.timing_cache), read here without
    importing the builder.
    """
    env = os.environ.get("EDGERT_CACHE_DIR")
    if env:
        return Path(env) / "batch"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgert" / "batch"


# Part of the cache key with the source's sha256: bump it when the rewrite or its check changes what it decides,
# so a refusal an older check recorded is decided again.
_RECORD_VERSION = 3


def batched_model_path(model_path: str | Path, cache_dir: str | Path | None = None,
                       check: Sequence[int] = (1, 2)) -> Path:
    """A model file with a dynamic batch for ``model_path``: itself when it has one already, else the
    checked rewrite, cached by the source's sha256 (``<stem>-<sha12>.batch.onnx`` and a ``.json`` record).

    A model that cannot be rewritten is cached too (the record holds the reason), so a pipeline pays for
    the analysis once; both cases raise :class:`BatchRewriteError` with the same one-line message.
    """
    src = Path(model_path)
    if not src.is_file():
        raise ModelError(f"{src}: model file not found")
    sha = sha256_file(src)
    root = Path(cache_dir) if cache_dir is not None else batch_cache_dir()
    out = root / f"{src.stem}-{sha[:12]}.batch.onnx"
    rec_path = out.with_suffix(".json")
    try:
        rec = json.loads(rec_path.read_text())
    except (OSError, ValueError):
        rec = None
    if isinstance(rec, dict) and rec.get("version") == _RECORD_VERSION and rec.get("source_sha256") == sha:
        if rec.get("error"):
            raise BatchRewriteError(str(rec["error"]))
        if rec.get("already_dynamic"):
            return src
        if out.is_file() and rec.get("sha256") and rec["sha256"] == sha256_file(out):
            return out
    proto, label = load_model(src)
    if has_dynamic_batch(proto):
        replace_file(rec_path, (json.dumps({"version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
                                             "already_dynamic": True}, indent=2) + "\n").encode())
        return src
    try:
        res = rewrite_batch(proto, label)
        checked = check_batch_rewrite(proto, res.model, check, label=label) if check else []
    except BatchRewriteError as exc:
        msg = str(exc)
        replace_file(rec_path, (json.dumps({"version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
                                             "error": msg}, indent=2) + "\n").encode())
        raise

    data = res.model.SerializeToString()
    replace_file(out, data)
    replace_file(rec_path, (json.dumps({
        "version": _RECORD_VERSION, "source": str(src), "source_sha256": sha,
        "sha256": hashlib.sha256(data).hexdigest(), "changes": list(res.changes), "check": checked,
    }, indent=2) + "\n").encode())
    log.info("%s: batch made dynamic (%d changes), checked at batch %s: %s", label, len(res.changes),
             ",".join(str(b) for b in check), out)
    return out
