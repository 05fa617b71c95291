"""``knnmon config``: the effective settings and where each came from
(:mod:`~knnmon.coordinator.cli.settings`)."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.coordinator.cli.options import add_config_options, add_verb, settings_of
from knnmon.coordinator.cli.settings import DURATIONS, Loaded

__all__ = ["add_config_command", "describe"]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _duration_text(ms: int) -> str:
    if ms == 0:
        return "0s"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def describe(loaded: Loaded) -> str:
    """The effective settings as TOML, each line with its source as a comment; the Redis URL's
    password masked, durations as such (``"15m"``). A setting without a value (none) is a
    comment. The text is itself a config file of the same settings."""
    from knnmon.connection import redact

    out: list[str] = []
    for section, model in loaded.settings:
        out.append(f"[{section}]")
        for key, value in model:
            if section == "redis" and key == "url" and value is not None:
                value = redact(value)
            if (section, key) in DURATIONS and value is not None:
                value = _duration_text(value)
            line = f"# {key} = (none)" if value is None else f"{key} = {_toml_value(value)}"
            out.append(f"{line:<44s} # {loaded.sources.get((section, key), 'default')}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _config(a: argparse.Namespace) -> int:
    print(describe(settings_of(a)), end="")
    return 0


def add_config_command(sub: Any) -> None:
    """Register ``config`` on a root parser's subparsers."""
    c = add_verb(sub, "config", "print the effective settings and where each came from",
                 "Print every setting as TOML, each with where its value came from: the default, the file "
                 "(--config FILE, $KNNMON_CONFIG, else ./knnmon.toml), a KNNMON_SECTION_KEY variable, or --set. "
                 "The output is itself a valid config file. Later sources win: default < file < variable < flag.")
    add_config_options(c)
    c.set_defaults(func=_config)
