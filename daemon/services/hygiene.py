"""The repo hygiene guard: the checkout must not grow large untracked files or caches.

The etiquette (``seeds/000``): "do not leave large files, cache dirs or generated outputs in
the git checkout; if a tool writes into the repo by default, change its path before running
it". A tool that ignores ``HF_HOME`` or ``WANDB_DIR``, or a ``runs/`` that became a real
directory, fills the checkout (on the memo's box: the nearly full system disk) one round at
a time. The engine runs :func:`scan_repo` before the first stage and after each round, and
turns each :class:`HygieneWarning` into a warning event and a status line.

What is looked at: in a git checkout, what ``git status --porcelain --ignored`` lists
(untracked and ignored entries, directories collapsed as git shows them); elsewhere, a walk
of the top level. Tracked files are the user's business. Each entry outside the allowed
records (``reports/shoprld``, ``.env``) is sized without following symlinks, within a time
budget, and warned about when it is over ``max_bytes``, or when it is a known cache or
weights path at any size: ``.cache``, ``wandb/``, a real ``runs/`` dir, ``*.safetensors``,
``*.pt``, ``*.distcp`` (``__pycache__`` only when over ``max_bytes``: every Python checkout
has some). Nothing is ever deleted or moved: the warning says what to do.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio.to_thread

from shoprld.daemon.foundation.records.layout import runs_aside
from shoprld.daemon.foundation.system.units import human_bytes

DEFAULT_ALLOWED = ("reports/shoprld", ".env")
CACHE_DIRS = (".cache", "wandb", "__pycache__", ".triton", ".ray", "ray_results", "huggingface", ".huggingface")
WEIGHT_GLOBS = ("*.safetensors", "*.pt", "*.pth", "*.distcp", "*.ckpt")
# __pycache__ is everywhere and small: only "big" ones are worth a line.
_SIZE_GATED = {"__pycache__"}
_MAX_INNER = 5  # inner findings reported per entry, beyond which one summary line


@dataclass(frozen=True)
class HygieneWarning:
    """One finding: a path in the repo, its size, and what kind of problem it is."""

    path: Path
    bytes: int
    kind: str              # "large" | "cache" | "weights" | "runs-dir" | "more" | "budget"
    partial: bool = False  # the size walk ran out of time: bytes is a lower bound
    count: int = 1         # "more": how many further findings under path this line stands for

    def line(self) -> str:
        """One line for the event and the status view: the path, the size and the fix."""
        size = (">= " if self.partial else "") + human_bytes(self.bytes)
        what = {
            "large": "large untracked path in the repo checkout",
            "cache": "cache directory in the repo checkout",
            "weights": "model/checkpoint file in the repo checkout",
            "runs-dir": "runs/ is a real directory in the checkout (tool output lands in the repo)",
            "more": f"{self.count} more cache/weights paths",
        }.get(self.kind, self.kind)
        if self.kind == "budget":
            return (f"repo hygiene: the scan ran out of its time budget; {self.count} untracked paths in "
                    f"{self.path} were not sized; fix: look at `git status --ignored` there")
        fix = (f"move it aside (mv {self.path} {runs_aside(self.path)}); shoprld then makes runs a symlink "
               "into the experiment (storage.manage_runs_link)"
               if self.kind == "runs-dir" else
               "move it under /ephemeral (the campaign root or the shared cache) and point the tool there")
        return f"repo hygiene: {what}: {self.path} ({size}); fix: {fix}"

    def __str__(self) -> str:
        return self.line()


def scan_repo(repo: Path, max_bytes: int = 50 * 1024**2, allowed: Sequence[str] = DEFAULT_ALLOWED, *,
              time_budget: float = 5.0, git_timeout: float = 10.0,
              clock: Callable[[], float] = time.monotonic) -> list[HygieneWarning]:
    """Findings in ``repo`` (see the module docstring). Never raises for a missing repo.

    The size walks share ``time_budget`` seconds: a walk cut short reports its size as a lower
    bound (and warns, since sizing it took that long), and the entries not reached at all are
    summed up in one ``budget`` line. ``clock`` is the seam the tests use.
    """
    repo = Path(repo)
    if not repo.is_dir():
        return []
    deadline = clock() + time_budget
    entries = _git_entries(repo, git_timeout)
    if entries is None:  # not a git checkout (or git missing): every top-level entry is "untracked"
        try:
            entries = sorted(e.name for e in os.scandir(repo) if e.name != ".git")
        except OSError:
            return []
    allow = [a.strip("/") for a in allowed]
    out: list[HygieneWarning] = []
    todo = [r.rstrip("/") for r in entries if r.rstrip("/") and not _allowed(r.rstrip("/"), allow)]
    for i, rel in enumerate(todo):
        if clock() > deadline:
            out.append(HygieneWarning(repo, 0, "budget", count=len(todo) - i))
            break
        out.extend(_check_entry(repo, rel, max_bytes, allow, deadline, clock))
    return out


def _git_entries(repo: Path, timeout: float) -> list[str] | None:
    """Untracked and ignored paths as git lists them (dirs collapsed), or None if not git."""
    try:
        res = subprocess.run(
            # --no-optional-locks: a plain status refreshes and rewrites .git/index in the user's checkout.
            ["git", "--no-optional-locks", "-C", str(repo), "status", "--porcelain=v1", "-z", "--ignored", "--untracked-files=normal"],
            capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0:
        return None
    out = []
    for item in res.stdout.split(b"\0"):
        if len(item) > 3 and item[:3] in (b"?? ", b"!! "):
            out.append(os.fsdecode(item[3:]))
    return out


def _allowed(rel: str, allow: Sequence[str]) -> bool:
    for a in allow:
        if rel == a or rel.startswith(a + "/") or fnmatch.fnmatch(rel, a):
            return True
    return False


def _is_weights(name: str) -> bool:
    return any(fnmatch.fnmatch(name, g) for g in WEIGHT_GLOBS)


def _check_entry(repo: Path, rel: str, max_bytes: int, allow: Sequence[str], deadline: float,
                 clock: Callable[[], float]) -> list[HygieneWarning]:
    path = repo / rel
    try:
        st = os.lstat(path)
    except OSError:
        return []
    name = path.name
    if stat.S_ISLNK(st.st_mode):
        return []  # a link (e.g. the managed runs/ -> volume) takes no room in the checkout
    if not stat.S_ISDIR(st.st_mode):
        if _is_weights(name):
            return [HygieneWarning(path, st.st_size, "weights")]
        return [HygieneWarning(path, st.st_size, "large")] if st.st_size > max_bytes else []
    total, partial, inner = _walk(path, repo, allow, deadline, max_bytes, clock)
    if name == "runs":
        return [HygieneWarning(path, total, "runs-dir", partial)]
    if name in CACHE_DIRS and (name not in _SIZE_GATED or total > max_bytes):
        if total > 0:
            return [HygieneWarning(path, total, "cache", partial)]
        return []
    if total > max_bytes or partial:
        return [HygieneWarning(path, total, "large", partial)]
    out = inner[:_MAX_INNER]
    if len(inner) > _MAX_INNER:
        rest = sum(w.bytes for w in inner[_MAX_INNER:])
        out.append(HygieneWarning(path, rest, "more", count=len(inner) - _MAX_INNER))
    return out


def _walk(top: Path, repo: Path, allow: Sequence[str], deadline: float, max_bytes: int,
          clock: Callable[[], float]) -> tuple[int, bool, list[HygieneWarning]]:
    """(bytes, ran out of time, inner findings) of a directory; no symlinks followed, no
    other filesystem entered, allowed records skipped."""
    total = 0
    inner: list[HygieneWarning] = []
    try:
        dev = os.lstat(top).st_dev
    except OSError:
        return 0, False, []
    stack = [top]
    while stack:
        if clock() > deadline:
            return total, True, inner
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                entries = list(it)
        except OSError:
            continue
        for e in entries:
            p = Path(e.path)
            rel = str(p.relative_to(repo))
            if _allowed(rel, allow):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev != dev:
                    continue
                if e.name in CACHE_DIRS or e.name == "runs":
                    size, part, _ = _walk(p, repo, allow, deadline, max_bytes, clock)
                    total += size
                    if e.name == "runs":
                        inner.append(HygieneWarning(p, size, "runs-dir", part))
                    elif size > 0 and (e.name not in _SIZE_GATED or size > max_bytes):
                        inner.append(HygieneWarning(p, size, "cache", part))
                    continue
                stack.append(p)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
                if _is_weights(e.name):
                    inner.append(HygieneWarning(p, st.st_size, "weights"))
    return total, False, inner


def lines(warnings: Iterable[HygieneWarning]) -> list[str]:
    """The one-line form of each warning (what the engine puts in status ``warnings``)."""
    return [w.line() for w in warnings]


async def scan_roots(roots: Iterable[Path], max_bytes: int) -> list[str]:
    """The findings of every root, one line each, without duplicates, scanned in a worker thread.

    The engine runs this as a task (before the first stage and after each round) and sends
    the result to its queue. Abandoned on cancel: a scan in flight must not delay shutdown.
    """
    return await anyio.to_thread.run_sync(
        lambda: list(dict.fromkeys(w for r in sorted(roots) for w in lines(scan_repo(r, max_bytes)))),
        abandon_on_cancel=True)
