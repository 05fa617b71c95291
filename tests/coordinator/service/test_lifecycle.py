"""One service per namespace: a second one is refused while the first runs, and may start as
soon as the first has stopped (its last status says so)."""

from __future__ import annotations

import pytest

from knnmon.coordinator.runtime.config import RunConfig
from knnmon.coordinator.service.config import ServeConfig
from knnmon.coordinator.service.loop import Service
from knnmon.errors import KnnmonError
from knnmon.store import StoreConfig


def test_a_service_closed_without_running_lets_the_next_one_start(redis_url, namespace):
    config = ServeConfig(run=RunConfig(workers=1, executor="inline", store=StoreConfig(url=redis_url, namespace=namespace)))
    with Service(config):
        with pytest.raises(KnnmonError, match="is running in namespace"):
            Service(config).start()  # a second service in the same namespace is refused
    with Service(config) as again:  # the first one said it stopped
        assert again.run(idle_exit_s=0.2, handle_signals=False)["batches"] == 0
