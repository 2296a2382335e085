"""Inside the nspawn container: lay out the demo campaigns the real-systemd suite runs.

    /srv/shoprld/demo.toml   the demo campaign, paced: 3 rounds of 20 steps x 0.5 s
    /srv/shoprld/wd.toml     the same campaign named "wd" (the watchdog test)
    /srv/shoprld/park.toml   named "park", its ephemeral root on a small tmpfs (the disk test)
                             and its own checkout, park-repo/
    /srv/shoprld/sl.toml     named "sl" (the start-limit test)
    /srv/shoprld/{repo,ephemeral,models}   shared, as on a real box (one repo, one volume)

Every campaign pages `crashed` and `parked` to the loopback webhook receiver run.sh starts
(HOOK_URL, in each repo's .env).

None of them sets storage.state_dir, so the daemon uses $STATE_DIRECTORY
(/var/lib/shoprld/<instance>) from the unit's StateDirectory=.
Usage: python prepare_tree.py ROOT PARK_VOLUME
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from shoprld.daemon.ops.demo import create_tree

HOOK_URL = "http://127.0.0.1:8799/hook"
NOTIFY = """
[notify]
endpoints = [{ kind = "webhook", url_env = "SHOPRLD_WEBHOOK_URL", events = ["crashed", "parked"] }]
backoff = 0.1
"""


def main(root: Path, park_volume: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    template = create_tree(root, fast=False)
    text = template.read_text()
    template.unlink()
    text = re.sub(r'^step_seconds = ".*"$', 'step_seconds = "0.5"', text, flags=re.M)
    text = re.sub(r"^rounds = \d+$", "rounds = 3", text, flags=re.M)
    text = re.sub(r'^state_dir = ".*"\n', "", text, flags=re.M)
    assert 'step_seconds = "0.5"' in text and "rounds = 3" in text and "state_dir" not in text
    text += NOTIFY
    env = root / "repo" / ".env"
    env.write_text(env.read_text() + f"SHOPRLD_WEBHOOK_URL={HOOK_URL}\n")
    (root / "demo.toml").write_text(text)
    (root / "wd.toml").write_text(text.replace('name = "demo"', 'name = "wd"', 1))
    (root / "sl.toml").write_text(text.replace('name = "demo"', 'name = "sl"', 1))
    # park has its own checkout: <project_root>/runs is a symlink into ONE campaign's volume,
    # so two campaigns on two volumes cannot share a project root (preflight refuses it).
    shutil.copytree(root / "repo", root / "park-repo", symlinks=True, ignore=shutil.ignore_patterns("runs"))
    park = text.replace('name = "demo"', 'name = "park"', 1)
    park = park.replace('repo = "repo"', 'repo = "park-repo"', 1)
    park = park.replace('ephemeral_root = "ephemeral"', f'ephemeral_root = "{park_volume}"', 1)
    for key, value in (("checkpoint_estimate", "1MiB"), ("hf_estimate", "1MiB"), ("margin", "2MiB"),
                       ("hard_limit", "8MiB"), ("soft_limit", "12MiB"), ("hysteresis", "1MiB"),
                       ("ballast", "2MiB")):
        park, n = re.subn(rf'^{key} = ".*"$', f'{key} = "{value}"', park, flags=re.M)
        assert n == 1, key
    (root / "park.toml").write_text(park)
    print(f"prepared {root}: demo.toml wd.toml sl.toml park.toml")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
