"""Suite-wide test settings.

Hypothesis runs derandomized: the default suite's fuzzers (bounded example counts) and the slow
suite's (many more) explore the same examples on every machine, so CI cannot turn red on a
draw nobody can reproduce. Set ``SHOPRLD_FUZZ_EXPLORE=1`` to explore with fresh random examples
(and keep whatever fails as a regression case in ``tests/corpus/``).
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("shoprld", derandomize=os.environ.get("SHOPRLD_FUZZ_EXPLORE") != "1")
settings.load_profile("shoprld")
