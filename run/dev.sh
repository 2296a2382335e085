#!/usr/bin/env bash
# The two quick-start commands, and what CI runs. Sets up a virtual environment in
# .venv (or $SHOPRLD_VENV), installs shoprld editable with its test extra, then:
#   run/dev.sh demo [ARGS]   run the demo campaign on the embedded demo stack
#   run/dev.sh test [ARGS]   run the test suite (default: everything not marked slow)
#   run/dev.sh slow [ARGS]   run the slow suites (real systemd, real Ray, full chaos)
# PYTHON picks the interpreter (default python3.11, else python3).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$here"
py=${PYTHON:-}
if [ -z "$py" ]; then
    # The first interpreter that really runs and is >= 3.11 (a pyenv shim may exist and fail).
    for cand in python3.11 python3.12 python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info >= (3, 11)' 2>/dev/null; then
            py=$(command -v "$cand"); break
        fi
    done
fi
[ -n "$py" ] || { echo "run/dev.sh: no Python >= 3.11 found; set PYTHON=/path/to/python3.11" >&2; exit 2; }
venv=${SHOPRLD_VENV:-$here/.venv}
stamp="$venv/.shoprld-installed"
if [ ! -x "$venv/bin/python" ]; then
    "$py" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]"
    touch "$stamp"
fi
cmd=${1:-test}; shift || true
case "$cmd" in
    demo) exec "$venv/bin/shoprld" demo "$@" ;;
    test) exec "$venv/bin/python" -m pytest -q -rs "$@" ;;
    # pytest exits 5 when nothing is selected; that is not a failure of the slow suite.
    slow) "$venv/bin/python" -m pytest -q -rs -m slow "$@" || { rc=$?; [ $rc -eq 5 ] || exit $rc; } ;;
    *) echo "usage: run/dev.sh demo|test|slow [ARGS]" >&2; exit 2 ;;
esac
