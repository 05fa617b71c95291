"""What the ``knnmon`` verbs share: the verb's parser, its setting flags and the settings they load.

A verb declares a few flags, each one setting by its key (:func:`setting_flag`), and
``--config`` / ``--set`` (:func:`add_config_options`) for every other setting
(:mod:`~knnmon.coordinator.cli.settings`); :func:`settings_of` loads them. A flag has no default
of its own: its help shows the setting's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any, Literal, get_args, get_origin

from knnmon.coordinator.cli.settings import Loaded, Settings, load_settings

__all__ = ["DEFAULT_WORKERS", "DefaultsFormatter", "add_config_options", "add_store_options", "add_verb",
           "announce_first_compile", "require", "setting_flag", "settings_of", "store_config"]

#: Workers of ``run`` and ``serve`` (and the demo): ``workers.count``'s default.
DEFAULT_WORKERS: int = Settings().workers.count

#: The flag that sets each key, for errors and ``knnmon config`` (``--set`` otherwise).
_FLAG_NAMES: dict[tuple[str, str], str] = {}


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each flag's default, unless its text says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (None, False, [])
                and action.default is not argparse.SUPPRESS):
            text += f" (default {action.default})"
        return text


def announce_first_compile(say: Callable[[str], object] = print) -> None:
    """Say so when this start compiles knnmon's kernels (numba's cache holds none yet): the
    first start on a machine is otherwise silent for about a minute."""
    from knnmon.jit import kernels_cached

    if not kernels_cached():
        say("compiling knnmon's kernels: once per machine, about a minute "
            f"(cached in {os.environ['NUMBA_CACHE_DIR']})")


def add_verb(sub: Any, name: str, summary: str, description: str | None = None) -> argparse.ArgumentParser:
    """A subcommand ``name`` with its one-line ``summary`` (``knnmon --help``), a description
    (``knnmon NAME --help``; default: the summary as a sentence) and defaults shown."""
    text = description or summary[0].upper() + summary[1:] + "."
    return sub.add_parser(name, help=summary, description=text, formatter_class=DefaultsFormatter)


def _field(key: str):
    section, _, name = key.partition(".")
    return Settings.model_fields[section].annotation.model_fields[name]


def setting_flag(p: argparse.ArgumentParser, flag: str, key: str, *, metavar: str | None = None,
                 switch: bool | None = None, help: str | None = None) -> None:
    """``flag`` sets the setting ``key`` (``"section.name"``): its value is validated with the
    others (:func:`~knnmon.coordinator.cli.settings.load_settings`). ``switch``: a flag without a
    value that sets the key to ``switch``. The help is the setting's description (or ``help``)
    and its default."""
    field = _field(key)
    text = help or field.description or ""
    if get_origin(field.annotation) is Literal:
        text += f"; one of {', '.join(get_args(field.annotation))}"
    default = field.default
    if default is not None and default is not False and switch is None:
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        text += f" (default {shown:,})" if isinstance(shown, int) and not isinstance(shown, bool) \
            else f" (default {shown})"
    _FLAG_NAMES[tuple(key.split(".", 1))] = flag
    if switch is None:
        p.add_argument(flag, dest=key, default=argparse.SUPPRESS, metavar=metavar or key.split(".")[1].upper(),
                       help=text)
    else:
        p.add_argument(flag, dest=key, default=argparse.SUPPRESS, action="store_const", const=switch, help=text)


def add_config_options(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set SECTION.KEY=VALUE`` (repeatable): every setting
    (``knnmon config`` lists them)."""
    p.add_argument("--config", metavar="FILE",
                   help="a TOML file of settings (default $KNNMON_CONFIG, else ./knnmon.toml if present; "
                        "knnmon config prints every setting and where it came from)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="set any setting, e.g. --set workers.executor=inline (repeatable)")


def settings_of(a: argparse.Namespace) -> Loaded:
    """The settings a verb's arguments ``a`` load: the file, the variables, ``--set``, the flags.

    Raises
    ------
    InvalidArgumentError
        A ``--set`` without ``=``, or what :func:`~knnmon.coordinator.cli.settings.load_settings`
        rejects.
    """
    from knnmon.errors import InvalidArgumentError

    flags: dict[str, object] = {}
    for item in getattr(a, "overrides", []) or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise InvalidArgumentError(f"--set takes SECTION.KEY=VALUE, e.g. workers.count=4; got {item!r}")
        flags[key.strip()] = value.strip()
    names = {}
    for dest, value in vars(a).items():
        if "." in dest:
            flags[dest] = value
            names[tuple(dest.split(".", 1))] = _FLAG_NAMES.get(tuple(dest.split(".", 1)), "--set")
    return load_settings(getattr(a, "config", None), flags, names)


def add_store_options(p: argparse.ArgumentParser, *, data_dir: bool = True) -> None:
    """``--redis``, ``--namespace`` and (with ``data_dir``) ``--data-dir``: where results live
    (``[redis]``); then :func:`add_config_options`."""
    setting_flag(p, "--redis", "redis.url", metavar="URL", help="a Redis URL (default $KNNMON_REDIS_URL, else the "
                 "embedded server)")
    setting_flag(p, "--namespace", "redis.namespace", metavar="NAME")
    if data_dir:
        setting_flag(p, "--data-dir", "redis.data_dir", metavar="DIR")
    add_config_options(p)


def require(value: object, key: str, flag: str) -> None:
    """Raise :class:`~knnmon.errors.InvalidArgumentError` naming ``flag`` and ``key`` when
    ``value`` is not set."""
    from knnmon.errors import InvalidArgumentError

    if value is None:
        raise InvalidArgumentError(f"{flag} is required (or the setting {key})")


def store_config(a: argparse.Namespace):
    """Where results live, as a verb's arguments ``a`` set it (:meth:`Settings.store_config`)."""
    return settings_of(a).settings.store_config()
