"""Make the installed ``tensorrt-stubs`` usable by mypy (run once after ``pip install --no-deps tensorrt-stubs``).

tensorrt-stubs 10.13 ships bare ``tensorrt/`` and ``tensorrt_bindings/`` folders of .pyi files without a
``py.typed`` marker (so mypy ignores them), and its generated ``tensorrt.pyi`` has a few lines that are
not valid Python: parameters named ``in`` (a keyword) and one required parameter after defaulted ones.
This script fixes exactly those, idempotently, and checks that every stub file then parses.
"""

from __future__ import annotations

import ast
import re
import sys
import sysconfig
from pathlib import Path

_KEYWORD_PARAM = re.compile(r"(?<=[(,\s])in(?=: )")


def _fix_defaults(line: str) -> str:
    """Give a required parameter that follows defaulted ones a ``= ...`` default (stub-only semantics)."""
    m = re.match(r"^(\s*def \w+\()(.*)(\) -> .*:)$", line)
    if not m or "=" not in m.group(2):
        return line
    params = [p.strip() for p in m.group(2).split(", ")]
    seen_default = False
    fixed = []
    for p in params:
        if "=" in p:
            seen_default = True
        elif seen_default and not p.startswith("*") and p not in ("/",):
            p = f"{p} = ..."
        fixed.append(p)
    return m.group(1) + ", ".join(fixed) + m.group(3)


def patch(site: Path) -> int:
    roots = [site / "tensorrt", site / "tensorrt_bindings"]
    if not all(r.is_dir() for r in roots):
        print(f"patch_tensorrt_stubs: tensorrt-stubs not found under {site}; nothing to do")
        return 0
    for root in roots:
        (root / "py.typed").touch()
        for stub in root.glob("*.pyi"):
            text = stub.read_text()
            lines = []
            for line in text.splitlines():
                if line.lstrip().startswith("def "):
                    line = _fix_defaults(_KEYWORD_PARAM.sub("in_", line))
                lines.append(line)
            new = "\n".join(lines) + "\n"
            if new != text:
                stub.write_text(new)
                print(f"patch_tensorrt_stubs: fixed {stub}")
            ast.parse(new, filename=str(stub))
    return 0


if __name__ == "__main__":
    sys.exit(patch(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(sysconfig.get_paths()["purelib"])))
