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
py=${PYTHON:-$(command -v python3.11 || command -v python3)}
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
    test) exec "$venv/bin/python" -m pytest -q "$@" ;;
    # pytest exits 5 when nothing is selected; that is not a failure of the slow suite.
    slow) "$venv/bin/python" -m pytest -q -m slow "$@" || { rc=$?; [ $rc -eq 5 ] || exit $rc; } ;;
    *) echo "usage: run/dev.sh demo|test|slow [ARGS]" >&2; exit 2 ;;
esac
