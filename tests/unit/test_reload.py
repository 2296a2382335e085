"""A SIGHUP reload is all or nothing (daemon/core/sources.py ``reloaded``): every way a new
campaign file or .env can be wrong refuses the whole reload in one line; one that passes names
every key it changes. And the one Redactor every writer holds learns a new secret in place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from shoprld.daemon.core.sources import changed_keys, reloaded
from shoprld.daemon.foundation.config.config import load_config
from shoprld.daemon.foundation.records.layout import Layout
from shoprld.daemon.foundation.config.secrets import load_secrets, with_pattern
from tests.demotree import make_tree

URL = "http://127.0.0.1:9/hook/s3cr3t-path-token"
NOTIFY = '\n[notify]\nendpoints = [{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL" }]\n'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    campaign = make_tree(tmp_path, rounds=2)
    env = tmp_path / "repo" / ".env"
    env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={URL}\nPROBE_VALUE=probe-visible-1234567\n")
    return campaign


def _edit(campaign: Path, pattern: str, repl: str) -> None:
    text, n = re.subn(pattern, repl, campaign.read_text(), flags=re.M)
    assert n, pattern
    campaign.write_text(text)


REFUSED = [
    # (what to do to the tree, a piece of the one line)
    (lambda c: _edit(c, r"^rounds = 2$", "rounds = 3"), "campaign.rounds changed, which only a restart applies"),
    (lambda c: _edit(c, r"^interval = 0.5$", "interval = 2"), "disk.interval changed"),
    (lambda c: _edit(c, r"^launcher = \"local\"$", 'launcher = "ray"'), "train.launcher changed"),
    (lambda c: c.write_text(c.read_text() + NOTIFY + "queue = 5\n"), "notify.queue changed"),
    (lambda c: c.write_text(c.read_text() + "\n[notify\n"), "campaign.toml"),
    (lambda c: _edit(c, r"^retries = 3$", "retries = -1"), "train.retries"),
    (lambda c: _edit(c, r'^(check_command = \[)"\{python\}"', r'\1"no-such-tool-xyz"'), "train.check_command"),
    (lambda c: c.write_text(c.read_text() + NOTIFY.replace("SHOPRLD_WEBHOOK_URL", "UNSET_HOOK_URL")),
     "UNSET_HOOK_URL is not set"),
    (lambda c: ((c.parent / "repo" / ".env").write_text((c.parent / "repo" / ".env").read_text()
                                                        + "SHOPRLD_WEBHOOK_URL=http://127.0.0.1:99999/x\n"),
                c.write_text(c.read_text() + NOTIFY)),
     "SHOPRLD_WEBHOOK_URL (notify.endpoints[0].url_env) is not a valid URL"),
    (lambda c: (c.parent / "repo" / ".env").write_text('BROKEN="zz-value-zz\n'), ".env:1"),
    (lambda c: c.write_text(c.read_text() + '\n[metrics]\ntextfile = 5\n'), "metrics.textfile"),
]


@pytest.mark.parametrize(("damage", "expect"), REFUSED, ids=[e for _, e in REFUSED])
def test_a_reload_check_would_refuse_is_refused_whole(tree: Path, damage, expect: str) -> None:  # type: ignore[no-untyped-def]
    cfg = load_config(tree)
    damage(tree)
    r = reloaded(cfg, Layout.from_config(cfg))
    assert r.cfg is None and r.refused is not None and expect in r.refused, r.refused
    assert "\n" not in r.refused and "s3cr3t-path-token" not in r.refused and "zz-value-zz" not in r.refused


def test_a_good_reload_names_every_key_it_changes(tree: Path) -> None:
    cfg = load_config(tree)
    assert reloaded(cfg, Layout.from_config(cfg)).changed == ()
    tree.write_text(tree.read_text().replace('secrets = ["WANDB_API_KEY"]', 'secrets = ["WANDB_API_KEY", "PROBE_VALUE"]')
                    + NOTIFY + f'\n[metrics]\ntextfile = "{tree.parent / "prom" / "x.prom"}"\n')
    _edit(tree, r"^stall_min = \"4s\"$", 'stall_min = "9s"')
    r = reloaded(cfg, Layout.from_config(cfg))
    assert r.refused is None and r.cfg is not None and r.secrets is not None
    assert set(r.changed) == {"train.secrets", "train.stall_min", "notify.endpoints", "metrics.textfile"}
    assert r.secrets.redact("x probe-visible-1234567 y") == "x *** y"  # a train.secrets key is secret now
    assert changed_keys(cfg, r.cfg) == list(r.changed)


def test_the_shared_redactor_learns_a_new_secret_in_place(tmp_path: Path) -> None:
    """Every writer holds the one instance: extending it masks the new value everywhere, and the
    old values stay masked (a child started before the reload may still print them)."""
    env = tmp_path / ".env"
    env.write_text("WANDB_API_KEY=old-secret-value-1\nPROBE_VALUE=probe-visible-1234567\n")
    first = load_secrets(env)
    held = first.redactor
    assert held is first.redactor  # the same instance whoever asks
    assert held.text("probe-visible-1234567") == "probe-visible-1234567"
    env.write_text("WANDB_API_KEY=new-secret-value-2\nPROBE_VALUE=probe-visible-1234567\n")
    held.extend(load_secrets(env, extra_keys=["PROBE_VALUE"]).redactor)
    assert held.text("probe-visible-1234567 old-secret-value-1 new-secret-value-2") == "*** *** ***"
    assert held.obj({"k": ["probe-visible-1234567"]}) == {"k": ["***"]}
    bare = with_pattern({}, None).redactor
    bare.extend(with_pattern({"HF_TOKEN": "hf-token-value-123"}, None).redactor)
    assert bare.text("hf-token-value-123") == "***"
