"""Drive a real headless Chromium through the DevTools protocol over a pipe (no websocket, no selenium).

``--remote-debugging-pipe`` makes Chromium read protocol messages from fd 3 and write replies to fd 4,
each a JSON text ended by a NUL byte. That is all a test needs to open a page and evaluate JavaScript.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
]


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One headless Chromium with one page, attached over the pipe."""

    def __init__(self, executable: str) -> None:
        self._profile = tempfile.mkdtemp(prefix="edgert-chromium-")
        self._log = open(os.path.join(self._profile, "chromium.log"), "wb")  # noqa: SIM115 - closed in close()
        to_browser_r, to_browser_w = os.pipe()
        from_browser_r, from_browser_w = os.pipe()
        # Chromium expects the pipe on fds 3 (its input) and 4 (its output): a small Python trampoline
        # puts them there and execs Chromium (dash cannot redirect fds above 9).
        trampoline = (
            "import os, sys; r, w = os.dup(int(sys.argv[1])), os.dup(int(sys.argv[2])); "
            "os.dup2(r, 3); os.dup2(w, 4); os.set_inheritable(3, True); os.set_inheritable(4, True); "
            "os.execv(sys.argv[3], sys.argv[3:])"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", trampoline, str(to_browser_r), str(from_browser_w),
             executable, *FLAGS, f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
            pass_fds=(to_browser_r, from_browser_w),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._out = os.fdopen(to_browser_w, "wb", buffering=0)
        self._in = os.fdopen(from_browser_r, "rb", buffering=0)
        self._next_id = 0
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        try:
            self.session = self._attach()
        except BaseException:
            self.close()  # never leave a browser behind
            raise

    def _read_loop(self) -> None:
        buffer = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                return
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._replies[message["id"]] = message
                        self._cond.notify_all()

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 20.0
    ) -> dict[str, Any]:
        with self._cond:
            self._next_id += 1
            msg_id = self._next_id
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            self._out.write(json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(f"chromium exited: {self.log_tail()}") from None
        deadline = time.monotonic() + timeout
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no reply to {method} within {timeout} s")
                self._cond.wait(left)
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def log_tail(self) -> str:
        self._log.flush()
        with open(self._log.name, "rb") as f:
            return f.read()[-2000:].decode(errors="replace")

    def _attach(self) -> str:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session: str = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return session

    def goto(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, self.session)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def load(self, url: str, width: int = 1100, height: int = 900, timeout: float = 20.0) -> None:
        """Open ``url`` in a ``width`` x ``height`` viewport and wait until the document has loaded."""
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, self.session)
        self.goto(url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'", timeout)

    def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Evaluate ``expression`` until it is truthy; return its value (TimeoutError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout} s: {expression}")
            time.sleep(0.1)

    def screenshot(self, path: str | os.PathLike[str], full_page: bool = True) -> bytes:
        """A PNG of the page (the whole scrollable page when ``full_page``), written to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.call("Page.getLayoutMetrics", session=self.session)["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            params["captureBeyondViewport"] = True
        data = base64.b64decode(self.call("Page.captureScreenshot", params, self.session, timeout=60.0)["data"])
        with open(path, "wb") as f:
            f.write(data)
        return data

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5.0)
        except (TimeoutError, RuntimeError, OSError):
            pass
        try:
            self._proc.wait(5.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(30.0)  # a loaded machine can take a while to reap it
        self._out.close()
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
