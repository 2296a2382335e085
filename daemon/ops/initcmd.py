"""The ``shoprld init`` command: a commented campaign template to start from."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from shoprld.daemon.foundation.system.errors import ConfigError
from shoprld.daemon.foundation.records.outputs import write_output

TEMPLATE = '''\
# shoprld campaign file. Validate with `shoprld check -c THIS_FILE`.
# Relative paths are relative to this file. Command templates are argv lists whose
# {placeholders} are filled per round (`shoprld check --placeholders` lists them);
# they never go through a shell. Full recipes: run/slime-4xa800.toml, run/demo/campaign.toml.

[campaign]
name = "my-campaign"            # letters, digits, . _ -  (names the campaign root and the unit)
experiment = "main"             # one experiment dir per experiment under the campaign root
rounds = 5                      # outer loops (the seed: 5)
steps_per_round = 20            # slime steps per round (the seed: 20)
seed = 0
deadline = ""                   # "" | an ISO time "2026-12-01T08:00:00Z" | a duration from the first start "20h"

[storage]
repo = "."                      # the git checkout: code, the ledger, small records only
ephemeral_root = "/ephemeral"   # the work volume: checkpoints, logs, runs/, caches
# state_dir = ""                # default $STATE_DIRECTORY (systemd) or $XDG_STATE_HOME/shoprld/<name>
env_file = ".env"               # secrets, relative to the repo; never committed, never in argv
blank_cache = false             # true: a private cache under the experiment dir

[disk]
require_mount = true            # the ephemeral root must be a mount point
forbid_same_fs = true           # the repo must not be on the volume's filesystem
interval = 1                    # seconds between free-space samples
checkpoint_estimate = "53GiB"   # before the first checkpoint is measured
hf_estimate = "9GiB"
margin = "2GiB"
# hard_limit = "60GiB"          # default max(10% of the volume, checkpoint + 1 GiB)
# soft_limit = "120GiB"         # default hard + checkpoint
ballast = "256MiB"              # released at the hard limit so the last writes land

[gpus]
visible = [0, 1, 2, 3]          # CUDA_VISIBLE_DEVICES (default: the first 4)
tp_size = 2                     # NUM_GPUS must be divisible by it
# free_timeout = "120s"         # before the trainer / val server: wait out stragglers of earlier stages
# probe = "auto"                # NVML (pip install 'shoprld[gpu]'), else nvidia-smi, else none

[shopsim]
command = ["bash", "start.sh"]
cwd = "/path/to/ShopSimulator/shop_env"
env = { SHOPSIM_ENV_SLOTS = "{slots}", SHOPSIM_PORT = "{shopsim_port}" }
url = "http://127.0.0.1:5700"
slots = 48
episode_concurrency = 32

[train]
launcher = "local"              # "local" (a process) | "ray" (a Ray job via the Jobs REST API)
# Writes the round's tool configs <runs>/loop/<round_id>/{slime,analysis,val,gate}.yaml that the
# val and gate commands read ({loop_dir}); without it `check` refuses them.
emit_command = ["python3", "scripts/emit_training_loop_round.py", "--project-root", "{project_root}",
    "--round-id", "{round_id}", "--skillbank", "{skillbank}", "--curriculum", "{curriculum}",
    "--history-ledger", "{history_ledger}"]
command = ["python3", "train.py", "--load", "{load}", "--save", "{save_dir}",
    "--save-interval", "{save_interval}", "--num-rollout", "{num_rollout}", "{save_hf}", "{save_hf_dir}",
    "{async_save}", "{async_save_worker}"]   # [saves] async_save (default on): Megatron's async save
secrets = ["WANDB_API_KEY"]     # passed in the environment only
save_interval = 10000           # one save per round, at its last rollout
end_offset = 0                  # round r ends at iteration (r+1)*steps_per_round + end_offset
# base_load = "/path/to/model_torch_dist"   # round 0's --load
stall_min = "30m"               # a step-less trainer is a stall after max(k x median step, this)
retries = 3

[sidecar]
enabled = false

[export]
mode = "save_hf"                # verify slime's --save-hf dir; "convert" runs export.command

[val]
server_command = ["python3", "-m", "sglang.launch_server", "--model-path", "{hf_dir}",
    "--host", "{val_host}", "--port", "{val_port}", "--tp", "1", "--dp-size", "4"]
command = ["python3", "run_shopsimrl.py", "run", "{loop_dir}/val.yaml"]
url = "http://127.0.0.1:30000"
concurrency = 32

[gate]
command = ["python3", "run_shopsimrl.py", "training", "online-gate", "{loop_dir}/gate.yaml"]
policy = "continue"             # incomplete gate: continue (keep skills) | retry | stop (exit 5)

[inject]
# command = [...build-curriculum {next_skillbank} {next_curriculum} --round-id {next_round_id}]

[wandb]
enabled = true
mode = "online"                 # online | offline | disabled
project = "shopsimrl"
group = ""
'''


def write_template(path: Path, *, force: bool = False) -> None:
    """Write :data:`TEMPLATE` to ``path`` (a new file, or with ``force`` a regular file replaced).

    Written to a private temp file beside it, then renamed: a full disk or a read-only dir
    never leaves half a template, and every failure is one line (exit 3).
    """
    # A .env holds the secrets: `init .env --force` (or through a symlink) is a slip, never a template.
    if path.name == ".env" or Path(os.path.realpath(path)).name == ".env":
        raise ConfigError(f"{path}: is a .env secrets file, never overwritten by the template; "
                          "fix: choose another path")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot inspect ({exc.strerror}); fix: choose another path") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: is a directory; fix: name a file, e.g. {path / 'campaign.toml'}")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: exists and is not a regular file; fix: choose a path for a new file")
        if not force:
            raise ConfigError(f"{path}: already exists; fix: choose another path or pass --force")
    # A missing parent is a typo in the path more often than a wish for new dirs: refuse it, as
    # every other output path (`report -o`, `export-campaign`) does, and create nothing.
    parent = path.parent
    if not parent.is_dir():
        what = "does not exist" if not parent.exists() else "is not a directory"
        raise ConfigError(f"{path}: the directory {parent} {what}; fix: create it first (mkdir -p {parent}), "
                          "or choose a path in an existing directory")
    try:
        # 0644: a template holds no secret, and is meant to be shared.
        write_output(path, TEMPLATE.encode(), what="template", mode=0o644)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write the template ({exc.strerror}); "
                          "fix: choose a writable path") from None
