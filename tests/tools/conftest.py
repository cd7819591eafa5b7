"""A real bubblewrap sandbox per test for the tool tests."""

from __future__ import annotations

import pytest

from raas.sandbox import Limits
from raas.sandbox.bwrap import BwrapSandbox


@pytest.fixture
async def sandbox(tmp_path):
    async with BwrapSandbox(limits=Limits(timeout=30), tmp_dir=str(tmp_path)) as box:
        yield box
