"""A worker's Redis writes on one background thread, applied in the order they were submitted.

With the queue, a worker hands a batch's script call (:meth:`ResultWriter.write_batch`) to the
thread and goes on to the next batch while Redis runs the script: the worker's Python work and
the Redis server's work overlap (on 2 cores, one runs the worker, the other Redis). The
coordinator then asks for the batch's write (:meth:`WriteQueue.wait`) before it counts the
batch as done, so a batch's update time still ends when its results are in Redis.

Order and exactness: one thread runs every write, first in first out, so batches reach Redis in
stream order, and registrations and deletions (:meth:`WriteQueue.now`) wait behind the batches
submitted before them. Once a write fails (after :func:`knnmon.connection.with_retries`), every
later one fails too without touching Redis: a batch is never applied after an earlier one was
lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from knnmon.batch import BatchChanges
from knnmon.errors import StoreUnavailableError
from knnmon.reports import WriteFigures
from knnmon.workers.result_writer import ResultWriter

__all__ = ["WriteQueue"]


class WriteQueue:
    """Runs a :class:`ResultWriter`'s calls on one thread, in order (module docstring).

    Parameters
    ----------
    writer
        The worker's writer; after this, only the queue's thread may use it.
    """

    def __init__(self, writer: ResultWriter) -> None:
        self.writer = writer
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"knnmon-writer-{writer.worker}")
        self._pending: dict[int, Future] = {}
        self._failed: BaseException | None = None

    def _run(self, fn: Callable[..., Any], *args: Any) -> tuple[float, float, Any]:
        """``(wall s, this thread's CPU s, fn's result)``; refuses to run after a failed write."""
        if self._failed is not None:
            raise StoreUnavailableError(f"worker {self.writer.worker}: an earlier Redis write failed, so later "
                                        f"ones are not applied: {self._failed}") from self._failed
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            out = fn(*args)
        except BaseException as e:
            self._failed = e
            raise
        return time.perf_counter() - t0, time.thread_time() - c0, out

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Queue ``fn(*args)`` (a writer method; the arguments must not change afterwards). The
        future's result is ``(wall s, CPU s, fn's result)``; it raises what the write raised."""
        return self._thread.submit(self._run, fn, *args)

    def submit_batch(self, tag: int, changes: BatchChanges) -> None:
        """Queue :meth:`ResultWriter.write_batch` of batch ``tag`` for :meth:`wait`."""
        self._pending[tag] = self.submit(self.writer.write_batch, tag, changes)

    def wait(self, tag: int) -> WriteFigures:
        """Wait until batch ``tag`` is written (with every write queued before it); its figures
        (all 0 if no write was queued for ``tag``).

        Raises
        ------
        StoreUnavailableError
            The write (or an earlier one) failed.
        """
        fut = self._pending.pop(tag, None)
        if fut is None:
            return WriteFigures()
        wall, cpu, server = fut.result()
        return WriteFigures(redis_s=wall, redis_server_s=server, writer_cpu_s=cpu)

    def now(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (a writer method) after every queued write, and return its result."""
        return self.submit(fn, *args).result()[2]

    def close(self) -> None:
        """Finish the queued writes and stop the thread (errors of unwaited writes are dropped
        here; :meth:`wait` reports them)."""
        self._thread.shutdown(wait=True)
