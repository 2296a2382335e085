"""The campaign ledger: one TSV row per round outcome, in the repo (SPEC §6).

Columns (the auto-research template, then the storage etiquette's absolute paths)::

    index branch parent_commit commit recipe metric_name metric_value memory_gb elapsed_min
    launcher job_id command log_path status description exp_dir checkpoint_path
    artifacts_path cache_root causes

``causes`` (issue 18) lists the round's failed attempts as ``STATE:cause`` words, oldest
first (``TRAIN:cuda_oom TRAIN:unknown``; empty for a clean round); each has a crash bundle
under ``<exp_dir>/logs/attempts/``. It is the last column, and rows are read by header name,
so a ledger written before it existed reads the same (its rows get an empty ``causes``).

``status`` is ``keep``, ``discard`` or ``crash``. ``index`` is the round's 0-based index and
is the row's identity: :meth:`Ledger.append` is idempotent on it, so a daemon that crashes
after recording a round and records it again on restart never duplicates the row.

Every write rewrites the whole file atomically (temp file, fsync, replace, fsync the dir),
so a crash leaves the old ledger or the new one, never half a row. Values are sanitized
(tabs and newlines become spaces) and are redacted by the ``redact`` callable the ledger
was given (the round's ``Secrets.redact``; readers pass none), so no row reaches the repo
unmasked whoever built it.

Overflow: past ``max_bytes`` (1 MiB) the full TSV moves to ``<overflow_dir>/<name>.tsv``
(under the campaign root on the volume) and the repo file becomes a pointer plus a summary,
still a valid TSV for readers that skip ``#`` comment lines::

    # full ledger: /ephemeral/.../<campaign>/ledger/<campaign>.tsv (1234 rows, 1.1 MiB)
    # this file keeps the last 20 rows; `shoprld ledger` prints them all
    index  branch  ...                     (header)
    ...                                    (the last 20 rows)

Write order in overflow mode: the full file first, then the pointer. :meth:`Ledger.rows`
reads the union of both files (full file first), so any crash in between still sees every
row, and a re-append is still a no-op.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from shoprld.daemon.foundation.system.errors import EXIT_CONFIG, ShoprldError
from shoprld.daemon.foundation.config.secrets import NO_REDACTION
from shoprld.daemon.foundation.records.roundlog import ROW_KEY
from shoprld.daemon.foundation.records.store import atomic_write

COLUMNS = (
    "index", "branch", "parent_commit", "commit", "recipe", "metric_name", "metric_value",
    "memory_gb", "elapsed_min", "launcher", "job_id", "command", "log_path", "status",
    "description", "exp_dir", "checkpoint_path", "artifacts_path", "cache_root", "causes",
)
STATUSES = ("keep", "discard", "crash")
POINTER_PREFIX = "# full ledger: "
MiB = 1024 * 1024


class LedgerError(ShoprldError):
    """The ledger cannot be read or written safely (exit 3: the operator fixes the path)."""

    exit_code = EXIT_CONFIG


# Tab, and every character str.splitlines() breaks on (CR LF, VT, FF, FS, GS, RS, NEL,
# LS, PS): a cell holding any of them would split a row for some reader.
_BREAKS = str.maketrans({c: " " for c in "\t\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"})


def sanitize(value: Any) -> str:
    """One TSV cell: None -> "", tabs and line breaks -> one space each (CRLF -> one space)."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    return text.replace("\r\n", " ").translate(_BREAKS)


def make_row(**fields: Any) -> dict[str, str]:
    """A full row in column order; missing columns are "". Unknown names raise ValueError."""
    unknown = sorted(set(fields) - set(COLUMNS))
    if unknown:
        raise ValueError(f"ledger: unknown column(s) {', '.join(unknown)}; known: {' '.join(COLUMNS)}")
    return {c: sanitize(fields.get(c)) for c in COLUMNS}


def parse_rows(text: str) -> list[dict[str, str]]:
    """The rows of one ledger TSV text, each keyed by every column ("" where the file lacks one);
    ``#`` comment lines (the overflow pointer) are skipped. import-campaign merges with it."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.split("\n"):  # not splitlines(): see _BREAKS
        if not line or line.startswith("#"):
            continue
        cells = line.split("\t")
        if header is None:
            header = cells
            continue
        # By header name, so a ledger written with another column order still reads right.
        by_name = dict(zip(header, cells))
        rows.append({c: by_name.get(c, "") for c in COLUMNS})
    return rows


def format_rows(rows: list[dict[str, str]], comments: tuple[str, ...] = ()) -> bytes:
    """The ledger TSV for ``rows`` (header first, ``comments`` above it), as every ledger file is written."""
    lines = list(comments)
    lines.append("\t".join(COLUMNS))
    lines.extend("\t".join(r.get(c, "") for c in COLUMNS) for r in rows)
    return ("\n".join(lines) + "\n").encode()


MAX_READ = 256 * MiB  # far past any real ledger (it overflows at 1 MiB): more is not a ledger


def read_bytes(path: Path) -> bytes | None:
    """The bytes of the ledger file at ``path``; None when absent. Anything that is not a regular
    file (a directory, a FIFO, a socket, a device) is refused in one line, never read (a FIFO
    would block the daemon) and never moved (it is not ours)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:  # not raised by O_RDONLY on Linux; kept for other kernels
        raise LedgerError(_not_a_file(path, "a directory")) from None
    except OSError as exc:
        raise LedgerError(f"{path}: cannot read the ledger ({exc.strerror}); fix: check the path and the volume") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise LedgerError(_not_a_file(path, _kind(st.st_mode)))
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_READ:
            chunk = os.read(fd, MiB)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise LedgerError(f"{path}: cannot read the ledger ({exc.strerror}); fix: check the path and the volume") from None
    finally:
        os.close(fd)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    return "not a regular file"


def _not_a_file(path: Path, kind: str) -> str:
    return (f"{path}: the ledger path is {kind}, not a file; fix: move it away (the ledger is rebuilt "
            "from the state dir's record on the next run)")


class Ledger:
    """The ledger file at ``path``, overflowing into ``overflow_dir`` past ``max_bytes``."""

    def __init__(
        self,
        path: Path,
        *,
        overflow_dir: Path,
        max_bytes: int = MiB,
        summary_rows: int = 20,
        redact: Callable[[str], str] = NO_REDACTION.text,
    ) -> None:
        self.path = Path(path)
        self.overflow_dir = Path(overflow_dir)
        self.max_bytes = max_bytes
        self.summary_rows = summary_rows
        self.redact = redact

    @property
    def overflow_path(self) -> Path:
        """Where the full TSV lives once the repo file overflowed."""
        return self.overflow_dir / f"{self.path.stem}.tsv"

    # -- reading ----------------------------------------------------------------------
    def _read(self, path: Path) -> str | None:
        data = read_bytes(path)
        return None if data is None else data.decode("utf-8", errors="replace")

    def _pointer_target(self, text: str | None) -> Path | None:
        if text and text.startswith(POINTER_PREFIX):
            first = text.split("\n", 1)[0][len(POINTER_PREFIX):]
            return Path(first.rsplit(" (", 1)[0].strip())
        return None

    def rows(self) -> list[dict[str, str]]:
        """Every row, in index order of first appearance (from the full file when overflowed)."""
        repo_text = self._read(self.path)
        target = self._pointer_target(repo_text) or self.overflow_path
        full_text = self._read(target)
        if full_text is None and self._pointer_target(repo_text) is not None:
            raise LedgerError(
                f"{target}: the full ledger is missing (the repo file {self.path} points to it); "
                "fix: mount the volume that holds it, or restore it"
            )
        seen: set[str] = set()
        out: list[dict[str, str]] = []
        for text in (full_text, repo_text):
            for row in parse_rows(text or ""):
                if row["index"] not in seen:
                    seen.add(row["index"])
                    out.append(row)
        return out

    def has_round(self, index: int) -> bool:
        key = str(index)
        return any(r["index"] == key for r in self.rows())

    def row(self, index: int) -> dict[str, str] | None:
        """Round ``index``'s row, or None (also when the ledger cannot be read)."""
        key = str(index)
        try:
            return next((r for r in self.rows() if r["index"] == key), None)
        except LedgerError:
            return None

    # -- writing ----------------------------------------------------------------------
    def _clean(self, row: Mapping[str, Any]) -> dict[str, str]:
        full = make_row(**row)
        full = {c: sanitize(self.redact(v)) for c, v in full.items()}
        if not full["index"].strip():
            raise ValueError("ledger: the row has no index (the round's 0-based index)")
        if full["status"] not in STATUSES:
            raise ValueError(f"ledger: status {full['status']!r}; use one of {', '.join(STATUSES)}")
        return full

    def append(self, row: Mapping[str, Any]) -> bool:
        """Record a round outcome. False (and no write) when this index is already there."""
        new = self._clean(row)
        rows = self.rows()
        if any(r["index"] == new["index"] for r in rows):
            return False
        rows.append(new)
        self._write(rows)
        return True

    def _write(self, rows: list[dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        full = format_rows(rows)
        if len(full) <= self.max_bytes and not self.overflow_path.exists():
            atomic_write(self.path, full)
            return
        try:
            self.overflow_dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.overflow_path, full)
        except OSError as exc:
            # The volume is full or gone: a big ledger in the repo beats a lost row.
            import structlog  # lazy: ~0.2 s, only on this failure; `shoprld ledger` never logs

            structlog.get_logger("shoprld.ledger").warning(
                "ledger.overflow_failed", path=str(self.overflow_path), error=str(exc))
            atomic_write(self.path, full)
            return
        tail = rows[-self.summary_rows:]
        pointer = f"{POINTER_PREFIX}{self.overflow_path.resolve()} ({len(rows)} rows, {len(full) / MiB:.1f} MiB)"
        note = f"# this file keeps the last {len(tail)} rows; `shoprld ledger` prints them all"
        atomic_write(self.path, format_rows(tail, (pointer, note)))


# -- the ledger is derived data (issue 26) ----------------------------------------------------
# The state dir's rounds.jsonl (and the journal's round.done records behind it) is the record:
# each finished round's line carries the ledger row it was given (ROW_KEY). The ledger in the
# user's checkout is a copy for humans, which `git clean`, `git stash` or a checkout can delete,
# cut, garble or roll back. It is checked against the record at every start and before every
# append, and rebuilt from it when it differs, the damaged copy kept aside.



def recorded_row(record: Mapping[str, Any]) -> dict[str, str] | None:
    """The ledger row a round record holds (a record written before ROW_KEY existed holds none);
    None when the record names no round."""
    r = record.get("round")
    if not isinstance(r, int) or isinstance(r, bool) or r < 0:
        return None
    held = record.get(ROW_KEY)
    if isinstance(held, Mapping):
        row = {c: sanitize(held.get(c)) for c in COLUMNS}
        if row["index"] == str(r) and row["status"] in STATUSES:
            return row
    return None


def summary_row(record: Mapping[str, Any]) -> dict[str, str]:
    """The row for a round record that holds none (an older engine's): what the record knows."""
    r = int(record["round"])
    branch = record.get("branch")
    val = record.get("val")
    return make_row(index=r, metric_name=record.get("metric_name") or "success_rate",
                    metric_value="" if val is None else val,
                    status="keep" if branch == "selected" else "discard",
                    description=f"round-{r:03d}: gate {record.get('gate') or '?'}, skillbank {branch or '?'} "
                                "(rebuilt from the state dir's record)")


def _well_formed(text: str) -> bool:
    """A ledger as this module writes it: a known header, every row as wide, a final newline, and
    each row's index a round number and its status a known one (a cut file fails one of these)."""
    if not text.endswith("\n"):
        return False
    header: list[str] | None = None
    for line in text[:-1].split("\n"):
        if line.startswith("#") and header is None:
            continue
        cells = line.split("\t")
        if header is None:
            if cells not in (list(COLUMNS), list(COLUMNS[:-1])):  # [:-1]: before `causes` existed
                return False
            header = cells
            continue
        if len(cells) != len(header):
            return False
        row = dict(zip(header, cells))
        if not row["index"].isdigit() or row["status"] not in STATUSES:
            return False
    return header is not None


def _sound_rows(text: str) -> list[dict[str, str]]:
    """The rows of a damaged ledger's lines that are whole: as wide as a known header, a round
    number as index, a known status."""
    out: list[dict[str, str]] = []
    header: list[str] | None = None
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        cells = line.split("\t")
        if cells in (list(COLUMNS), list(COLUMNS[:-1])):
            header = cells
            continue
        if header is None or len(cells) != len(header):
            continue
        by_name = dict(zip(header, cells))
        if by_name["index"].isdigit() and by_name["status"] in STATUSES:
            out.append({c: by_name.get(c, "") for c in COLUMNS})
    return out


def _aside(path: Path) -> Path | None:
    """Move a damaged ledger file to ``<name>.damaged-<UTC time>`` beside it; None when absent."""
    if not path.exists() and not path.is_symlink():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.rename(path, target)
    return target


def rebuild_from_record(ledger: Ledger, records: Iterable[Mapping[str, Any]], *, state_dir: Path) -> str | None:
    """Make ``ledger`` agree with the record; None when it already does, else one line saying what
    was wrong and where the damaged copy went.

    The rows it must hold: every recorded round's row (the record's own, or, for an older
    record that holds none, the ledger's well-formed row of that index, else a summary row),
    then the ledger's well-formed row of the round after the last recorded one, if any (a daemon
    that died between NEXT_ROUND's append and the round's record: the record catches up on the
    restart; only from a sound ledger). A ledger path that is not a regular file raises
    :class:`LedgerError` (nothing is moved)."""
    recs = {int(r["round"]): r for r in records
            if isinstance(r.get("round"), int) and not isinstance(r.get("round"), bool) and r["round"] >= 0}
    if not recs:
        # Nothing recorded: a new campaign, or a state dir that was lost. The ledger is then the
        # only trace of the rounds done (the engine reconciles on it), so it stays as it is.
        return None
    files = [p for p in (ledger.path, ledger.overflow_path) if p.exists() or p.is_symlink()]
    texts: list[str] = []
    problem: str | None = None
    for p in files:
        data = read_bytes(p)  # LedgerError for a directory, a FIFO...: the operator moves it
        if data is None:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            problem = problem or f"{p.name} is garbled (not UTF-8)"
            continue
        if not _well_formed(text):
            problem = problem or f"{p.name} is cut or garbled"
        texts.append(text)
    try:
        current = ledger.rows() if not problem else []
    except LedgerError as exc:  # a pointer to a full file that is gone
        current, problem = [], str(exc)
    if problem:  # its full-width lines may still hold the rows of an older engine's records
        current = [r for t in texts for r in _sound_rows(t)]
    have = {r["index"]: r for r in current}
    want: list[dict[str, str]] = []
    for r in sorted(recs):
        row = recorded_row(recs[r]) or have.get(str(r)) or summary_row(recs[r])
        want.append(row)
    last = max(recs) if recs else -1
    # The one row the record may lack: the next round's (see the docstring). Rows past it are
    # not backed by any record (another campaign's ledger, a hand edit): the rebuild drops them.
    nxt = None if problem else have.get(str(last + 1))
    if nxt is not None:
        want.append(nxt)
    if not problem and current == want:
        return None
    if problem is None:
        if not files:
            problem = "missing"
        else:
            got = {r["index"] for r in current}
            lost = [r for r in sorted(recs) if str(r) not in got]
            problem = (f"behind the record (rolled back? it lacks round(s) {', '.join(map(str, lost[:5]))}"
                       f"{' ...' if len(lost) > 5 else ''})" if lost else
                       "ahead of the record (rows of rounds never recorded)" if len(current) > len(want) else
                       "different from the record")
    kept = [str(a) for p in files if (a := _aside(p)) is not None]
    ledger._write(want)
    where = f"; the damaged copy is {', '.join(kept)}" if kept else ""
    return (f"{ledger.path}: the ledger was {problem}; rebuilt from the {len(recs)} round(s) recorded in "
            f"{state_dir / 'rounds.jsonl'}{where}")


def git_info(repo: Path, timeout: float = 5.0) -> dict[str, str]:
    """commit, branch and parent_commit of ``repo`` ("" for what git cannot tell)."""

    def git(*args: str) -> str:
        try:
            res = subprocess.run(["git", "--no-optional-locks", "-C", str(repo), *args], capture_output=True, text=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            return ""
        return res.stdout.strip() if res.returncode == 0 else ""

    return {
        "commit": git("rev-parse", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "parent_commit": git("rev-parse", "HEAD~1"),
    }

