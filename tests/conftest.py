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


# -- the short /tmp links a session's campaigns leave ---------------------------------------------
# A campaign with a long experiment path gets /tmp/shoprld-{tmp,ray}-<hash> links to its tmp and
# ray dirs (AF_UNIX paths: foundation/records/layout.py). A campaign that ends DONE or is cleaned removes
# its own; one a test kills, refuses or only lays out keeps them, and they dangle once pytest
# prunes its old temp dirs. At the session's end remove those that point into this session's
# temp dir: never another session's (each has its own basetemp), never anything else.
def remove_links_into(base: Path, tmp: Path = Path("/tmp")) -> list[Path]:
    """Remove the ``shoprld-{tmp,ray}-*`` symlinks in ``tmp`` whose target is under ``base``."""
    removed: list[Path] = []
    bases = {base, base.resolve()}
    for link in [*tmp.glob("shoprld-tmp-*"), *tmp.glob("shoprld-ray-*")]:
        try:
            if link.is_symlink() and bases & set(Path(os.readlink(link)).parents):
                link.unlink()
                removed.append(link)
        except OSError:
            continue
    return removed


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)  # None: no test of this session asked for tmp_path
    if base is not None:
        remove_links_into(Path(base))
