"""``knnmon explain QID``: where a query is and why -- its worker, its set in the plan, when it
moved and why -- read from Redis only, so it works beside a running ``knnmon serve`` and after a
``knnmon run``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from knnmon.connection import connect, with_retries
from knnmon.coordinator.cli.options import add_store_options, add_verb, store_config
from knnmon.errors import KnnmonError
from knnmon.keys import REPLANS_KEPT, Keys
from knnmon.results import ResultReader, StoredQuery
from knnmon.store import open_store

__all__ = ["add_explain_command", "explain_query"]


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _record(raw: str | None) -> dict[str, Any] | None:
    """A JSON object knnmon wrote to Redis, or ``None`` (missing, or not an object)."""
    r = _json(raw)
    return r if isinstance(r, dict) else None


def _fmt(x: Any, spec: str) -> str:
    """A number formatted, or ``?`` for anything else (a record someone else wrote)."""
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


def explain_query(url: str, namespace: str, qid: str) -> dict[str, Any]:
    """What Redis says about where query ``qid`` is and why.

    Returns
    -------
    dict
        ``query`` (``lon``, ``lat`` degrees, ``keywords``, ``k``), ``worker``, ``kth_m`` (its
        k-th neighbour's distance in meters, ``None`` below ``k``), ``plan`` (``algorithm``,
        ``workers``), ``set`` (its set's number and record, ``None`` if registered at run time),
        ``moved`` (``None``, or ``batch``, ``from``, and the re-plan's record ``replan``).

    Raises
    ------
    KnnmonError
        No such query in the namespace.
    """
    keys = Keys(namespace)
    client = connect(url)

    def read() -> dict[str, Any]:
        reader = ResultReader(client, keys)
        h = reader.query_hash(qid)
        if not h:
            raise KnnmonError(f"no query {qid!r} in namespace {keys.namespace!r}")
        query = StoredQuery.of(qid, h, keys).as_dict()
        k = query["k"]
        last = reader.last(qid)
        n = client.zcard(keys.result(qid))
        number = _int(h.get("set"))
        set_record = _record(client.hget(keys.plan, f"set:{number}")) if number is not None else None
        plan = {"algorithm": client.hget(keys.plan, "algorithm"), "workers": _int(client.hget(keys.plan, "workers"))}
        moved = None
        replan_no = _int(h.get("moved_replan"))
        if replan_no is not None:
            record = None
            for raw in client.lrange(keys.replans, 0, REPLANS_KEPT - 1):
                r = _record(raw)
                if r is not None and r.get("replan") == replan_no:
                    record = r
                    break
            moved = {"batch": _int(h.get("moved_batch")), "from": _int(h.get("moved_from")), "replan": record}
        return {"query": {x: query[x] for x in ("id", "lon", "lat", "keywords", "k")},
                "worker": query["worker"], "kth_m": last[1] if last and k is not None and n >= k else None,
                "plan": plan, "set": None if number is None else {"number": number, **(set_record or {})},
                "moved": moved}

    try:
        return with_retries(read, f"explaining {qid}", url)
    finally:
        client.close()


def format_explanation(e: dict[str, Any]) -> str:
    """:func:`explain_query`'s answer as readable lines."""
    q, plan = e["query"], e["plan"]
    lines = [f"query {q['id']}: k={q['k']} at ({q['lon']}, {q['lat']}), keywords {' '.join(q['keywords'])}",
             f"  worker {e['worker']}; kNN radius "
             + (f"{e['kth_m']:,.1f} m" if e["kth_m"] is not None else "unbounded (fewer than k matches so far)")]
    s = e["set"]
    if s is None:
        lines.append("  registered at run time: placed on the least-loaded worker among the plan's sets holding "
                     "its location (docs/concepts.md, \"Runtime registration\")")
    else:
        w = s.get("worker")
        how = ("its set's queries dealt out one by one" if isinstance(w, int) and w < 0
               else f"the whole set on worker {_fmt(w, 'd')}, longest-processing-time greedy")
        lines.append(f"  set {s['number']} of the {plan['algorithm']} plan over {plan['workers']} workers: "
                     f"{_fmt(s.get('queries'), ',')} queries, work L(Q) = {_fmt(s.get('work'), '.6g')}; {how}")
        history = s.get("history")
        lines += [f"    {n}. {step}" for n, step in enumerate(history if isinstance(history, list) else [], 1)]
    m = e["moved"]
    if m is None:
        lines.append("  never moved: it is where the plan put it" if s is not None else "  never moved")
    else:
        r = m["replan"] or {}
        lines.append(f"  moved from worker {m['from']} after batch {m['batch']} by re-plan {r.get('replan', '?')}")
        if r:
            def listed(key: str) -> str:
                xs = r.get(key)
                return ", ".join(_fmt(x, ".1f") for x in xs) if isinstance(xs, list) else "?"

            gain = r.get("predicted_gain")
            lines.append(f"    why: slowest / mean worker busy time {_fmt(r.get('trigger'), '.2f')} over the last "
                         f"batches (busy ms per batch: {listed('busy_ms')}); predicted after the move: "
                         f"{listed('predicted_ms')} ({_fmt(gain * 100 if isinstance(gain, (int, float)) else None, '.1f')}"
                         f" % off the slowest); {_fmt(r.get('queries_moved'), ',')} queries moved in that re-plan")
        else:
            lines.append("    (the re-plan's record is no longer kept)")
    return "\n".join(lines)


def _explain(a: argparse.Namespace) -> int:
    config = store_config(a)
    with open_store(config, existing=True) as store:
        e = explain_query(store.url, config.namespace, a.qid)
    print(json.dumps(e, indent=2) if a.json else format_explanation(e))
    return 0


def add_explain_command(sub: Any) -> None:
    """Register ``explain`` on a root parser's subparsers."""
    q = add_verb(sub, "explain", "where a query is and why: its worker, its set, when it moved and why")
    q.add_argument("qid", metavar="QID", help="the query's id")
    q.add_argument("--json", action="store_true", help="print JSON")
    add_store_options(q)
    q.set_defaults(func=_explain)
