"""The Lua script a worker's writes run (:mod:`knnmon.workers.result_writer` describes what it
does), and, in a Redis Cluster, its payload cut by master and sent as one call per master
(:class:`ClusterWrites`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import msgpack

from redis.commands.core import Script

from knnmon.keys import Keys

__all__ = ["APPLY", "PAYLOAD_VERSION", "SECTIONS", "ClusterWrites", "WritePayload"]

#: The version of :class:`WritePayload` that :data:`APPLY` reads; it refuses any other.
PAYLOAD_VERSION = 2


class WritePayload(TypedDict, total=False):
    """One call of :data:`APPLY`, packed with msgpack (``ARGV[1]``): a worker's batch of writes.
    The keys are short because the payload crosses to Redis for every batch.

    ``pv``: :data:`PAYLOAD_VERSION`. ``ns``: the key prefix. ``marker``, ``tag``: the worker's
    idempotency key and this call's value (the script returns -1 if the marker holds it).
    Results: ``q`` the changed queries, ``rep`` (1: each result is replaced, not changed),
    ``ne``/``nl`` per query the number of members that entered/left, ``e`` the entered
    (distance m, object id) pairs, ``l`` the ids that left, in the order of ``q``. Query hashes:
    ``hq`` the queries written whole, ``nf`` per query its field and value count, ``f`` the
    fields and values. Deletes: ``dr`` results, ``dq`` query hashes. The ``queries`` set:
    ``sa`` added, ``sr`` removed. The details hash ``okey``: ``hs`` (id, details, ...) set,
    ``hd`` ids deleted (``dets``: by details hash, before a cluster split). The feed: ``feed``
    (its text; empty: no entry), ``version``, trimmed to ``maxlen`` entries and ``keepms``
    ms, keeping at least ``minentries``."""

    pv: int
    ns: str
    marker: str
    tag: str
    q: list[str]
    rep: int
    ne: list[int]
    e: list[float | str]
    nl: list[int]
    l: list[str]  # noqa: E741 - the script's name
    hq: list[str]
    nf: list[int]
    f: list[str]
    dr: list[str]
    dq: list[str]
    sa: list[str]
    sr: list[str]
    okey: str
    hs: list[str]
    hd: list[str]
    dets: dict[str, tuple[list[str], list[str]]]
    feed: str
    version: int
    maxlen: int
    keepms: int
    minentries: int

APPLY = """
local os_lib = rawget(_G, 'os')
local clock = os_lib and os_lib.clock
local function now_us()
  if clock then return clock() * 1000000 end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local t0 = now_us()
local p = cmsgpack.unpack(ARGV[1])
if p.pv ~= PAYLOAD_VERSION then
  return redis.error_reply('knnmon: a write payload of version ' .. tostring(p.pv) .. ', not PAYLOAD_VERSION')
end
if redis.call('GET', p.marker) == p.tag then return -1 end
local ns = p.ns
local e, l = p.e, p.l
local ei, li = 1, 1
for j = 1, #p.q do
  local rkey = ns .. ':result:' .. p.q[j]
  if p.rep == 1 then redis.call('DEL', rkey) end
  local ne, nl = p.ne[j], p.nl[j]
  if ne > 0 then redis.call('ZADD', rkey, unpack(e, 2 * ei - 1, 2 * (ei + ne - 1))) end
  if nl > 0 then redis.call('ZREM', rkey, unpack(l, li, li + nl - 1)) end
  ei = ei + ne
  li = li + nl
end
local f, fi = p.f, 1
for j = 1, #p.hq do
  local nf = p.nf[j]
  redis.call('HSET', ns .. ':query:' .. p.hq[j], unpack(f, fi, fi + nf - 1))
  fi = fi + nf
end
for _, qid in ipairs(p.dr) do redis.call('DEL', ns .. ':result:' .. qid) end
for _, qid in ipairs(p.dq) do redis.call('DEL', ns .. ':query:' .. qid) end
local sa, sr = p.sa, p.sr
for s = 1, #sa, 2000 do redis.call('SADD', ns .. ':queries', unpack(sa, s, math.min(s + 1999, #sa))) end
for s = 1, #sr, 2000 do redis.call('SREM', ns .. ':queries', unpack(sr, s, math.min(s + 1999, #sr))) end
local hs, hd = p.hs, p.hd
for s = 1, #hs, 2000 do redis.call('HSET', p.okey, unpack(hs, s, math.min(s + 1999, #hs))) end
for s = 1, #hd, 1000 do redis.call('HDEL', p.okey, unpack(hd, s, math.min(s + 999, #hd))) end
if #p.feed > 0 then
  local id = redis.call('XADD', ns .. ':changes', '*', 'version', p.version, 'changes', p.feed)
  redis.call('XTRIM', ns .. ':changes', 'MAXLEN', '~', p.maxlen)
  if p.keepms and redis.call('XLEN', ns .. ':changes') > p.minentries then
    local ms = tonumber(string.match(id, '^(%d+)'))
    redis.call('XTRIM', ns .. ':changes', 'MINID', '~', string.format('%.0f', ms - p.keepms))
  end
end
redis.call('SET', p.marker, p.tag)
return math.floor(now_us() - t0)
""".replace("PAYLOAD_VERSION", str(PAYLOAD_VERSION))

#: The payload's sections by the key they write: per changed result (``q`` with ``ne``/``e``/
#: ``nl``/``l``, split by the result key's master in a cluster), per query hash (``hq`` with
#: ``nf``/``f``), per deleted key (``dr``, ``dq``), and the single keys (the ``queries`` set:
#: ``sa``/``sr``; the details hash: ``hs``/``hd``; the feed: ``feed``).
SECTIONS = {"q": [], "ne": [], "e": [], "nl": [], "l": [], "hq": [], "nf": [], "f": [], "dr": [], "dq": [],
          "sa": [], "sr": [], "hs": [], "hd": [], "feed": ""}


class ClusterWrites:
    """A worker's script calls on a Redis Cluster: one per master and batch (the keys keep their
    names, so one batch's keys live on several masters).

    Parameters
    ----------
    masters : knnmon.redis_cluster.MasterMap
        The cluster's masters and slots.
    keys : Keys
        The key layout.
    worker : int or str
        The worker's id (its markers, one per master).
    bucket_key : callable
        The worker's details hash on a master, from the master's name
        (:meth:`~knnmon.workers.result_writer.ResultWriter.bucket_key`).
    """

    def __init__(self, masters: Any, keys: Keys, worker: int | str, bucket_key: Callable[[str], str]) -> None:
        self.masters, self.keys, self.worker, self.bucket_key = masters, keys, worker, bucket_key
        self.scripts: dict[str, Script] = {}  # master name -> its registered script

    def split(self, payload: WritePayload) -> dict[str, WritePayload]:
        """``payload`` cut into one payload per master of the cluster: each section goes to the
        master of the key it writes (module docstring); every master gets one, empty or not, so
        that its marker says whether the batch reached it. Section names: :data:`SECTIONS`."""
        m, keys = self.masters, self.keys
        out = {name: {k: ([] if k != "feed" else "") for k in SECTIONS} for name in m.names}
        ei = li = 0
        e, lv = payload["e"], payload["l"]
        for qid, ne, nl in zip(payload["q"], payload["ne"], payload["nl"]):
            d = out[m.master_of(keys.result(qid))]
            d["q"].append(qid)
            d["ne"].append(ne)
            d["nl"].append(nl)
            d["e"] += e[2 * ei:2 * (ei + ne)]
            d["l"] += lv[li:li + nl]
            ei, li = ei + ne, li + nl
        fi = 0
        for qid, nf in zip(payload["hq"], payload["nf"]):
            d = out[m.master_of(keys.query(qid))]
            d["hq"].append(qid)
            d["nf"].append(nf)
            d["f"] += payload["f"][fi:fi + nf]
            fi += nf
        for qid in payload["dr"]:
            out[m.master_of(keys.result(qid))]["dr"].append(qid)
        for qid in payload["dq"]:
            out[m.master_of(keys.query(qid))]["dq"].append(qid)
        single = out[m.master_of(keys.queries)]
        single["sa"], single["sr"] = payload["sa"], payload["sr"]
        for name, d in out.items():
            d["okey"] = self.bucket_key(name)
        for okey, (hs, hd) in payload["dets"].items():
            d = out[m.master_of(okey)]
            d["okey"], d["hs"], d["hd"] = okey, hs, hd
        out[m.master_of(keys.changes)]["feed"] = payload["feed"]
        shared = ("pv", "ns", "rep", "version", "maxlen", "keepms", "minentries")
        common = {k: payload[k] for k in shared if k in payload}
        return {name: {**common, **d} for name, d in out.items()}

    def apply(self, payload: WritePayload, tag: str) -> float:
        """One script call per master, in the masters' order with the feed's master last (a
        reader of the feed finds the results it names written); returns the servers' seconds.
        Each call checks and sets the worker's marker (``tag``) on its own master
        (``Keys.worker_batch(worker, tag of the master)``): a re-sent batch changes nothing on a
        master that applied it. A script that finds a key not local (slots moved) makes it read
        the slot table again and send the whole batch again (3 tries).

        Raises
        ------
        redis.exceptions.ResponseError
            Slots still moving after 3 tries, or another script error.
        redis.exceptions.ConnectionError
            A master unreachable (the caller retries: :func:`knnmon.connection.with_retries`).
        """
        from redis.exceptions import ResponseError

        for moved in range(3):
            try:
                return self._send(payload, tag)
            except ResponseError as ex:
                if moved == 2 or ("non local key" not in str(ex) and "MOVED" not in str(ex)):
                    raise
                self.masters.refresh()
                self.scripts.clear()
        raise AssertionError("unreachable")

    def _send(self, payload: WritePayload, tag: str) -> float:
        last = self.masters.master_of(self.keys.changes)
        parts = self.split(payload)
        total = 0.0
        for name in sorted(parts, key=lambda n: n == last):
            script = self.scripts.get(name)
            if script is None:
                script = self.scripts[name] = self.masters.connection(name).register_script(APPLY)
            marker = self.keys.worker_batch(self.worker, self.masters.tag_of(name))
            us = script(args=[msgpack.packb({**parts[name], "marker": marker, "tag": tag})])
            total += max(int(us), 0) / 1e6
        return total
