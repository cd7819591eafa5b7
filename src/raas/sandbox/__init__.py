"""Sandboxes for agent tools: ``make_sandbox(kind)`` and the ``Sandbox`` protocol.

Kinds: ``bwrap`` (bubblewrap namespaces, the default where ``bwrap`` is installed),
``apptainer`` and ``docker`` (an image), ``local`` (no isolation; development only).
``auto`` picks bwrap, else local with a warning. See docs/sandbox.md.
"""

from __future__ import annotations

import logging
from typing import Any

from raas.sandbox import apptainer, bwrap, docker
from raas.sandbox.agent import AgentSandbox
from raas.sandbox.base import ExecResult, HeadTail, Limits, Sandbox, SandboxError, SandboxProcess
from raas.sandbox.local import LocalSandbox

__all__ = [
    "KINDS", "AgentSandbox", "ExecResult", "HeadTail", "Limits", "Sandbox", "SandboxError", "SandboxProcess",
    "make_sandbox",
]

log = logging.getLogger(__name__)

KINDS = {
    "bwrap": bwrap.BwrapSandbox,
    "apptainer": apptainer.ApptainerSandbox,
    "docker": docker.DockerSandbox,
    "local": LocalSandbox,
}


def make_sandbox(kind: str = "auto", **opts: Any) -> AgentSandbox:
    """A new, not yet started sandbox of ``kind``; ``opts`` go to its constructor."""
    if kind == "auto":
        if bwrap.available():
            kind = "bwrap"
        else:
            log.warning("bwrap not found: falling back to the local sandbox, which does NOT isolate")
            kind = "local"
    try:
        cls = KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown sandbox kind {kind!r}; choose one of: auto, {', '.join(KINDS)}") from None
    return cls(**opts)
