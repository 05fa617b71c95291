"""Where each query lives, as its hash says: the ``worker``, ``objects`` (its details hash) and
``set`` fields a resuming service's load writes (:func:`record_placements`, only where the new
plan moved the query), and the workers' details hashes it clears first
(:func:`clear_object_details`; the workers write theirs anew). The result writer's script writes
them at registration (:mod:`knnmon.workers.result_writer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redis.cluster import RedisCluster

from knnmon.connection import connect, with_retries
from knnmon.keys import Keys
from knnmon.workers.result_writer import details_key

__all__ = ["clear_object_details", "placement_number", "placement_of", "record_placements"]


def clear_object_details(redis_url: str, namespace: str) -> None:
    """Delete every worker's object details hash (a resuming service's workers write theirs anew).

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    client = connect(redis_url)
    try:
        found = list(client.scan_iter(match=Keys(namespace).objects("*"), count=1000))
        if found:
            with_retries(lambda: client.unlink(*found), "clearing the object details", redis_url)
    finally:
        client.close()


#: The fields a re-balancing's move notes in a query hash (a resumed service drops them).
_MOVED = ("moved_from", "moved_batch", "moved_replan")

#: :func:`record_placements` on one Redis: ARGV = the query hashes' key prefix, then per query
#: its id, worker, details hash and set ("": left as is).
_PLACE = """
local prefix = ARGV[1]
for i = 2, #ARGV, 4 do
  local key = prefix .. ARGV[i]
  if ARGV[i + 3] ~= '' then
    redis.call('HSET', key, 'worker', ARGV[i + 1], 'objects', ARGV[i + 2], 'set', ARGV[i + 3])
  else
    redis.call('HSET', key, 'worker', ARGV[i + 1], 'objects', ARGV[i + 2])
  end
  redis.call('HDEL', key, %s)
end
return 0
""" % ", ".join(f"'{f}'" for f in _MOVED)


def placement_number(field: str | None) -> int | None:
    """A placement field read as a number >= 0 (a worker, a set); ``None`` if it is not one. The
    fields come from Redis, where any client may have written anything."""
    text = (field or "").strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) < 19 else None


def placement_of(fields: Mapping[str, str]) -> tuple[str | None, str | None, str | None, bool]:
    """A query hash's placement as :func:`record_placements` writes it: ``(worker, objects,
    set, whether a re-balancing's move is noted)``, the fields as stored (``None``: absent)."""
    return fields.get("worker"), fields.get("objects"), fields.get("set"), any(f in fields for f in _MOVED)


def record_placements(redis_url: str, namespace: str, placements: Sequence[tuple[str, int]],
                      sets: Mapping[str, int], chunk: int = 10_000,
                      held: Mapping[str, tuple[str | None, str | None, str | None, bool]] | None = None) -> int:
    """Write each query's worker, details hash and set in the plan (``worker``, ``objects``,
    ``set``) into its hash, and drop what an earlier service's re-balancing noted there (a
    resumed service places every query anew); returns how many hashes were written.

    Parameters
    ----------
    placements
        ``(query id, worker)`` of every query.
    sets
        Query id -> its set in the plan (where the plan has sets).
    held
        Query id -> its hash's :func:`placement_of` as Redis holds it (a resuming service read
        them): a query placed there already is not written again (most are, when the plan
        places it where the last one did).

    Raises
    ------
    StoreUnavailableError
        Redis unreachable after every retry.
    """
    keys = Keys(namespace)
    held = held or {}
    client = connect(redis_url)
    written = 0
    try:
        masters = None
        if isinstance(client, RedisCluster):
            from knnmon.redis_cluster import MasterMap

            masters = MasterMap(client)
        script = client.register_script(_PLACE) if masters is None else None
        for s in range(0, len(placements), chunk):
            rows = []
            for qid, w in placements[s:s + chunk]:
                objects = details_key(keys, w, qid, masters)
                was = held.get(qid)
                put = str(sets[qid]) if qid in sets else ""
                if was is None or was != (str(w), objects, put or was[2], False):
                    rows.append((qid, str(w), objects, put))
            if not rows:
                continue
            written += len(rows)
            if script is not None:  # one call per chunk: ~10x fewer round trips' worth of client work
                flat = [keys.query("")] + [x for row in rows for x in row]
                with_retries(lambda flat=flat: script(args=flat), "recording the queries' workers", redis_url)
                continue
            pipe = client.pipeline(transaction=False)  # a cluster: the hashes lie on many masters
            for qid, w, objects, put in rows:
                pipe.hset(keys.query(qid), mapping={"worker": w, "objects": objects, **({"set": put} if put else {})})
                pipe.hdel(keys.query(qid), *_MOVED)
            with_retries(pipe.execute, "recording the queries' workers", redis_url)
    finally:
        client.close()
    return written
