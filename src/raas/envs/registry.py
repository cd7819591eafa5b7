"""Name -> environment handler. Built-ins register here; others via the ``raas.envs`` entry point."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from raas.envs.base import Env

log = logging.getLogger(__name__)
_REGISTRY: dict[str, type[Env]] = {}
_loaded = False


def register(cls: type[Env]) -> type[Env]:
    _REGISTRY[cls.name] = cls
    return cls


def _load_builtins() -> None:
    from raas.envs import calculator  # noqa: F401

    for ep in entry_points(group="raas.envs"):
        try:
            register(ep.load())
        except Exception:  # a broken plugin must not take the service down
            log.exception("could not load environment plugin %s", ep.name)


def available() -> dict[str, type[Env]]:
    global _loaded
    if not _loaded:
        _loaded = True
        _load_builtins()
    return dict(_REGISTRY)


def get(name: str) -> Env | None:
    cls = available().get(name)
    return cls() if cls else None
