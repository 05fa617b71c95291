"""A pyarrow Table as one Arrow IPC stream's bytes, and back: how a batch's table travels
between processes (pickling the table itself serialises each column's buffers apart)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["ipc_of_table", "table_of_ipc"]


def ipc_of_table(table: Any) -> Any:
    """``table`` (a pyarrow Table) as one Arrow IPC stream's ``bytes``; anything else as it is."""
    if not isinstance(table, pa.Table):
        return table
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def table_of_ipc(data: Any) -> Any:
    """The table of :func:`ipc_of_table`'s bytes; anything else as it is."""
    return pa.ipc.open_stream(data).read_all() if isinstance(data, bytes) else data
