"""The deployment examples that point at ``knnmon serve``'s probes agree with it: the systemd unit
verifies and its command line parses; the KubeRay head's probes ask the paths and the port that
its ``--metrics`` serves. (Neither runs here under systemd or Kubernetes.)"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from knnmon.coordinator.cli import build_parser
from knnmon.coordinator.cli.options import settings_of
from knnmon.coordinator.service.probes import parse_address

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _serve_args(command: str) -> list[str]:
    """The arguments after ``knnmon`` in a shell command line, as the CLI parses them."""
    words = shlex.split(command)
    words = words[next(i for i, w in enumerate(words) if w.endswith("knnmon")) + 1:]
    return words[: words.index(">")] if ">" in words else words


def test_the_systemd_unit_verifies_and_its_command_parses(tmp_path):
    text = (DEPLOY / "knnmon.service").read_text()
    [exec_start] = [line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart=")]
    a = build_parser().parse_args(_serve_args(exec_start))
    settings = settings_of(a).settings
    assert a.command == "serve" and parse_address(settings.serve.metrics) == ("127.0.0.1", 9464)
    assert settings.log.format == "json"
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    knnmon = Path(sys.executable).with_name("knnmon")
    unit = tmp_path / "knnmon.service"
    unit.write_text(text.replace("/opt/knnmon/bin/knnmon", str(knnmon)))
    out = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "knnmon.service" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_the_kuberay_head_probes_what_serve_serves():
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "raycluster.yaml").read_text()))
    [head] = docs[0]["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    command = head["lifecycle"]["postStart"]["exec"]["command"][-1]
    a = build_parser().parse_args(_serve_args(command.rstrip(" &")))
    host, port = parse_address(settings_of(a).settings.serve.metrics)
    assert host == "0.0.0.0"  # reachable from the kubelet, not only from the pod
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["metrics"] == port
    probes = {k: head[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {p["port"] for p in probes.values()} == {"metrics"}
    assert probes["readinessProbe"]["path"] == "/readyz" and probes["livenessProbe"]["path"] == "/healthz"
