#!/usr/bin/env python3
"""Soak: 4 sources x 2000 frames with tracking, a counting line, JSONL, MP4 and MQTT sinks, then SIGTERM.

Runs the real CLI (``edgert run``) in a subprocess on the sample video looped per source, with a metrics
endpoint; samples the process's RSS (``/proc/PID/status``) against the frames done (``edgert_frames_total``),
and when every source has done its frames sends SIGTERM and times the exit. It reports:

- RSS growth in KB per 1000 frames after warm-up (a least-squares slope over the samples past the first
  quarter of the frames, and over the second half; the issue's bar: < 100), and the curve itself;
- seconds from SIGTERM to exit, against the stop deadline (``EDGERT_STOP_DEADLINE_S``, default 10);
- whether every output is whole: each JSONL line parses, each MP4 opens and its last frame decodes;
- MQTT messages the broker delivered to a subscriber (when mosquitto and paho-mqtt are there).

    nice -n 10 python3 scripts/soak.py --out soak.json [--frames 2000] [--sources 4] [--model M.onnx]

Without ``--model`` it uses NanoDet from the assets when they are there (``--tiny``: a one-box detector made
here, so the figure is the pipeline's own, not the model's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from _bench import assets_dir, machine_info, write_json

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _smaps(pid: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(resident KB, size KB) of each mapping of ``pid``, keyed by (start address, what is mapped: a file,
    ``[heap]``, or ``anon`` for an anonymous one: glibc's arenas and mapped blocks, Python's object arenas,
    codec buffers, thread stacks). The size tells them apart: 8 MiB + 4 KiB is a thread's stack, a 64 MiB-aligned
    start a glibc arena's heap."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    key: tuple[str, str] | None = None
    size = 0
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            start, end = head[0].split("-")
            size = (int(end, 16) - int(start, 16)) // 1024
            key = (start, head[5].strip() if len(head) > 5 else "anon")
        elif key is not None and line.startswith("Rss:"):
            out[key] = (out.get(key, (0, 0))[0] + int(line.split()[1]), size)
    return out


def _smaps_growth(before: dict[tuple[str, str], tuple[int, int]], after: dict[tuple[str, str], tuple[int, int]],
                  top: int = 12) -> dict[str, Any]:
    """Where the resident memory grew between two :func:`_smaps` samples: by what is mapped, and the largest
    single mappings (an anonymous mapping that appeared is a block glibc mapped, or a thread's stack)."""
    by_what: dict[str, int] = {}
    single: list[tuple[int, str, str]] = []
    for key in set(before) | set(after):
        diff = after.get(key, (0, 0))[0] - before.get(key, (0, 0))[0]
        if diff:
            what = key[1] if key[1] in ("[heap]", "anon") or not key[1].startswith("/") else Path(key[1]).name
            by_what[what] = by_what.get(what, 0) + diff
            state = "new" if key not in before else ("gone" if key not in after else "grew")
            size = (after.get(key) or before[key])[1]
            single.append((diff, key[0], f"{key[1]} of {size} KB ({state})"))
    single.sort(key=lambda item: -abs(item[0]))
    return {"kb_total": sum(by_what.values()),
            "kb_by_mapping": dict(sorted(by_what.items(), key=lambda item: -abs(item[1]))[:top]),
            "largest": [{"kb": kb, "start": start, "mapping": what} for kb, start, what in single[:top]]}


def _heaptrack(env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """Record the child's native allocations with heaptrack (Debian's ``heaptrack``): its preload library in
    the child's environment, writing into a FIFO that ``heaptrack_interpret`` reads and gzip stores in ``out``
    (what ``heaptrack CMD`` does, with the child still the soak's own process, so its RSS is the one sampled)."""
    libdir = Path("/usr/lib/heaptrack")
    fifo = out.with_suffix(".fifo")
    os.mkfifo(fifo)
    reader = subprocess.Popen(["sh", "-c", f'"{libdir}/libexec/heaptrack_interpret" < "{fifo}" | gzip -c > "{out}"'])
    env["LD_PRELOAD"] = f"{libdir}/libheaptrack_preload.so"
    env["DUMP_HEAPTRACK_OUTPUT"] = str(fifo)
    return reader


def _frames(metrics: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("edgert_frames_total"):
            return int(float(line.split()[-1]))
    return None


def _slope_kb_per_1000(samples: list[tuple[int, int]]) -> float | None:
    if len(samples) < 3:
        return None
    n = len(samples)
    mx = sum(f for f, _ in samples) / n
    my = sum(r for _, r in samples) / n
    var = sum((f - mx) ** 2 for f, _ in samples)
    if var == 0:
        return None
    return 1000.0 * sum((f - mx) * (r - my) for f, r in samples) / var


def _median_growth_kb_per_1000(samples: list[tuple[int, int]], share: float = 0.1) -> float | None:
    """(median RSS of the last ``share`` of ``samples`` - median of the first ``share``) per 1000 frames: the
    growth between two windows, which the allocator's ups and downs (a trimmed heap, a pool refilled) do not
    swing the way they swing a least-squares slope."""
    k = max(3, int(len(samples) * share))
    if len(samples) < 2 * k:
        return None
    first, last = samples[:k], samples[-k:]
    span = statistics.median(f for f, _ in last) - statistics.median(f for f, _ in first)
    if span <= 0:
        return None
    return 1000.0 * (statistics.median(r for _, r in last) - statistics.median(r for _, r in first)) / span


def _tiny_model(path: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.pipeline.media import tiny_detector

    return tiny_detector(path)


class _Broker:
    def __init__(self, folder: Path) -> None:
        self.port = _free_port()
        conf = folder / "mosquitto.conf"
        conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class _Counter:
    """Counts the messages a subscriber to edgert/# receives."""

    def __init__(self, port: int) -> None:
        import paho.mqtt.client as mqtt

        self.count = 0
        if hasattr(mqtt, "CallbackAPIVersion"):
            self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="edgert-soak-counter")
        else:
            self.client = mqtt.Client(client_id="edgert-soak-counter")
        ready = threading.Event()
        self.client.on_connect = lambda c, *a: c.subscribe("edgert/#", qos=1)
        self.client.on_subscribe = lambda *a: ready.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        ready.wait(10)

    def _on_message(self, *args: Any) -> None:
        self.count += 1

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _whole_outputs(folder: Path, names: list[str]) -> dict[str, Any]:
    import cv2

    out: dict[str, Any] = {}
    for name in names:
        jsonl = folder / f"{name}.jsonl"
        lines = jsonl.read_bytes().split(b"\n") if jsonl.exists() else []
        tail_ok = not lines or lines[-1] == b""
        parsed = 0
        for line in lines:
            if line:
                json.loads(line)
                parsed += 1
        cap = cv2.VideoCapture(str(folder / f"{name}.mp4"))
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
        last_ok = False
        if count > 0:
            cap.set(cv2.CAP_PROP_POS_FRAMES, count - 1)
            last_ok, _ = cap.read()
        cap.release()
        out[name] = {"jsonl_lines": parsed, "jsonl_whole": tail_ok, "mp4_frames": count, "mp4_last_frame": last_ok}
    return out


def _snapshot(proc: subprocess.Popen[str], folder: Path, index: int) -> None:
    """Ask the child for tracemalloc snapshot ``index`` and wait until it is written."""
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + 300
    while not (folder / f"snap-{index}.done").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)


def _growth(folder: Path, top: int = 15) -> dict[str, Any]:
    """The largest growths between the snapshots, grouped by traceback (innermost frame last)."""
    import tracemalloc

    snaps = [tracemalloc.Snapshot.load(str(folder / f"snap-{i}.tm")) for i in range(3)
             if (folder / f"snap-{i}.tm").exists()]
    out: dict[str, Any] = {}
    for label, a, b in (("quarter_to_end", 0, 2), ("half_to_end", 1, 2)):
        if len(snaps) <= b:
            continue
        stats = snaps[b].compare_to(snaps[a], "traceback")
        out[label] = {
            "total_kb": round(sum(s.size_diff for s in stats) / 1024, 1),
            "top": [{"kb": round(s.size_diff / 1024, 1), "count": s.count_diff,
                     "traceback": [f"{f.filename.replace(str(ROOT) + '/', '')}:{f.lineno}" for f in s.traceback]}
                    for s in stats[:top]],
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="soak.json")
    parser.add_argument("--frames", type=int, default=2000, help="frames per source before SIGTERM")
    parser.add_argument("--sources", type=int, default=4)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tiny", action="store_true", help="a one-box detector made here instead of NanoDet")
    parser.add_argument("--unit-env", action="store_true",
                        help="give the run the allocator environment the systemd unit sets (its MALLOC_* line), "
                             "as a service would start it")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="run under tracemalloc, snapshot at 1/4, 1/2 and all of the frames, and report the "
                             "largest growths between them grouped by traceback (slows the run; the slope is then "
                             "not the figure to quote)")
    parser.add_argument("--heaptrack", default=None, metavar="FILE.gz",
                        help="record the run's native allocations with heaptrack into FILE.gz (heaptrack_print "
                             "reads it; slows the run: a diagnosis, not the figure)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="edgert-soak-"))
    video = assets_dir() / "video" / "vtest.avi"
    if not video.exists():
        sys.path.insert(0, str(ROOT))
        from tests.pipeline.media import make_video

        video = make_video(work / "v.avi", frames=300, size=(320, 240))
    nanodet = assets_dir() / "models" / "detection" / "nanodet-m-416-coco-v8layout.onnx"
    model = Path(args.model) if args.model else (nanodet if nanodet.exists() and not args.tiny
                                                 else _tiny_model(work / "tiny.onnx"))
    names = [f"cam{i}" for i in range(args.sources)]
    broker = counter = None
    mqtt_sink: list[str] = []
    try:
        import paho.mqtt.client  # noqa: F401

        broker = _Broker(work)
        counter = _Counter(broker.port)
        mqtt_sink = [f"mqtt://127.0.0.1:{broker.port}/edgert/{{source}}"]
    except Exception as exc:  # no broker or no paho here: the soak runs without the MQTT sink, and says so
        print(f"soak: no MQTT sink ({exc})", file=sys.stderr)
    sinks = [f"jsonl://{work}/{{source}}.jsonl", f"{work}/{{source}}.mp4", *mqtt_sink]
    cfg = work / "soak.yaml"
    cfg.write_text(
        f"model: {{path: '{model}'}}\n"
        "track: {tracker: bytetrack}\n"
        "analytics: {lines: [{name: middle, points: [[0, 0.5], [1, 0.5]]}]}\n"
        "sources:\n" + "".join(f"  - {{uri: '{video}', name: {n}, loop: true}}\n" for n in names)
        + "sinks: [" + ", ".join(f"'{s}'" for s in sinks) + "]\n", encoding="utf-8")
    metrics = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    if args.unit_env:
        sys.path.insert(0, str(ROOT))
        from edgert.allocator import environment

        env.update(environment())
    recorder = _heaptrack(env, Path(args.heaptrack).resolve()) if args.heaptrack else None
    snaps = work / "tracemalloc"
    launcher = ([str(Path(__file__).resolve()), TRACEMALLOC_CHILD, str(snaps), "edgert.cli.main"] if args.tracemalloc
                else ["-m", "edgert.cli.main"])
    proc = subprocess.Popen([sys.executable, *launcher, "run", "--config", str(cfg), "--json",
                             "--metrics", metrics], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=work)
    target = args.frames * args.sources
    load_at_start = list(os.getloadavg())
    samples: list[tuple[int, int]] = []
    marks = [target // 4, target // 2, target] if args.tracemalloc else []
    started = time.monotonic()
    # the mappings at warm-up's end, at half and at the end
    maps: dict[str, dict[tuple[str, str], tuple[int, int]]] = {}
    while proc.poll() is None:
        frames, rss = _frames(metrics), _rss_kb(proc.pid)
        if frames is not None and rss is not None:
            samples.append((frames, rss))
            for label, mark in (("warm", target // 4), ("half", target // 2), ("end", target)):
                if frames >= mark and label not in maps:
                    maps[label] = _smaps(proc.pid)
            while marks and frames >= marks[0]:
                _snapshot(proc, snaps, 3 - len(marks))
                marks.pop(0)
            if frames >= target:
                break
        time.sleep(0.5)
    run_s = time.monotonic() - started
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    exit_s = time.monotonic() - t0
    if recorder is not None:
        recorder.wait(600)
        Path(args.heaptrack).resolve().with_suffix(".fifo").unlink()
    time.sleep(1.0)
    delivered = counter.count if counter is not None else None
    if counter is not None:
        counter.stop()
    if broker is not None:
        broker.stop()
    warm = [s for s in samples if s[0] >= target // 4]
    late = [s for s in samples if s[0] >= target // 2]
    summary = json.loads(out) if out.strip().startswith("{") else {}
    result = {
        "machine": machine_info(),  # its loadavg is the one at the end
        "loadavg_start": load_at_start,
        "model": str(model), "video": str(video), "sources": args.sources, "frames_per_source": args.frames,
        "sinks": sinks, "tracking": "bytetrack", "line": "middle",
        "run_s": round(run_s, 1), "frames": summary.get("frames"), "fps": summary.get("fps"),
        "rss_kb_first": samples[0][1] if samples else None, "rss_kb_last": samples[-1][1] if samples else None,
        "rss_kb_per_1000_frames_after_warmup": None if _slope_kb_per_1000(warm) is None
        else round(float(_slope_kb_per_1000(warm) or 0.0), 1),
        "rss_kb_per_1000_frames_second_half": None if _slope_kb_per_1000(late) is None
        else round(float(_slope_kb_per_1000(late) or 0.0), 1),
        "warmup": f"the first quarter of the frames ({target // 4} of {target})",
        "rss_kb_per_1000_frames_after_warmup_medians": None if _median_growth_kb_per_1000(warm) is None
        else round(float(_median_growth_kb_per_1000(warm) or 0.0), 1),
        "malloc_env": {k: v for k, v in env.items() if k.startswith("MALLOC_")},
        "edgert_malloc": env.get("EDGERT_MALLOC"),
        "samples": len(samples),
        "rss_curve": [samples[i] for i in range(0, len(samples), max(1, len(samples) // 20))],
        "exit_code": proc.returncode, "sigterm_to_exit_s": round(exit_s, 2),
        "stop_deadline_s": float(os.environ.get("EDGERT_STOP_DEADLINE_S", "10")),
        "drops": summary.get("drops"), "counts": summary.get("counts"),
        "mqtt_delivered": delivered,
        # where the resident memory grew after warm-up, by mapping (/proc/PID/smaps at 1/4, 1/2 and all frames)
        "rss_growth_warmup_to_end": _smaps_growth(maps["warm"], maps["end"]) if {"warm", "end"} <= set(maps)
        else None,
        "rss_growth_half_to_end": _smaps_growth(maps["half"], maps["end"]) if {"half", "end"} <= set(maps)
        else None,
        "outputs": _whole_outputs(work, names),
        "stderr_tail": err.splitlines()[-10:],
    }
    if args.tracemalloc:
        result["tracemalloc"] = _growth(snaps)
    write_json(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("machine", "stderr_tail", "rss_curve")}, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0 if proc.returncode == 0 else 1


#: ``soak.py --tracemalloc-child DIR MODULE ARGS``: run MODULE under tracemalloc, a snapshot on each SIGUSR1.
TRACEMALLOC_CHILD = "--tracemalloc-child"
TRACEMALLOC_FRAMES = 12


def tracemalloc_child(folder: Path, module: str, args: list[str]) -> None:
    """Run ``module`` under tracemalloc; each SIGUSR1 writes ``folder/snap-N.tm`` (``Snapshot.dump``) and a
    ``.done`` marker, which the soak diffs grouped by traceback to say what grows. Kept out of edgert: it is a
    measuring tool, and it slows the run."""
    import runpy
    import tracemalloc
    from types import FrameType

    folder.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(TRACEMALLOC_FRAMES)
    taken = [0]

    def dump(signum: int, frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot().filter_traces((
            tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ))
        snap.dump(str(folder / f"snap-{taken[0]}.tm"))
        (folder / f"snap-{taken[0]}.done").write_text("")
        taken[0] += 1

    signal.signal(signal.SIGUSR1, dump)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if len(sys.argv) > 3 and sys.argv[1] == TRACEMALLOC_CHILD:
        tracemalloc_child(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
        raise SystemExit(0)
    raise SystemExit(main())
