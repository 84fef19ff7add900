"""A password of any spelling never leaves the process: every printable ASCII character, raw and percent-encoded.

Vendors ask for passwords with ``#``, ``?``, ``/``, blanks and quotes; the redaction reads the user info up to
the last ``@`` of the URI, as an opener that accepts them does. Generated (seeded) credentials go through
:func:`~edgert.redact.redact` in many spellings of a message, then through a real ``edgert run`` (its log, the
``--json`` summary, the HTML report, ``/metrics``), ``edgert config`` and ``edgert service install``, which
refuses each one without showing it.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from urllib.parse import quote

import yaml

from edgert.redact import has_literal_secret, redact
from tests.faults.conftest import closed_port, free_port, start_cli, stop, summary_of, wait_http
from tests.helpers import assert_one_line_error, run_cli

PRINTABLE = string.printable[:95]  # letters, digits, punctuation and the blank: every printable ASCII character


def _password(rng: random.Random, alphabet: str, size: int) -> str:
    chars = [rng.choice(alphabet) for _ in range(size)]
    text = "".join(chars).replace("${", "$_")  # ${NAME} names an environment variable, not a password
    # a password that is a word of the message around it could not be told from a leak
    return text if text.strip() and len(set(text)) > 3 else _password(rng, alphabet, size)


def _spellings(password: str) -> list[str]:
    """How a password may be written in a URI and how it may show up in text."""
    encoded = quote(password, safe="")
    return [password, encoded, json.dumps(password)[1:-1], repr(password)[1:-1]]


def _uris(rng: random.Random, user: str, password: str) -> list[str]:
    host = rng.choice(["cam", "10.0.0.7:554", "[fe80::1]:8554", "cam.local", "${CAM_HOST}"])
    path = rng.choice(["", "/", "/stream", "/a/b?channel=1", "/x#frag", "?token=abc"])
    scheme = rng.choice(["rtsp", "rtsps", "http", "https", "mqtt", "mqtts", "rtmp", "srt"])
    return [f"{scheme}://{user}:{written}@{host}{path}" for written in (password, quote(password, safe=""))]


def test_generated_passwords_never_survive_redaction() -> None:
    rng = random.Random(4242)
    templates = ["{u}", "cannot open {u}: refused", "'{u}'", "source {u!r} failed", "sinks: [{u}, {u}]",
                 '{{"uri": "{u}", "name": "cam"}}', "gst://rtspsrc location={u} ! appsink",
                 "(t.onnx on {u}, /videos/a@b.mp4)", "{u}\nnext line {u}"]
    checked = 0
    for round_ in range(1500):
        size = rng.randint(6, 24)
        password = _password(rng, PRINTABLE, size)
        user = rng.choice(["admin", "", "u@x", "${CAM_USER}", _password(rng, string.ascii_letters + "-._~", 5)])
        for uri in _uris(rng, user, password):
            assert has_literal_secret(uri), uri
            for template in templates:
                text = template.format(u=uri)
                shown = redact(text)
                for spelling in _spellings(password):
                    assert spelling not in shown, (round_, text, shown)
                checked += 1
    assert checked > 20000


def _credential_sets(seed: int) -> list[str]:
    """Four passwords that together hold every printable ASCII character."""
    chars = list(PRINTABLE)
    random.Random(seed).shuffle(chars)
    parts = ["".join(chars[i::4]) for i in range(4)]
    return [p.replace("${", "$_") for p in parts]


def _leaks(text: str, passwords: list[str]) -> list[str]:
    return [s for p in passwords for s in _spellings(p) if s in text]


def test_a_run_config_and_unit_show_no_password_of_any_spelling(tmp_path: Path, media: dict[str, Path]) -> None:
    passwords = _credential_sets(42)
    assert set(PRINTABLE) - set("".join(passwords)) <= {"{"}
    port = closed_port()
    sources = [{"uri": str(media["long"]), "name": "door", "loop": True}]
    for i, password in enumerate(passwords):
        for j, written in enumerate((password, quote(password, safe=""))):
            sources.append({"uri": f"rtsp://admin:{written}@127.0.0.1:{port}/s{i}{j}", "name": f"cam{i}{j}",
                            "timeout_s": 1.0})
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"path": str(media["model"])}, "sources": sources,
                                   "sinks": [f"jsonl://{tmp_path}/{{source}}.jsonl"]}), encoding="utf-8")
    metrics = f"127.0.0.1:{free_port()}"
    report = tmp_path / "report.html"
    proc = start_cli("-v", "run", "--config", str(cfg), "--json", "--metrics", metrics, "--report", str(report))
    try:
        scraped = wait_http(f"http://{metrics}/metrics", proc, needle='source="cam30"')
    finally:
        out, err = stop(proc)
    assert proc.returncode == 0, err
    for where, text in (("/metrics", scraped), ("the log", err), ("the --json summary", out),
                        ("the report", report.read_text(encoding="utf-8"))):
        assert not _leaks(text, passwords), (where, _leaks(text, passwords), text[:3000])
    cams = [s for s in summary_of(out)["sources"] if s["name"].startswith("cam")]
    assert len(cams) == 8 and all(f"rtsp://***@127.0.0.1:{port}/s" in s["uri"] for s in cams), cams

    shown = run_cli("config", str(cfg), "--json")
    assert shown.returncode == 0, shown.stderr
    assert not _leaks(shown.stdout + shown.stderr, passwords), shown.stdout
    assert shown.stdout.count("rtsp://***@127.0.0.1") == 8

    for i, password in enumerate(passwords):
        for written in (password, quote(password, safe="")):
            one = tmp_path / f"svc{i}.yaml"
            one.write_text(yaml.safe_dump({
                "model": {"path": str(media["model"])},
                "source": {"uri": f"rtsp://admin:{written}@10.0.0.7/stream"},
                "sinks": [f"mqtt://bob:{written}@127.0.0.1:1883/edgert/cam"]}), encoding="utf-8")
            refused = run_cli("service", "install", "--config", str(one), "--name", "cam", "--dry-run")
            assert_one_line_error(refused, "credentials")
            assert not _leaks(refused.stdout + refused.stderr, passwords), refused.stderr
