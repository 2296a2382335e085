#!/usr/bin/env bash
# The real-Ray slow suite: a cached venv with ray[default] (the dashboard and the Jobs API
# need [default]) and shoprld editable, then the test. The venv is reused between runs.
#   SHOPRLD_RAY_VENV   where the venv lives (default /tmp/shoprld-rayvenv)
#   PYTHON             the interpreter to build it with (default python3.11, else python3)
# Extra arguments go to pytest. Safety: the test starts its own head in a session of its own
# and stops it by that session; it never runs `ray stop`.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$here"
py=${PYTHON:-$(command -v python3.11 || command -v python3)}
venv=${SHOPRLD_RAY_VENV:-/tmp/shoprld-rayvenv}
stamp="$venv/.shoprld-ray-installed"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
# The stamp names the checkout the editable install points at: a venv cached for another
# checkout (a CI clone, a removed worktree) is reinstalled from this one.
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "$here" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "ray[default]" -e ".[test]"
    printf '%s' "$here" > "$stamp"
fi
exec "$venv/bin/python" -m pytest -q -m slow -p no:cacheprovider tests/integration/test_real_ray.py "$@"
