"""``knnmon config``: the effective settings and where each came from
(:mod:`~knnmon.coordinator.cli.settings`)."""

from __future__ import annotations

import argparse
from typing import Any

from knnmon.coordinator.cli.options import add_config_options, add_verb, settings_of
from knnmon.coordinator.cli.settings import describe

__all__ = ["add_config_command"]


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
