"""``ingest tweets`` in both forms (CSV, API v1.1 JSON lines) plus injected bad records: on tweets the
test generates (the default suite; real tweets are never committed) and, with ``-m slow``, on the
real ones in ``../shared/data``."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from knnmon.errors import InputPathError
from knnmon.ingest.jobs import ingest_tweets
from knnmon.keywords import normalize_keywords

N_CSV, N_JSON = 600, 600


def created_ms(s: str) -> int:
    return int(datetime.strptime(s, "%a %b %d %H:%M:%S %z %Y").timestamp() * 1000)


def api_json(row: dict, extended: bool) -> dict:
    """A tweet in Twitter API v1.1 form, as the streaming API delivered it."""
    d = {"created_at": row["created_at"], "id": int(row["id"]), "id_str": row["id"],
         "user": {"screen_name": row["username"]}, "truncated": extended,
         "coordinates": {"type": "Point", "coordinates": [float(row["lng"]), float(row["lat"])]},
         "text": row["text"][:20] + "…" if extended else row["text"]}
    if extended:
        d["extended_tweet"] = {"full_text": row["text"]}
    return d


#: Points many tweets share, as Twitter's place centroids make them (lon, lat).
CENTROIDS = [(-118.4119065, 34.0207895), (-95.44648649999999, 29.838495), (-73.9685415, 40.780709),
             (-87.6244212, 41.8755546)]
WORDS = ["coffee", "snow", "today", "game", "tonight", "pizza", "beach", "concert", "traffic", "sunset", "café",
         "niño", "Brooklyn", "happy", "birthday", "weekend", "rain", "walking", "dog", "music"]
NOISE = ["@bob", "@Some_One", "https://t.co/WoRX4uILXH", "🥰", "🔥🔥", "$TSLA", "&amp;", "…", "#NYC", "#GoBlue"]


def generated_rows(n: int, seed: int, first: datetime) -> list[dict]:
    """``n`` tweet-shaped rows (the real files' columns: ``id``, ``username``, ``created_at``,
    ``lng``, ``lat``, ``text``), as the real ones are: 19-digit increasing ids, Twitter's time
    format over ten minutes from ``first``, points in the US with a fifth on shared centroids and
    a few at (0, 0), texts with commas, quotes, mentions, URLs, emoji and accents, some without
    any keyword."""
    import random
    from datetime import timedelta

    rng = random.Random(seed)
    rows, tid = [], 1514074195759616002 + seed * 10**12
    for i in range(n):
        tid += rng.randrange(1, 10**9)
        when = first + timedelta(seconds=600 * i / n)
        u = rng.random()
        if u < 0.01:
            lon, lat = 0.0, 0.0
        elif u < 0.2:
            lon, lat = rng.choice(CENTROIDS)
        else:
            lon, lat = rng.uniform(-124.7, -67.0), rng.uniform(25.1, 49.3)
        if rng.random() < 0.05:
            text = " ".join(rng.sample(NOISE, 3))  # no keyword left after normalisation
        else:
            parts = rng.sample(WORDS, rng.randint(1, 6)) + rng.sample(NOISE, rng.randint(0, 2))
            rng.shuffle(parts)
            text = " ".join(parts)
            if rng.random() < 0.3:
                text = f'"{text}," she said, "{rng.choice(WORDS)}!"'
        rows.append({"id": str(tid), "username": f"user_{rng.randrange(10**6)}",
                     "created_at": when.strftime("%a %b %d %H:%M:%S +0000 %Y"), "lng": repr(lon), "lat": repr(lat),
                     "text": text})
    return rows


def read_rows(path: Path, n: int) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return [r for _, r in zip(range(n), csv.DictReader(fh))]


def natural_outcome(row: dict) -> str | None:
    """Reason a real tweet is rejected, by the documented rules (None = kept)."""
    lon, lat = float(row["lng"]), float(row["lat"])
    assert math.isfinite(lon) and -180 <= lon <= 180 and -90 <= lat <= 90
    if lon == 0 and lat == 0:
        return "null_island"  # a phone without a position
    return None if normalize_keywords(row["text"]) else "no_keywords"


BASE = {"created_at": "Sat Apr 23 18:00:00 +0000 2022", "id_str": "900", "text": "zebra crossing",
        "coordinates": {"type": "Point", "coordinates": [-100.0, 40.0]}}
JSON_INJECTED = [
    ('{"created_at": "Sat Apr 23 18:00:00 +0000 2022", "id_str": ', "malformed_json"),
    (json.dumps({**BASE, "id_str": "901", "coordinates": None, "place": {"full_type": "city"}}), "missing_coordinates"),
    (json.dumps({**BASE, "id_str": "902", "coordinates": {"type": "Point", "coordinates": [-100.0, -91.0]}}),
     "latitude_out_of_range"),
    (json.dumps({**BASE, "id_str": "903", "coordinates": {"type": "Point", "coordinates": [200.0, 40.0]}}),
     "longitude_out_of_range"),
    (json.dumps({**BASE, "id_str": "904", "coordinates": {"type": "Point", "coordinates": ["x", "y"]}}),
     "non_numeric_coordinates"),
    (json.dumps({**BASE, "id_str": "905", "created_at": "yesterday"}), "bad_time"),
    (json.dumps({**BASE, "id_str": "909", "coordinates": {"type": "Point", "coordinates": [0.0, 0.0]}}), "null_island"),
    (json.dumps({**BASE, "id_str": "906", "text": "@bob 🥰 https://t.co/x"}), "no_keywords"),
    (json.dumps({k: v for k, v in BASE.items() if k != "id_str"}), "missing_id"),
    (json.dumps({**BASE, "created_at": "Fri Apr 22 18:00:00 +0000 2022"}), "duplicate_id"),  # older copy of 900
    (json.dumps({**BASE, "id_str": "910", "created_at": "Sat Apr 23 18:00:00 +0000 2300"}), "future"),
]
CSV_INJECTED = [
    ('7001,someone,Sat Apr 23 18:00:00 +0000 2022,-100.0', "malformed_csv"),
    ('7002,someone,Sat Apr 23 18:00:00 +0000 2022,-100.0,40.0,text,extra,fields', "malformed_csv"),
]


@pytest.fixture(scope="module", params=["generated", pytest.param("real", marks=pytest.mark.slow)])
def tweets_run(request, spark, tmp_path_factory):
    src = tmp_path_factory.mktemp("tweets_in")
    if request.param == "real":
        shared = request.getfixturevalue("shared_data")
        csv_rows = read_rows(shared / "tweets" / "geotweets01.csv", N_CSV)
        json_rows = read_rows(shared / "tweets" / "geotweets02.csv", N_JSON)
    else:
        from datetime import timezone

        csv_rows = generated_rows(N_CSV, 1, datetime(2022, 4, 13, 2, 53, 13, tzinfo=timezone.utc))
        json_rows = generated_rows(N_JSON, 2, datetime(2022, 4, 23, 17, 59, 0, tzinfo=timezone.utc))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["id", "username", "created_at", "lng", "lat", "text"], lineterminator="\n")
    w.writeheader()
    w.writerows(csv_rows)
    w.writerow({"id": "7003", "username": "multi", "created_at": "Sat Apr 23 18:00:00 +0000 2022",
                "lng": "-100.5", "lat": "40.5", "text": 'Line one, "quoted"\nline two walrus'})
    (src / "tweets.csv").write_text(buf.getvalue() + "\n".join(r for r, _ in CSV_INJECTED) + "\n")
    lines = [json.dumps(api_json(r, extended=i % 3 == 0)) for i, r in enumerate(json_rows)]
    lines += [json.dumps(BASE)]
    lines += [json.dumps({**BASE, "id_str": "908", "created_at": None, "timestamp_ms": "1650736800000"})]
    lines += [r for r, _ in JSON_INJECTED]
    (src / "tweets.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path_factory.mktemp("tweets_out")
    manifest = ingest_tweets([str(src / "tweets.csv"), str(src / "tweets.jsonl")], str(out), grid_n=8)
    return {"out": Path(out), "manifest": manifest, "csv_rows": csv_rows, "json_rows": json_rows}


def test_counts_and_reasons(tweets_run):
    expected = Counter(r for _, r in JSON_INJECTED + CSV_INJECTED)
    for row in tweets_run["csv_rows"] + tweets_run["json_rows"]:
        if natural_outcome(row):
            expected[natural_outcome(row)] += 1
    rec = tweets_run["manifest"].records
    assert rec.rejected_by_reason == dict(expected)
    read = N_CSV + 1 + len(CSV_INJECTED) + N_JSON + 2 + len(JSON_INJECTED)
    assert rec.read == read == rec.kept + rec.rejected
    assert tweets_run["manifest"].source.forms == {"json": 1, "csv": 1}


def test_rejects_keep_the_original_record(tweets_run):
    rejects = [json.loads(x) for f in (tweets_run["out"] / "rejects").glob("*.json") for x in f.open()]
    by_record = {r["record"]: r["reason"] for r in rejects}
    for record, reason in JSON_INJECTED + CSV_INJECTED:
        assert by_record[record] == reason, record
    # A record from the future: its detail gives both times; the manifest the clock and bound.
    clock = tweets_run["manifest"].source.event_time["clock_ms"]
    assert tweets_run["manifest"].source.event_time["max_future_ms"] == 60_000
    future = [r for r in rejects if r["reason"] == "future"]
    assert len(future) == 1 and f"t={created_ms('Sat Apr 23 18:00:00 +0000 2300')}" in future[0]["detail"]
    assert f"({clock})" in future[0]["detail"]


def test_kept_tweets_from_both_forms(tweets_run):
    got = {o["id"]: o for o in pq.read_table(tweets_run["out"] / "objects.parquet").to_pylist()}
    for row in tweets_run["csv_rows"] + tweets_run["json_rows"]:
        if natural_outcome(row):
            assert row["id"] not in got
            continue
        o = got[row["id"]]  # ids are the exact source strings (no float rounding of 19-digit ids)
        assert o["t"] == created_ms(row["created_at"])
        assert (o["lon"], o["lat"]) == (float(row["lng"]), float(row["lat"]))
        assert o["keywords"] == normalize_keywords(row["text"])  # extended_tweet.full_text, not the cut text
    assert got["7003"]["keywords"] == ["line", "one", "quoted", "two", "walrus"]  # quoted newline in CSV
    assert got["900"]["t"] == created_ms(BASE["created_at"])  # the newer of the duplicates
    assert got["908"]["t"] == 1650736800000  # timestamp_ms when created_at is missing


def test_a_file_in_neither_form_fails_before_spark(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(InputPathError, match="not a tweet file"):
        ingest_tweets([str(bad)], str(tmp_path / "out"))
