#!/usr/bin/env python3
"""CI: every user extra of pyproject.toml resolves on each Jetson row, and none brings a second OpenCV.

For each row (Python 3.8 / 3.10 / 3.12 on aarch64 with the row's glibc, each with and without ``numpy<2``;
JetPack's OpenCV and TensorRT bindings are built against numpy 1.x) and each extra, runs

    pip install --dry-run --ignore-installed --report R --only-binary=:all: \\
        --python-version X --implementation cp --platform manylinux_2_17..2_G_aarch64 <base + extra> [numpy<2]

and fails (exit 1, one line per failure) when a resolve fails, when an extra other than ``[opencv]`` brings
any OpenCV wheel, when anything brings ``opencv-python`` / ``opencv-contrib-python`` (the GUI wheels that
shadow JetPack's GStreamer build), or when numpy 2 lands on a ``numpy<2`` row. The requirements are read
from pyproject.toml (no build of edgert itself; an extra's ``edgert[a,b]`` line is expanded to those extras).
``test`` and ``dev`` are CI's extras, not a board's: they are resolved on the desktop rows (where CI runs),
where they may bring the headless OpenCV (they include ``[opencv]``) but never ``opencv-python``: a test venv
with both has two packages owning ``cv2/``, and removing either breaks the other.

What cannot be checked this way, and why: ``pycuda`` (``[gpu]``) ships no wheels (it is built on the board
against CUDA: jetson/install.sh), so ``[gpu]`` is resolved without it; ``[rtx]`` is for desktop RTX GPUs,
so it is resolved on x86_64 rows, without ``tensorrt-rtx-cu13`` (on PyPI a source package that fetches
NVIDIA's wheels at install time). Resolves are network-bound and slow (a minute or two each on CI's two
cores), so by default each row resolves twice: every extra but ``[opencv]`` together (where any OpenCV
at all is a failure) and ``[opencv]`` alone; ``--per-extra`` resolves each extra alone (50 resolves, to
find which extra brings a package). They run in parallel (``--jobs``); a failed one is retried once.

    python scripts/check_install_matrix.py --jobs 6 --out docs/results/install_matrix.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]

#: Extras that are CI's own (test tools, linters): resolved on the desktop rows only, OpenCV headless allowed.
CI_EXTRAS = ("test", "dev")
#: Requirements no row can resolve as wheels, left out of their extra (the docstring says why).
NO_WHEELS = ("pycuda", "tensorrt-rtx-cu13")
#: Extras for desktop GPUs only: resolved on the x86_64 rows.
DESKTOP_ONLY = ("rtx",)
FORBIDDEN = ("opencv-python", "opencv-contrib-python")


class Row(NamedTuple):
    name: str
    python: str
    machine: str  # aarch64 (Jetson) or x86_64 (desktop)
    glibc: int  # the newest manylinux_2_N the row's OS can load
    numpy1: bool  # numpy<2 forced


ROWS = (
    Row("jp5-py3.8-np1", "3.8", "aarch64", 31, True),  # JetPack 5: Ubuntu 20.04
    Row("py3.8", "3.8", "aarch64", 31, False),
    Row("jp6-py3.10-np1", "3.10", "aarch64", 35, True),  # JetPack 6: Ubuntu 22.04
    Row("py3.10", "3.10", "aarch64", 35, False),
    Row("py3.12-np1", "3.12", "aarch64", 39, True),  # JetPack 7: Ubuntu 24.04
    Row("jp7-py3.12", "3.12", "aarch64", 39, False),
    Row("desktop-py3.10-np1", "3.10", "x86_64", 35, True),
    Row("desktop-py3.12", "3.12", "x86_64", 39, False),
)


def _load_pyproject() -> dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # Python < 3.11
        import tomli as tomllib  # type: ignore[import-not-found,no-redef,unused-ignore]
    with open(ROOT / "pyproject.toml", "rb") as f:
        data: dict[str, Any] = tomllib.load(f)
    return data


def _name(req: str) -> str:
    for i, ch in enumerate(req):
        if not (ch.isalnum() or ch in "-_."):
            return req[:i].lower().replace("_", "-")
    return req.lower().replace("_", "-")


def expand(extras: dict[str, list[str]], extra: str) -> list[str]:
    """An extra's requirements with its ``edgert[a,b]`` lines replaced by those extras' (recursively)."""
    out: list[str] = []
    for req in extras[extra]:
        if _name(req) == "edgert" and "[" in req:
            for inner in req[req.index("[") + 1:req.index("]")].split(","):
                out += [r for r in expand(extras, inner.strip()) if r not in out]
        elif req not in out:
            out.append(req)
    return out


def jobs_for(pyproject: dict[str, Any], per_extra: bool = False) -> list[tuple[Row, str, list[str]]]:
    project = pyproject["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]
    base = list(project["dependencies"])
    out: list[tuple[Row, str, list[str]]] = []
    for row in ROWS:
        groups: dict[str, list[str]] = {}
        for extra in extras:
            desktop = extra in DESKTOP_ONLY or extra in CI_EXTRAS
            if (row.machine == "x86_64") != desktop:
                continue  # the desktop rows are there for [rtx] and CI's extras; the rest is checked on the boards
            wanted = [r for r in expand(extras, extra) if _name(r) not in NO_WHEELS]
            key = extra if per_extra or extra in ("opencv", *CI_EXTRAS) else "+".join(
                e for e in extras if e not in (*CI_EXTRAS, "opencv")
                and (row.machine == "x86_64") == (e in DESKTOP_ONLY))
            groups.setdefault(key, []).extend(wanted)
        for key, wanted in groups.items():
            out.append((row, key, base + wanted + (["numpy<2"] if row.numpy1 else [])))
    return out


def resolve(row: Row, reqs: list[str], timeout: float) -> tuple[list[tuple[str, str]] | None, str]:
    platforms: list[str] = []
    for g in range(row.glibc, 16, -1):
        platforms += ["--platform", f"manylinux_2_{g}_{row.machine}"]
    platforms += ["--platform", f"manylinux2014_{row.machine}"]
    with tempfile.TemporaryDirectory(prefix="edgert-matrix-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--report", str(report), "--only-binary=:all:",
               "--python-version", row.python, "--implementation", "cp", *platforms, *reqs]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"pip timed out after {timeout:.0f} s"
        if proc.returncode != 0:
            errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or proc.stderr.splitlines()
            return None, " | ".join(errors[-2:])
        data = json.loads(report.read_text())
    return [(_name(i["metadata"]["name"]), i["metadata"]["version"]) for i in data["install"]], ""


def check(row: Row, extra: str, reqs: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    installed, error = resolve(row, reqs, timeout)
    if installed is None:
        time.sleep(2.0)  # a flaky index answer: once more before it counts
        installed, error = resolve(row, reqs, timeout)
    result: dict[str, Any] = {"row": row.name, "extra": extra, "seconds": round(time.monotonic() - t0, 1)}
    if installed is None:
        result["problems"] = [f"does not resolve: {error}"]
        return result
    versions = dict(installed)
    result["numpy"] = versions.get("numpy", "")
    problems = [f"brings {n} {versions[n]}" for n in FORBIDDEN if n in versions]
    cv = sorted(n for n in versions if n.startswith("opencv") and n not in FORBIDDEN)
    if extra not in ("opencv", *CI_EXTRAS) and cv:
        problems.append(f"brings a second OpenCV: {', '.join(cv)}")
    if row.numpy1 and versions.get("numpy", "0").split(".")[0] != "1":
        problems.append(f"brings numpy {versions.get('numpy')} on a numpy<2 row")
    result["problems"] = problems
    result["packages"] = len(installed)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=6, help="resolves at once (they wait on the network)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for one resolve")
    ap.add_argument("--per-extra", action="store_true", help="resolve each extra alone (slower; says which one)")
    ap.add_argument("--out", default="", help="write the results as JSON")
    args = ap.parse_args(argv)
    jobs = jobs_for(_load_pyproject(), args.per_extra)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda j: check(j[0], j[1], j[2], args.timeout), jobs))
    failed = [r for r in results if r["problems"]]
    for r in results:
        status = "FAIL " + "; ".join(r["problems"]) if r["problems"] else f"ok numpy {r['numpy']}"
        print(f"{r['row']:<20} [{r['extra']}] {status} ({r['seconds']} s)")
    print(f"install matrix: {len(results) - len(failed)} of {len(results)} resolves clean "
          f"({time.monotonic() - t0:.0f} s)")
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": [r._asdict() for r in ROWS], "results": results},
                                             indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
