"""The chaos soak's processes and faults (:mod:`tests.system.chaos_soak`): its own durable Redis, the local
3-node Ray cluster (``deploy/local-cluster.sh``) and ``knnmon serve``; a worker SIGKILL, the
service's SIGKILL, a Redis restart, a worker node's restart, each timed until the service serves
again."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import redis

from knnmon.coordinator.service.status import read_status
from tests.support import free_port_base
from knnmon.keys import Keys
from knnmon.redis_server import EmbeddedRedis, free_port

NAMESPACE = "chaos"
ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "deploy" / "local-cluster.sh"


def node_rss_mb(pid_file: Path) -> float | None:
    """RSS of a Ray node: its ``ray start`` process and every process under it (MB)."""
    try:
        p = psutil.Process(int(pid_file.read_text()))
        return sum(x.memory_info().rss for x in [p, *p.children(recursive=True)]) / 2**20
    except (OSError, ValueError, psutil.Error):
        return None


def processes_mb(pids: dict[str, int | None], pid_files: dict[str, Path]) -> dict[str, list]:
    """Memory of each process, by pid: ``pid -> [role, RSS MB, private MB]`` (private: RSS less its
    file-backed and shared pages, psutil's ``rss - shared``: what the process itself holds, not
    the pages of Ray's object store it maps), the roles of ``pids`` (the service, Redis, each
    worker) and, for each Ray node's ``ray start`` process in ``pid_files``, it and every process
    under it (role ``<node>:<process name>``; a worker found there keeps its role)."""
    out: dict[str, list] = {}
    procs = [(role, pid) for role, pid in pids.items() if pid]
    for node, path in pid_files.items():
        try:
            p = psutil.Process(int(path.read_text()))
            procs += [(f"{node}:{x.name()}", x.pid) for x in [p, *p.children(recursive=True)]]
        except (OSError, ValueError, psutil.Error):
            continue
    for role, pid in procs:
        try:
            if str(pid) not in out:
                m = psutil.Process(pid).memory_info()
                out[str(pid)] = [role, round(m.rss / 2**20, 1), round((m.rss - m.shared) / 2**20, 1)]
        except psutil.Error:
            pass
    return out


def rss(pid: int | None) -> float | None:
    try:
        return psutil.Process(pid).memory_info().rss / 2**20 if pid else None
    except psutil.Error:
        return None


class Chaos:
    """The soak's processes (Redis, the Ray cluster, the service) and its faults."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.dir = Path(a.log_dir).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.redis = EmbeddedRedis(str(self.dir / "redis"), port=self.port, durable=True).start()
        self.url = self.redis.url
        base = free_port_base((0, 10, 20, 30, 100, 300), step=500)
        self.cluster_env = {**os.environ, "KNNMON_CLUSTER_DIR": str(self.dir / "cluster"),
                            "KNNMON_RAY_PORT": str(base), "KNNMON_RAY": shutil.which("ray", path=os.path.dirname(
                                sys.executable)) or "ray"}
        self.address = f"127.0.0.1:{base}"
        self.script("start")
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.dir / "cluster" /
                                                                                       "auth_token")}
        self.env.pop("RAY_ADDRESS", None)
        self.env.pop("KNNMON_REDIS_URL", None)
        self.log = open(self.dir / "serve.log", "a")  # noqa: SIM115 - the service writes to it until the end
        self.service: subprocess.Popen | None = None

    def script(self, *args: str) -> str:
        out = subprocess.run([str(CLUSTER), *args], env=self.cluster_env, capture_output=True, text=True, timeout=300)
        if out.returncode:
            raise SystemExit(f"local-cluster.sh {' '.join(args)} failed: {out.stdout}{out.stderr}")
        return out.stdout

    def start_service(self, r: redis.Redis, keys: Keys) -> None:
        a = self.a
        r.delete(keys.serve_status)
        self.service = subprocess.Popen(
            [sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", self.url, "--namespace", NAMESPACE,
             "--workers", str(a.workers), "--window", a.window,
             "--ray-address", self.address, "--data-dir", str(self.dir / "data")],
            env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        while not r.exists(keys.serve_status):
            if self.service.poll() is not None:
                raise SystemExit(f"serve exited with {self.service.returncode}; see {self.dir / 'serve.log'}")
            time.sleep(0.1)

    def close(self) -> None:
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.service.kill()
                self.service.wait()
        self.log.close()
        self.script("stop")
        self.redis.stop()


def workers_of(status: dict) -> list[dict]:
    return (status.get("service") or {}).get("worker_processes") or []


def inject(chaos: Chaos, r: redis.Redis, keys: Keys, kind: str, at_s: float) -> dict:
    """Inject one fault; returns its record (with how long until the service served again)."""
    t0 = time.monotonic()
    ev: dict = {"at_s": round(at_s, 1), "kind": kind}
    before = {w["worker"]: w.get("pid") for w in workers_of(read_status(chaos.url, NAMESPACE))}
    gone: set = set()  # the lost workers' processes
    restart: threading.Thread | None = None  # a node restart runs while the service is watched
    if kind == "worker_kill":
        victim = random.Random(int(at_s)).choice(sorted(before))
        ev.update(worker=victim, pid=before[victim])
        gone = {before[victim]}
        if before[victim]:
            os.kill(before[victim], signal.SIGKILL)
    elif kind == "service_kill":
        chaos.service.send_signal(signal.SIGKILL)
        chaos.service.wait()
        chaos.start_service(r, keys)
    elif kind == "redis_restart":
        chaos.redis.stop()
        ev["redis_down_s"] = round(time.monotonic() - t0, 2)
        chaos.redis = EmbeddedRedis(str(chaos.dir / "redis"), port=chaos.port, durable=True).start()
    elif kind == "node_restart":  # a worker node that hosts a knnmon worker, if one does
        hosts = {p: node_of(chaos, p) for p in before.values()}
        on = [n for n in hosts.values() if n in ("worker1", "worker2")]
        ev["node"] = on[0] if on else "worker1"
        ev["workers_on_it"] = on.count(ev["node"])
        gone = {p for p, n in hosts.items() if n == ev["node"]}
        # The node's stop and rejoin take ~17 s; the service is served again when its workers
        # there are revived elsewhere, which the wait below sees while the node rejoins.
        restart = threading.Thread(target=chaos.script, args=("restart", ev["node"]))
        restart.start()
    if restart is None:
        ev["fault_s"] = round(time.monotonic() - t0, 2)
    served = _served_again(chaos, r, keys, t0, f"{int(time.time() * 1000)}-0", gone)
    if restart is not None:
        restart.join()
        ev["fault_s"] = round(time.monotonic() - t0, 2)  # (until the node joined again)
    if served is not None:
        ev["served_again_s"] = served
    print(json.dumps(ev), flush=True)
    return ev


def _served_again(chaos: Chaos, r: redis.Redis, keys: Keys, t0: float, since: str, gone: set) -> float | None:
    """Seconds from ``t0`` until the service served again: every worker has a live process
    other than the lost ones (``gone``: process ids), and a batch was logged after ``since``
    (an entry id); ``None`` after 300 s."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            workers = workers_of(read_status(chaos.url, NAMESPACE))
            fresh = r.xrange(keys.serve_batches, min=since, max="+", count=1)
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(0.5)
            continue
        pids = [w.get("pid") for w in workers]
        if fresh and pids and all(p and psutil.pid_exists(p) for p in pids) and not gone & set(pids):
            return round(time.monotonic() - t0, 2)
        time.sleep(0.2)
    return None


def node_of(chaos: Chaos, pid: int | None) -> str | None:
    """The local cluster's node (``head``, ``worker1``, ``worker2``) whose ``ray start`` process
    is an ancestor of process ``pid``."""
    nodes = {}
    for n in ("head", "worker1", "worker2"):
        try:
            nodes[int((chaos.dir / "cluster" / f"{n}.pid").read_text())] = n
        except (OSError, ValueError):
            continue
    try:
        for p in psutil.Process(pid).parents():
            if p.pid in nodes:
                return nodes[p.pid]
    except (psutil.Error, TypeError, ValueError):
        return None
    return None


def redis_pid(chaos: Chaos) -> int | None:
    try:
        return int(redis.Redis.from_url(chaos.url).info("server")["process_id"])
    except Exception:  # noqa: BLE001
        return None
