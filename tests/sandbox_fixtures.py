"""The sandbox tests' modes (test_sandbox_guard.py, test_sandbox_escapes.py): each runs with bwrap and
with the rlimits fallback; bwrap must run on CI, elsewhere its cases skip."""
from __future__ import annotations

import os

import pytest

from csd.evaluation import sandbox


def need_bwrap() -> None:
    """bwrap must run here: on CI a missing or broken bubblewrap fails the test, elsewhere it skips."""
    problem = sandbox.bwrap_problem()      # says "install Debian's bubblewrap" when bwrap is missing
    if problem is None:
        return
    if os.environ.get("CI"):
        pytest.fail(problem)
    pytest.skip(problem)


@pytest.fixture(params=["bwrap", "rlimits"], name="mode")
def sandbox_mode(request):
    """Each sandbox test runs with bwrap and with the rlimits fallback (forced)."""
    if request.param == "bwrap":
        need_bwrap()
    return request.param
