"""Helpers for tests of knnmon and of code built on it: slices of real data files, and checking
the results in Redis against the brute-force oracle."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import time
from collections.abc import Sequence
from os import PathLike

import pyarrow as pa
import redis

from knnmon.batch import ObjectInfo
from knnmon.connection import connect
from knnmon.keys import Keys
from knnmon.oracle import BruteForceKnn
from knnmon.results import ResultReader

__all__ = ["FeedMirror", "assert_applied_once", "assert_exact", "assert_feed_and_objects", "client_round_trip",
           "dump_keys", "expected", "first_mismatch", "free_port_base", "head_lines", "knnmon_cli", "object_fields",
           "redis_results", "register_fields", "run_exact", "serve_process", "wait_processed"]


def head_lines(path: str | PathLike[str], n: int) -> list[str]:
    """The first ``n`` lines of a text file (gzip if the name ends in ``.gz``), newlines removed."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out: list[str] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            out.append(line.rstrip("\n"))
            if len(out) == n:
                break
    return out


def redis_results(url: str, namespace: str, qids: list[str]) -> list[list[tuple[str, float]]]:
    """``knn:result:{qid}`` of each query: ``[(object id, distance m), ...]`` nearest first."""
    client = connect(url)
    try:
        return [r for _, _, r in ResultReader(client, Keys(namespace)).many(qids)]
    finally:
        client.close()


def expected(queries: pa.Table, oracle: BruteForceKnn) -> list[list[tuple[str, float]]]:
    """The oracle's kNN of every query (``id``, ``lon``, ``lat``, ``keywords``, ``k``)."""
    return [oracle.knn(r["lon"], r["lat"], r["keywords"], r["k"]) for r in queries.to_pylist()]


def assert_exact(url: str, namespace: str, queries: pa.Table, oracle: BruteForceKnn | list) -> int:
    """Assert every query's Redis result equals the oracle's kNN (ids in order; distances to
    1e-6 relative); returns the number of queries checked.

    Raises
    ------
    AssertionError
        Naming the first query whose result differs, with both results.
    """
    qids = queries.column("id").to_pylist()
    wants = expected(queries, oracle) if isinstance(oracle, BruteForceKnn) else oracle
    wrong = first_mismatch(qids, redis_results(url, namespace, qids), wants)
    if wrong is not None:
        raise AssertionError(wrong)
    return len(qids)


def first_mismatch(qids: Sequence[str], got: Sequence[list[tuple[str, float]]],
                   wants: Sequence[list[tuple[str, float]]]) -> str | None:
    """The first query whose result ``got`` differs from ``wants`` (ids in order; distances to
    1e-6 relative), named with both results; ``None`` when all agree."""
    for qid, g, want in zip(qids, got, wants):
        same = [x[0] for x in g] == [x[0] for x in want] and all(
            math.isclose(a[1], b[1], rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(g, want))
        if not same:
            return f"query {qid}: Redis holds {g}, the oracle says {want}"
    return None


class FeedMirror:
    """Each query's members as ``knn:changes`` replays them, read as it grows: the service trims
    the feed to its last minutes (:data:`~knnmon.workers.result_writer.CHANGES_KEEP_MS`), so a
    reader that keeps up sees every change where a replay from the start, later, would not. Each
    :meth:`read` also checks that no change was written twice (:func:`assert_applied_once`)."""

    def __init__(self) -> None:
        self.last = "0"  # the last entry read
        self.members: dict[str, set[str]] = {}
        self._versions: dict[str, tuple[int, bool]] = {}  # each query's last (version, entered anything)

    def read(self, r: redis.Redis, keys: Keys) -> dict[str, set[str]]:
        """The members after the entries written since the last read (``r``: a client with
        ``decode_responses``).

        Raises
        ------
        AssertionError
            A query's versions do not increase (:func:`assert_applied_once`), or the feed was
            trimmed past the last entry read (this reader fell behind).
        """
        from knnmon.feed import parse_entry

        if self.last != "0":
            assert r.xrange(keys.changes, min=self.last, max=self.last), \
                f"the feed was trimmed past entry {self.last}, the last one read"
        for eid, f in r.xrange(keys.changes, min="(" + self.last if self.last != "0" else "-"):
            for qid, entered, left, version in parse_entry(f):
                now = (version, bool(entered))
                before = self._versions.get(qid)
                assert before is None or before[0] < version or (before[0] == version and not (before[1] and now[1])), \
                    (qid, before, now)
                self._versions[qid] = now
                self.members[qid] = (self.members.get(qid, set()) - set(left)) | set(entered)
            self.last = eid
        return self.members


def assert_applied_once(r: redis.Redis, keys: Keys) -> dict[str, set[str]]:
    """Assert no change was written twice: each query's ``knn:changes`` versions never decrease,
    and two of its changes share a version only when one of them enters nothing (an unregister
    between batches carries the version of the batch before it, and shares it with the
    registration after it); a batch applied twice would repeat a change that enters something.
    Returns each query's members as the feed replays them from its start (:class:`FeedMirror`;
    ``r``: a client with ``decode_responses``).

    Raises
    ------
    AssertionError
        Naming the first query whose versions do not increase.
    """
    return FeedMirror().read(r, keys)


def assert_feed_and_objects(r: redis.Redis, keys: Keys, qids: list[str], feed: FeedMirror | None = None) -> None:
    """Assert nothing was applied twice or lost in Redis: :func:`assert_applied_once`;
    replaying the feed gives each query's result members (from its start, or with ``feed``, a
    reader that has kept up: :class:`FeedMirror`); and each details hash
    (``knn:objects:{worker}``, per master in a cluster: the query hash's ``objects``) holds
    exactly the objects in the results of its queries
    (``qids``: every registered query; ``r``: a client with ``decode_responses``).

    Raises
    ------
    AssertionError
        Naming the first query (or the object hashes) that differ.
    """
    mirror = (feed or FeedMirror()).read(r, keys)
    held: dict[str, set[str]] = {}
    for qid in qids:
        members = {o for o, _ in ResultReader(r, keys).result(qid)}
        assert mirror[qid] == members, qid
        held.setdefault(r.hget(keys.query(qid), "objects"), set()).update(members)
    stored = {k: set(r.hkeys(k)) for k in r.scan_iter(keys.objects("*"), count=10_000)}
    assert {k: s for k, s in stored.items() if s} == {k: s for k, s in held.items() if s}, \
        "the workers' object details differ from their results' members"
    for k, s in stored.items():
        for value in r.hmget(k, list(s)):
            ObjectInfo.from_text(value)  # readable


def wait_processed(r: redis.Redis, keys: Keys, proc: subprocess.Popen | None = None, timeout_s: float = 120) -> None:
    """Wait until ``knnmon serve`` has read every entry of both ingest streams and none is pending.

    Raises
    ------
    AssertionError
        ``proc`` (the service's process, if given) exited, or ``timeout_s`` passed.
    """
    from redis.client import NEVER_DECODE

    from knnmon.protocol import entry_order, group_info

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"serve exited with {proc.returncode}")
        done = True
        for key in (keys.ingest_objects, keys.ingest_queries):
            # (the newest entry's fields may not be UTF-8 yet: its id alone, undecoded)
            tail = r.execute_command("XREVRANGE", key, "+", "-", "COUNT", "1", **{NEVER_DECODE: []})
            if not tail:
                continue
            last = tail[0][0].decode()
            g = group_info(r, key)  # (past the stream's last entry: the entries after it were rejected, and left)
            if g is None or entry_order(g["last-delivered-id"]) < entry_order(last) or g["pending"]:
                done = False
        if done:
            return
        time.sleep(0.02)
    raise AssertionError("serve did not catch up in time")


def object_fields(o: dict, use_text: bool = False) -> dict:
    """An object (``id``, ``lon``, ``lat``, ``t``, ``keywords`` list) as ``knn:ingest:objects``
    fields; its keywords as ``text`` if ``use_text``."""
    f = {"id": o["id"], "lon": repr(o["lon"]), "lat": repr(o["lat"]), "t": str(o["t"])}
    f["text" if use_text else "keywords"] = " ".join(o["keywords"])
    return f


def publish_objects(r: redis.Redis, keys: Keys, objects: Sequence[dict]) -> list[str]:
    """XADD ``objects`` (dicts as :func:`object_fields` takes them) to the objects stream, in one
    pipeline, in order; returns their entry ids."""
    pipe = r.pipeline(transaction=False)
    for o in objects:
        pipe.xadd(keys.ingest_objects, object_fields(o))
    return pipe.execute()


def register_fields(q: dict, k: int | None = None) -> dict:
    """A query row as ``op=register`` fields of ``knn:ingest:queries`` (``k`` overrides its k)."""
    return {"op": "register", "id": q["id"], "lon": repr(q["lon"]), "lat": repr(q["lat"]),
            "keywords": " ".join(q["keywords"]), "k": str(k or q["k"])}


def free_port_base(offsets: Sequence[int], step: int = 10, low: int = 20_000, high: int = 40_000,
                   tries: int = 50) -> int | None:
    """A base port ``b`` (a multiple of ``step`` in ``[low, high)``) such that every port
    ``b + offset`` binds on 127.0.0.1 right now (for scripts that take a first port and use the
    ones above it); ``None`` after ``tries`` random picks."""
    import random
    import socket

    for _ in range(tries):
        base = random.randrange(low, high, step)
        try:
            for offset in offsets:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
    return None


def _cli_env() -> dict[str, str]:
    """This process's environment without ``$KNNMON_REDIS_URL`` (a test names its store)."""
    import os

    return {k: v for k, v in os.environ.items() if k != "KNNMON_REDIS_URL"}


def knnmon_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None,
               cwd: str | PathLike[str] | None = None) -> subprocess.CompletedProcess:
    """``knnmon ARGS`` in a child process (in ``cwd``), output captured; ``env`` default: this
    process's without ``$KNNMON_REDIS_URL``."""
    import sys

    return subprocess.run([sys.executable, "-m", "knnmon.coordinator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_cli_env() if env is None else env, cwd=cwd)


def serve_process(url: str, namespace: str, log: str | PathLike[str], *extra: str,
                  workers: int = 2) -> subprocess.Popen:
    """``knnmon serve`` on ``url`` in a child process (``workers`` in-process workers, 5 ms
    batching delay, then ``extra`` flags), its output to the file ``log``."""
    import sys

    with open(log, "w") as fh:
        return subprocess.Popen([sys.executable, "-m", "knnmon.coordinator.cli", "serve", "--redis", url, "--namespace",
                                 namespace, "--workers", str(workers), "--set", "workers.executor=inline", "--set",
                                                             "serve.max_delay_ms=5",
                                 *extra], stdout=fh, stderr=subprocess.STDOUT, env=_cli_env())


def client_round_trip(client, places: list[dict], qid: str, k: int) -> tuple[list[str], list[str]]:
    """Register query ``qid`` at the location of ``places[3]`` with its first keyword through
    ``client`` (a :class:`knnmon.client.KnnClient`), publish ``places``, wait for the service;
    returns the result's ids and the oracle's."""
    q = places[3]
    client.register(qid, q["lon"], q["lat"], q["keywords"][:1], k=k)
    client.publish({"id": o["id"], "lon": o["lon"], "lat": o["lat"], "t": o["t"], "keywords": o["keywords"]}
                   for o in places)
    client.wait(timeout_s=120)
    want = BruteForceKnn(pa.Table.from_pylist(places)).knn(q["lon"], q["lat"], q["keywords"][:1], k)
    return [o for o, _ in client.results(qid)], [o for o, _ in want]


def dump_keys(client: redis.Redis, pattern: str) -> str:
    """Every key matching ``pattern`` with its value, as one string (to search for a secret)."""
    out = []
    for key in client.scan_iter(pattern, count=10_000):
        read = {"string": client.get, "hash": client.hgetall, "set": client.smembers,
                "zset": lambda k: client.zrange(k, 0, -1), "stream": client.xrange}.get(client.type(key))
        out.append(f"{key} {read(key) if read else ''}")
    return "\n".join(out)


def run_exact(url: str, namespace: str, objects_dir: str, queries: pa.Table, workdir: str | PathLike[str]
              ) -> tuple[subprocess.CompletedProcess, str]:
    """``knnmon run`` of ``queries`` over all of ``objects_dir`` (5,000 initial, 2 Ray workers) on
    ``url``, checked against the brute-force oracle; returns the process and its report's text.

    Raises
    ------
    AssertionError
        The run failed, or a result differs from the oracle's.
    """
    import os

    import pyarrow.parquet as pq

    from knnmon.ingest.reading import read_objects, stream_order

    qfile, report = os.path.join(workdir, "q.parquet"), os.path.join(workdir, "run.json")
    scrape = os.path.join(workdir, "run.prom")
    pq.write_table(queries, qfile)
    run = knnmon_cli("run", "--objects", objects_dir, "--queries", qfile, "--workers", "2", "--initial", "5000",
                     "--redis", url, "--namespace", namespace, "--report", report, "--set",
                         f"run.metrics_file={scrape}", "--quiet")
    assert run.returncode == 0, run.stderr[-2000:]
    assert_exact(url, namespace, queries, BruteForceKnn(stream_order(read_objects(objects_dir), None)))
    with open(report, encoding="utf-8") as fh:
        text = fh.read()
    with open(scrape, encoding="utf-8") as fh:
        _assert_scrape_matches(fh.read(), json.loads(text))
    return run, text


def _assert_scrape_matches(scrape: str, summary: dict) -> None:
    """A run's ``run.metrics_file`` counts what its summary does (and parses as Prometheus's text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for f in text_string_to_metric_families(scrape) for s in f.samples if not s.labels}
    applied = summary["objects"] - summary["duplicates_ignored"] - summary["late_ignored"]
    assert samples["knnmon_objects_applied_total"] == applied > 0
    assert samples["knnmon_result_changes_total"] == summary["results_changed"]
    assert samples["knnmon_batch_update_seconds_count"] == summary["batches"]
