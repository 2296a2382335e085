"""The notify endpoint validator (daemon/foundation/config/endpoints.py): what it accepts httpx can
send, what it refuses is one line naming the key and never the value; and `check` and `run`
refuse the same (exit 3)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shoprld.daemon.foundation.config.configsections import NotifySection
from shoprld.daemon.foundation.config.endpoints import endpoint_problems, token_problem, url_problem
from shoprld.daemon.foundation.config.secrets import with_pattern
from tests.demotree import SHOPRLD, make_tree

URLISH = st.builds(lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
                   st.sampled_from(["http://", "https://", "ftp://", "", "http:/", "HTTP://"]),
                   st.sampled_from(["127.0.0.1", "[::1]", "[::1", "ex\u00e4mple.com", "", "h", "user:pw@h", "a b",
                                    "[]", "h\n", "hooks.slack.com"]),
                   st.sampled_from(["", ":80", ":0", ":65535", ":65536", ":99999", ":80:80", ":-1", ":x", ":"]),
                   st.text(max_size=20))


def _sendable(url: str) -> None:
    """What the delivery does with it: build the request httpx would send (raises if it cannot)."""
    req = httpx.Request("POST", url, content=b"{}", headers={"Content-Type": "application/json"})
    assert req.url.host and req.url.scheme in ("http", "https")


@settings(max_examples=400, deadline=None)
@given(url=URLISH | st.text(max_size=60))
@example("http://127.0.0.1:99999/x")
@example("http://[::1/x")
@example("http://h:80:80/")
@example("http://h/\u00e9")
def test_url_validator_accepts_only_what_httpx_sends_and_never_echoes(url: str) -> None:
    why = url_problem(url)
    if why is None:
        _sendable(url)
    else:
        assert "\n" not in why and (len(url) < 4 or url not in why)


@settings(max_examples=300, deadline=None)
@given(token=st.text(max_size=40) | st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7e),
                                            min_size=1, max_size=40))
def test_token_validator_accepts_only_what_a_header_holds(token: str) -> None:
    why = token_problem(token)
    if why is None:
        httpx.Request("POST", "http://h/", headers={"Authorization": f"Bearer {token}"})
        assert token.isascii() and token.isprintable() and " " not in token
    else:
        assert token not in why or len(token) < 4


def test_endpoint_problems_name_the_key_and_the_file_never_the_value(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    section = NotifySection.model_validate({"endpoints": [
        {"kind": "ntfy", "url_env": "NTFY_URL", "token_env": "NTFY_TOKEN"},
        {"kind": "webhook", "url_env": "HOOK_URL"}, {"kind": "slack", "url_env": "MISSING_URL"}]})
    values = {"NTFY_URL": "http://ntfy.example:99999/topic", "NTFY_TOKEN": "tok\u00e9-secret-value",
              "HOOK_URL": "https://hooks.example/T0/B0/xyzzy"}
    lines = endpoint_problems(section, with_pattern(values, env), env)
    assert len(lines) == 2  # an unset key is Secrets.require's line, not this one
    assert lines[0].startswith(f"{env}: NTFY_URL (notify.endpoints[0].url_env) is not a valid URL")
    assert lines[1].startswith(f"{env}: NTFY_TOKEN (notify.endpoints[0].token_env) holds")
    assert all(v not in line for v in values.values() for line in lines)
    assert all("fix: " in line for line in lines)


@pytest.fixture(scope="module")
def bad_url_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("badurl")
    campaign = make_tree(root, rounds=1)
    campaign.write_text(campaign.read_text() + '\n[notify]\nendpoints = [{ kind = "webhook", url_env = '
                                               '"SHOPRLD_WEBHOOK_URL" }]\n')
    env = root / "repo" / ".env"
    env.write_text(env.read_text() + "SHOPRLD_WEBHOOK_URL=http://127.0.0.1:99999/hook/s3cr3t-path\n")
    return campaign


@pytest.mark.parametrize("cmd", ["check", "run"])
def test_check_and_run_refuse_a_bad_webhook_url_before_any_work(bad_url_tree: Path, cmd: str) -> None:
    """Exit 3, one stderr line naming the key, never the value; run writes no state."""
    root = bad_url_tree.parent
    proc = subprocess.run([*SHOPRLD, cmd, "-c", str(bad_url_tree)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "SHOPRLD_WEBHOOK_URL (notify.endpoints[0].url_env)" in err[0], proc.stderr
    assert "s3cr3t-path" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    if cmd == "run":
        assert not (root / "state" / "journal.jsonl").exists()
