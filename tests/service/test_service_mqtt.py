"""A fleet unit: MQTT sinks go through the pipeline config, the broker's password only through the env file."""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path

import pytest

from edgert.config import PipelineConfig, from_mapping
from edgert.errors import ServiceError
from edgert.service.unit import UnitOptions, output_paths, render_unit
from tests.helpers import assert_one_line_error, run_cli

OPTIONS = UnitOptions(name="door", config_path="/etc/edgert/door.yaml", edgert="/opt/edgert/venv/bin/edgert")


def _config(*sinks: str) -> PipelineConfig:
    return from_mapping(PipelineConfig, {"model": {"path": "/opt/models/m.onnx"}, "source": {"uri": "/dev/video0"},
                                         "sinks": list(sinks)})


def test_mqtt_sink_unit_waits_for_network_has_env_file_and_no_secret() -> None:
    config = _config("mqtts://broker.fleet.example:8883/edgert/door?qos=1", "jsonl:///var/log/edgert/d.jsonl")
    text = render_unit(config, OPTIONS)
    assert "After=network-online.target" in text and "Wants=network-online.target" in text
    assert "EnvironmentFile=-/etc/edgert/door.env" in text
    assert "ExecStart=/opt/edgert/venv/bin/edgert run --config /etc/edgert/door.yaml" in text
    assert output_paths(config) == ["/var/log/edgert"]  # the broker URI is not taken for a file to write
    assert "broker.fleet.example" not in text  # the sinks travel in the config, not in the unit
    assert "AF_INET" in text


@pytest.mark.parametrize(("sink", "needle"), [
    ("mqtt://bob:hunter2@broker:1883/edgert", "EDGERT_MQTT_PASSWORD"),
    ("mqtt://broker:1883/edgert/+", "wildcard"),
])
def test_bad_mqtt_sinks_fail_at_install(sink: str, needle: str) -> None:
    with pytest.raises(ServiceError) as info:
        render_unit(_config(sink), OPTIONS)
    assert needle in str(info.value) and "hunter2" not in str(info.value)


def test_install_writes_a_private_env_file_and_the_cli_refuses_credentials(tmp_path: Path) -> None:
    exe = Path(sys.prefix) / "bin" / "edgert"
    if not exe.exists():
        pytest.skip("the edgert command is not installed in this environment (pip install -e .)")
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read by install")
    config = tmp_path / "p.yaml"
    config.write_text(f"model: {{path: {model}}}\nsource: {{uri: /dev/video0}}\n"
                      "sinks: ['mqtt://127.0.0.1:1883/edgert/door']\n")
    units, env = tmp_path / "units", tmp_path / "etc" / "door.env"
    user = pwd.getpwuid(os.getuid()).pw_name
    proc = run_cli("service", "install", "--config", str(config), "--name", "door", "--user", user,
                   "--unit-dir", str(units), "--env-file", str(env), "--edgert", str(exe))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert "EDGERT_MQTT_PASSWORD" in env.read_text()
    assert "After=network-online.target" in (units / "edgert-door.service").read_text()

    config.write_text(f"model: {{path: {model}}}\nsource: {{uri: /dev/video0}}\n"
                      "sinks: ['mqtt://bob:hunter2@127.0.0.1:1883/edgert/door']\n")
    proc = run_cli("service", "install", "--config", str(config), "--name", "door", "--dry-run",
                   "--edgert", str(exe))
    assert_one_line_error(proc, "credentials do not belong in the URI")
    assert "hunter2" not in proc.stderr + proc.stdout
