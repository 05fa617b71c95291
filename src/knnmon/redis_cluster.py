"""Redis Cluster: detecting one behind a URL, grouping keys by master, and a local cluster.

knnmon works with any ``--redis URL`` that points at a node of a Redis Cluster (detected from
``INFO cluster``, :func:`knnmon.connection.connect`). Its keys keep their names
(:class:`knnmon.keys.Keys`): results and query hashes spread over the cluster's hash slots, so
a worker's batch touches several masters. The worker therefore groups its writes by master
(:class:`MasterMap`) and sends one script call per master, which may touch keys of many slots
on that master (a script's keys must be local to the node that runs it; Redis 7+ lets a script
without flags touch several local slots). Every master keeps the worker's idempotency marker in
one of its own slots (:meth:`knnmon.keys.Keys.worker_batch` with :meth:`MasterMap.tag_of`), so
each master applies a batch exactly once (:mod:`knnmon.workers.result_writer`).

:class:`LocalCluster` starts a cluster of masters on loopback ports from a ``redis-server``
binary, with slots assigned by ``CLUSTER ADDSLOTSRANGE`` and nodes joined by ``CLUSTER MEET``:
the tests' and benchmarks' cluster, and a sketch of what ``deploy/redis-cluster.sh`` does.
"""

from __future__ import annotations

import functools
import time
import numpy as np
import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS
from redis.crc import key_slot as crc_key_slot

from knnmon.errors import KnnmonError

__all__ = ["SLOTS", "LocalCluster", "MasterMap", "is_cluster", "key_slot", "slot_tag"]

#: Hash slots of a Redis Cluster (16384).
SLOTS = REDIS_CLUSTER_HASH_SLOTS


def key_slot(key: str) -> int:
    """The hash slot of ``key`` (Redis Cluster specification, "Keys distribution model": CRC16 of
    its hash tag, the part between the first ``{`` and the next ``}`` if not empty, else of the
    whole key, modulo 16384), as redis-py computes it (:func:`redis.crc.key_slot`)."""
    return crc_key_slot(key.encode())


@functools.lru_cache(maxsize=1024)
def slot_tag(slot: int) -> str:
    """The shortest decimal string whose hash slot is ``slot`` (put between ``{}`` in a key
    name, it places the key in that slot: e.g. a marker per master).

    Raises
    ------
    ValueError
        ``slot`` outside 0..16383.
    """
    if not 0 <= slot < SLOTS:
        raise ValueError(f"hash slot {slot} outside 0..{SLOTS - 1}")
    i = 0
    while crc_key_slot(str(i).encode()) != slot:
        i += 1
    return str(i)


def is_cluster(client: redis.Redis) -> bool:
    """Whether the server ``client`` talks to runs in cluster mode (``INFO cluster``)."""
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:
        return False


class MasterMap:
    """Which master serves each hash slot, as a cluster client sees it now.

    Parameters
    ----------
    cluster : redis.cluster.RedisCluster
        A connected cluster client; :meth:`refresh` re-reads its slot table after a ``MOVED``.
    """

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.refresh(initialize=False)

    def refresh(self, initialize: bool = True) -> None:
        """Read the slot table (``initialize``: ask the cluster again first)."""
        if initialize:
            self.cluster.nodes_manager.initialize()
        names: list[str] = []
        owner = np.full(SLOTS, -1, dtype=np.int32)
        for slot, nodes in self.cluster.nodes_manager.slots_cache.items():
            name = nodes[0].name
            if name not in names:
                names.append(name)
            owner[slot] = names.index(name)
        self.names, self.owner = names, owner
        #: Master name -> :func:`slot_tag` of the first slot it serves.
        self.tags = {name: slot_tag(int(np.flatnonzero(owner == i)[0])) for i, name in enumerate(names)}

    def master_of(self, key: str) -> str:
        """The name (``host:port``) of the master serving ``key``.

        Raises
        ------
        KnnmonError
            No master serves its slot (the cluster is not fully covered).
        """
        i = self.owner[key_slot(key)]
        if i < 0:
            raise KnnmonError(f"no master of the Redis Cluster serves the slot of {key[:100]!r}")
        return self.names[i]

    def tag_of(self, name: str) -> str:
        """A hash tag (:func:`slot_tag`) of the first slot master ``name`` serves."""
        return self.tags[name]

    def connection(self, name: str) -> redis.Redis:
        """A client of master ``name`` alone (its script calls)."""
        return self.cluster.get_redis_connection(self.cluster.get_node(node_name=name))


class LocalCluster:
    """``masters`` ``redis-server`` processes on 127.0.0.1 forming one Redis Cluster, the 16,384
    slots split evenly; no replicas, data in a temporary directory removed on :meth:`stop`.

    Parameters
    ----------
    masters : int
        Number of masters (>= 1).
    binary : str or None
        The ``redis-server`` (7.0+ for ``ADDSLOTSRANGE``; default: the embedded one,
        :func:`knnmon.redis_server.redis_server_binary`).
    start_timeout_s : float
        Seconds to wait until every node reports ``cluster_state:ok``.

    Raises
    ------
    KnnmonError
        A server does not start, or the cluster is not ``ok`` in time.

    Examples
    --------
    >>> with LocalCluster(3) as cluster:                 # doctest: +SKIP
    ...     cluster.url
    'redis://127.0.0.1:40123/0'
    """

    def __init__(self, masters: int = 3, binary: str | None = None, start_timeout_s: float = 30.0) -> None:
        if masters < 1:
            raise KnnmonError(f"a cluster needs at least one master; got {masters}")
        self.masters, self.binary, self.start_timeout_s = masters, binary, start_timeout_s
        self.servers: list = []

    @property
    def url(self) -> str:
        """The URL of the first master (any node's URL reaches the whole cluster)."""
        return self.servers[0].url

    def start(self) -> LocalCluster:
        from knnmon.redis_server import EmbeddedRedis, free_port

        try:
            bus_ports = [free_port() for _ in range(self.masters)]  # (else port + 10000: maybe taken, or > 65535)
            for bus in bus_ports:  # (each in a temporary directory of its own)
                self.servers.append(EmbeddedRedis(None, binary=self.binary, extra_args=(
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "5000", "--cluster-port", str(bus))).start())
            clients = [redis.Redis(host="127.0.0.1", port=s.port, decode_responses=True) for s in self.servers]
            bounds = np.linspace(0, SLOTS, self.masters + 1).astype(int)
            for c, a, b in zip(clients, bounds[:-1], bounds[1:]):
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", int(a), int(b) - 1)
            for c in clients[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.servers[0].port, bus_ports[0])
            deadline = time.monotonic() + self.start_timeout_s
            while not all(c.cluster("info").get("cluster_state") == "ok"
                          and int(c.cluster("info").get("cluster_known_nodes", 0)) == self.masters for c in clients):
                if time.monotonic() > deadline:
                    raise KnnmonError(f"the local Redis Cluster of {self.masters} masters was not ok within "
                                      f"{self.start_timeout_s} s")
                time.sleep(0.1)
            for c in clients:
                c.close()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server and remove the data; idempotent."""
        for s in self.servers:
            s.stop()
        self.servers = []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
