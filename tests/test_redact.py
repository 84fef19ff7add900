"""The one redaction function: what it hides and what it keeps."""

from __future__ import annotations

import logging

import pytest

from edgert.errors import SourceError
from edgert.redact import RedactingFilter, expand_env, has_literal_secret, redact


@pytest.mark.parametrize(("text", "shown"), [
    ("rtsp://admin:pw@10.0.0.7:554/s", "rtsp://***@10.0.0.7:554/s"),
    ("rtsp://admin:p@ss/w@cam/s", "rtsp://***@cam/s"),  # '@' and '/' unencoded in the password
    ("http://cam/s?user=a&password=pw&fps=5", "http://cam/s?user=a&password=***&fps=5"),
    ("https://x/y?X-Amz-Signature=abc&access_token=t", "https://x/y?X-Amz-Signature=***&access_token=***"),
    ("gst://rtspsrc location=rtsp://u:p@h/x ! appsink", "gst://rtspsrc location=rtsp://***@h/x ! appsink"),
    ("cannot open 'rtsp://u:p@h/x': refused", "cannot open 'rtsp://***@h/x': refused"),
    ("rtsp://${U}:${P}@cam/s", "rtsp://${U}:${P}@cam/s"),  # names of variables, not secrets
    ("/videos/a@b.mp4 and rtsp://cam/s", "/videos/a@b.mp4 and rtsp://cam/s"),
])
def test_redact(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_literal_secrets_and_environment_names() -> None:
    assert has_literal_secret("rtsp://a:b@cam/s") and has_literal_secret("http://cam/?token=x")
    assert not has_literal_secret("rtsp://${A}:${B}@cam/s") and not has_literal_secret("rtsp://cam/s")
    with pytest.raises(SourceError, match=r"\$\{EDGERT_T_NONE\}, which is not set"):
        expand_env("rtsp://${EDGERT_T_NONE}@cam")


def test_expand_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERT_T_U", "bob")
    assert expand_env("rtsp://${EDGERT_T_U}:x@cam") == "rtsp://bob:x@cam"


def test_the_log_filter_redacts_arguments_and_tracebacks() -> None:
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "%s: lost", ("rtsp://u:pw@h/s",), None)
    assert RedactingFilter().filter(record) and record.getMessage() == "rtsp://***@h/s: lost"
