"""Suite-wide test settings.

Hypothesis runs derandomized: the default suite's fuzzers (bounded example counts) and the slow
suite's (many more) explore the same examples on every machine, so CI cannot turn red on a
draw nobody can reproduce. Set ``SHOPRLD_FUZZ_EXPLORE=1`` to explore with fresh random examples
(and keep whatever fails as a regression case in ``tests/corpus/``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("shoprld", derandomize=os.environ.get("SHOPRLD_FUZZ_EXPLORE") != "1")
settings.load_profile("shoprld")


# -- what the default run holds ---------------------------------------------------------------
# Whole-campaign suites (tests/integration, tests/chaos) start real daemons, stand-ins and
# campaigns: a few minutes each on a busy 2-core box. The default run (``run/dev.sh test``)
# keeps a representative few, marked ``smoke``: the golden path, a crash and its resume, a
# graceful stop, a disk-full park on a real tmpfs, and the secret canaries. Every other test
# there is ``slow`` and runs in CI's slow step (``run/dev.sh slow``), so nothing stops running.
_CAMPAIGN_SUITES = ("integration", "chaos")


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            suite = Path(str(item.fspath)).resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        if suite in _CAMPAIGN_SUITES and item.get_closest_marker("smoke") is None:
            item.add_marker(pytest.mark.slow)
