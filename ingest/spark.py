"""SparkSession wiring for the ingest jobs (kept apart from the pure transforms)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from importlib import resources

__all__ = ["DEFAULT_MASTER", "require_spark", "spark_session"]

DEFAULT_MASTER = "local[*]"

#: Lines the JVM prints at every start that say nothing to a knnmon user (pyspark 4 starts the
#: driver with ``--add-modules=jdk.incubator.vector``, and the JVM announces it).
JVM_NOISE = (b"WARNING: Using incubator modules",)


def require_spark() -> None:
    """Raise unless pyspark is installed (the ingest's extra: a node that only serves needs
    neither pyspark nor Java).

    Raises
    ------
    KnnmonError
        pyspark is not installed; the message says how to install it.
    """
    from knnmon.errors import KnnmonError

    try:
        import pyspark  # noqa: F401
    except ImportError as ex:
        raise KnnmonError("ingest runs on Spark, which is not installed here: pip install 'knnmon[spark]' "
                          "(and Java 17+)") from ex


def spark_session(master: str = DEFAULT_MASTER, app_name: str = "knnmon-ingest", *, shuffle_partitions: int = 4,
                  driver_memory: str = "4g"):
    """Start (or join) a SparkSession configured for knnmon.

    Parameters
    ----------
    master
        Any Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``, ...).
    shuffle_partitions
        ``spark.sql.shuffle.partitions``; small by default because the reference machine has
        2 cores (the data is ~1.4 M rows).
    driver_memory
        ``spark.driver.memory``; only takes effect when this call starts the JVM.

    Notes
    -----
    ``PYSPARK_PYTHON`` is set to this interpreter (unless already set) so that Python UDFs run
    with the same environment as the driver. The Spark UI and console progress bars are off
    (ingest is a batch job) and Spark logs only errors (``knnmon/data/log4j2.properties``).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a local job needs no external interface
    from pyspark.sql import SparkSession

    log_config = resources.files("knnmon").joinpath("data", "log4j2.properties")
    with _jvm_noise_filtered():  # (the JVM starts here, and keeps the standard error it was given)
        spark = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
            .config("spark.driver.memory", driver_memory)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_config}")
            .getOrCreate()
        )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def _jvm_noise_filtered() -> Iterator[None]:
    """While the block runs (and the JVM it starts lives), file descriptor 2 is a pipe whose
    reader passes every line on to the real standard error but those starting with
    :data:`JVM_NOISE`. This process's own descriptor 2 is restored when the block ends; the JVM
    keeps the pipe, and its reader ends with it."""
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    saved, out = os.dup(2), os.dup(2)
    os.dup2(write_fd, 2)
    os.close(write_fd)

    def pump() -> None:
        with os.fdopen(read_fd, "rb") as lines, os.fdopen(out, "wb", buffering=0) as err:
            for line in lines:
                if not line.startswith(JVM_NOISE):
                    err.write(line)

    threading.Thread(target=pump, name="jvm-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
