#!/bin/bash
# The real-systemd suite for systemd/shoprld@.service (issue 7, item 6). Needs root.
#
# Boots a REAL systemd with systemd-nspawn on a cached debootstrapped Debian (bookworm), with
# shoprld installed in a venv inside it, and checks under it: start (Type=notify, READY=1), the
# STATUS= line in `systemctl status`, kill -9 -> restart -> resume at the same round, reload
# (ExecReload -> SIGHUP), a graceful `systemctl stop` (exit 0, STOPPED), a disk park (exit 4)
# that is NOT restarted, and a watchdog stall (SIGSTOP) that systemd detects and restarts; and
# the `crashed` pages (ExecStopPost= after the kill -9 and the watchdog kill, OnFailure= at the
# start limit; none for a stop or a park) at a loopback webhook receiver in the container.
#
# SAFETY (../shared/REFERENCE.md): systemd is never started from the machine's root cgroup. Every
# nspawn runs in a subshell that first moved itself into a dedicated child cgroup in every
# hierarchy (cg_enter.sh); the cgroups are removed afterwards. No systemctl ever talks to the
# host: every systemctl runs inside the container (nsenter into its namespaces). The container
# has loopback only (--private-network). Processes are signalled by pid, never by name.
# Teardown (trap EXIT) powers the container off, unmounts and removes the cgroups, always.
#
# Env: SHOPRLD_NSPAWN_ROOT  cached root   (default /var/cache/shoprld/nspawn-bookworm)
#      SHOPRLD_SYSTEMD_OUT  artifacts     (default /var/tmp/shoprld-systemd-test/out)
#      SHOPRLD_SYSTEMD_KEEP=1 keep the per-run work dir
# Out: $OUT/results.jsonl (one {"check","ok","detail","seconds"} per check), $OUT/status-*.txt
#      (systemctl status at each step), $OUT/systemctl-status.txt (all of them), journal.txt,
#      unit.service (the rendered unit), nspawn.log, summary.txt. Exit 0 iff every check passed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
ROOT=${SHOPRLD_NSPAWN_ROOT:-/var/cache/shoprld/nspawn-bookworm}
CACHE=$(dirname "$ROOT")
W=${SHOPRLD_SYSTEMD_WORK:-/var/tmp/shoprld-systemd-test}
OUT=${SHOPRLD_SYSTEMD_OUT:-$W/out}
CG=shoprld-systemd-test          # the child cgroup's name, in every hierarchy
M=shoprld-ci                     # the container's machine name (hostname)
HOSTPY=${SHOPRLD_HOST_PYTHON:-$REPO/.venv/bin/python}
VENV=/opt/shoprld/venv           # inside the container
SRC=/opt/shoprld/src             # inside the container (a read-only copy of the checkout)
PARKVOL=/srv/park-vol            # inside the container: a 48 MiB tmpfs for the disk-park test
t0=$(date +%s)

log() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
die() { echo "run.sh: $*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, nspawn, cgroups)"
[ -d /sys/fs/cgroup ] || die "no /sys/fs/cgroup"
[ -x "$HOSTPY" ] || HOSTPY=$(command -v python3)
mkdir -p "$CACHE" "$W" "$OUT"
rm -f "$OUT"/results.jsonl "$OUT"/status-*.txt "$OUT"/systemctl-status.txt
RESULTS=$OUT/results.jsonl; : > "$RESULTS"

# One run at a time (the cgroup name and the cached root are shared).
exec 9>"$CACHE/.systemd-test.lock"
flock -w 5 9 || die "another run holds $CACHE/.systemd-test.lock"

# shellcheck source=cg_enter.sh
. "$HERE/cg_enter.sh"

# -- 1. host tools (Debian packages, only when missing) ----------------------------------------
# debootstrap is arch-independent and not tied to anything installed: the mirror's version will do.
# systemd-nspawn is: its package pins `systemd (= <version>)`, and the mirror keeps only the newest
# point release. So the exact version is installed when the mirror still has it; otherwise the
# mirror's candidate systemd-container and libsystemd-shared are unpacked privately (apt-get
# download + dpkg -x) under $CACHE/host-tools, and that nspawn runs with its own private library
# (LD_LIBRARY_PATH beats its RUNPATH). The host's systemd is never upgraded or touched.
apt_lists() {  # make sure apt knows package $1 (a bare machine may have no package lists yet)
  apt-cache show "$1" >/dev/null 2>&1 && return 0
  log "apt-get update (no package list knows $1)"
  DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -qq >/dev/null || die "apt-get update failed"
}
if ! command -v debootstrap >/dev/null && [ ! -x "$ROOT/lib/systemd/systemd" ]; then
  apt_lists debootstrap
  log "installing debootstrap on the host"
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-upgrade debootstrap >/dev/null \
    || die "apt-get install debootstrap failed"
fi
TOOLS=$CACHE/host-tools
NSPAWN=(systemd-nspawn)
if ! command -v systemd-nspawn >/dev/null; then
  if [ ! -x "$TOOLS/usr/bin/systemd-nspawn" ]; then
    apt_lists systemd-container
    V=$(dpkg-query -W -f='${Version}' systemd 2>/dev/null || true)
    if [ -n "$V" ] && apt-cache madison systemd-container | awk -F'|' '{gsub(/ /, "", $2); print $2}' | grep -qxF "$V"; then
      log "installing systemd-container=$V (the host's systemd version) on the host"
      DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-upgrade "systemd-container=$V" >/dev/null \
        || die "apt-get install systemd-container=$V failed"
    else
      log "systemd-container ${V:-?} is not on the mirror: unpacking its candidate privately into $TOOLS"
      rm -rf "$TOOLS.tmp"; mkdir -p "$TOOLS.tmp/debs"
      ( cd "$TOOLS.tmp/debs" && timeout 300 apt-get download -qq -o APT::Sandbox::User=root \
          systemd-container libsystemd-shared ) >/dev/null 2>&1 || die "apt-get download systemd-container failed"
      for deb in "$TOOLS.tmp"/debs/*.deb; do dpkg -x "$deb" "$TOOLS.tmp"; done
      rm -rf "$TOOLS.tmp/debs"; mv "$TOOLS.tmp" "$TOOLS"
    fi
  fi
  if ! command -v systemd-nspawn >/dev/null; then
    LIBDIR=$(dirname "$(find "$TOOLS" -name 'libsystemd-shared-*.so' | head -1)")
    NSPAWN=(env "LD_LIBRARY_PATH=$LIBDIR" "$TOOLS/usr/bin/systemd-nspawn")
  fi
fi
"${NSPAWN[@]}" --version >/dev/null 2>&1 || die "systemd-nspawn does not run: ${NSPAWN[*]}"
log "systemd-nspawn: $("${NSPAWN[@]}" --version | head -1) (${NSPAWN[*]})"

# -- 2. the cached root (~2-3 min once) ----------------------------------------------------------
if [ ! -x "$ROOT/lib/systemd/systemd" ]; then
  MIRROR=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  log "debootstrap bookworm into $ROOT (${MIRROR:-default mirror})"
  rm -rf "$ROOT.tmp"
  timeout 1200 debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,python3,python3-venv \
    bookworm "$ROOT.tmp" ${MIRROR:+"$MIRROR"} > "$OUT/debootstrap.log" 2>&1 \
    || die "debootstrap failed (see $OUT/debootstrap.log)"
  mv "$ROOT.tmp" "$ROOT"
fi
# a volatile journal (no growth of the cached root), and no getty noise on the console
mkdir -p "$ROOT/etc/systemd/journald.conf.d"
printf '[Journal]\nStorage=volatile\n' > "$ROOT/etc/systemd/journald.conf.d/shoprld-test.conf"
ln -sf /dev/null "$ROOT/etc/systemd/system/console-getty.service"
# leftovers of an earlier run (the root is cached, state must not be)
rm -rf "$ROOT/etc/systemd/system/shoprld@"* "$ROOT/etc/systemd/system/shoprld-crashed@"* "$ROOT/var/lib/shoprld" "$ROOT/var/lib/private/shoprld"

# -- 3. wheels on the host, offline install in the container ------------------------------------
# The container has no network. The wheels are downloaded here with the host venv's pip, pinned
# to the versions the host tests ran with, and installed offline with --no-index.
WH=$CACHE/wheelhouse
"$HOSTPY" -m pip freeze --exclude-editable 2>/dev/null | grep -v '^-e ' > "$W/constraints.txt" || true
DEPS=$("$HOSTPY" - "$REPO/pyproject.toml" <<'EOF'
import sys, tomllib
d = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(d["project"]["dependencies"] + d["build-system"]["requires"]))
EOF
)
STAMP=$(cat "$REPO/pyproject.toml" "$W/constraints.txt" | sha256sum | cut -c1-16)
if [ "$(cat "$WH/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  log "downloading wheels into $WH"
  rm -rf "$WH"; mkdir -p "$WH"
  # shellcheck disable=SC2086
  timeout 600 "$HOSTPY" -m pip download -q --only-binary=:all: -d "$WH" -c "$W/constraints.txt" $DEPS \
    > "$OUT/pip-download.log" 2>&1 || { tail -5 "$OUT/pip-download.log"; die "pip download failed"; }
  echo "$STAMP" > "$WH/.stamp"
fi

# the checkout: tracked + untracked-not-ignored files, copied fresh each run
rm -rf "$W/src" "$W/srv"; mkdir -p "$W/src" "$W/srv"
(cd "$REPO" && git ls-files -co --exclude-standard -z \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar -cf - --null -T - ) | tar -xf - -C "$W/src"

NSPID=""; L=""; CG_USED=""; RUN_CREATED=""
[ -e /run/systemd/nspawn ] || RUN_CREATED=1

cleanup() {
  local rc=$? i
  set +e
  if [ -n "$L" ] && [ -e "/proc/$L" ]; then
    timeout 20 nsenter -t "$L" -a -- systemctl poweroff --no-block >/dev/null 2>&1
    log "poweroff sent"
  fi
  if [ -n "$NSPID" ]; then
    for i in $(seq 120); do
      [ -e "/proc/$NSPID" ] && [ "$(awk '{print $3}' "/proc/$NSPID/stat" 2>/dev/null)" != Z ] || break
      sleep 0.25
    done
    # SIGKILL to the container's PID 1 (by pid) kills its whole PID namespace
    if [ -e "/proc/$NSPID" ] && [ -n "$L" ] && [ -e "/proc/$L" ]; then kill -KILL "$L"; fi
    wait "$NSPID" 2>/dev/null
    log "container gone"
  fi
  if [ -n "$CG_USED" ]; then
    for f in $(find /sys/fs/cgroup -path "*/$CG/*" -name cgroup.procs 2>/dev/null) \
             $(find /sys/fs/cgroup -path "*/$CG" -name cgroup.procs 2>/dev/null); do
      c=$(tr '\n' ' ' < "$f"); [ -n "$c" ] && echo "still in $f: $c"
    done
    remove_cgroups "$CG"
    left=$(find /sys/fs/cgroup -depth -type d -name "$CG" 2>/dev/null | wc -l)
    log "cgroups removed (left: $left)"
  fi
  [ -n "$RUN_CREATED" ] && rm -rf /run/systemd/nspawn
  rm -rf "$ROOT/etc/systemd/system/shoprld@"* "$ROOT/etc/systemd/system/shoprld-crashed@"* "$ROOT/var/lib/shoprld" "$ROOT/var/lib/private/shoprld"
  rmdir "$ROOT$PARKVOL" 2>/dev/null
  [ "${SHOPRLD_SYSTEMD_KEEP:-0}" = 1 ] || rm -rf "$W/src" "$W/srv"
  log "cleaned up (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# nspawn, always from inside the child cgroup. ONLY ever call this in a subshell, ( ... ):
# it moves the calling shell ($BASHPID) into $CG in every hierarchy, then execs its arguments.
in_cgroup_exec() {
  enter_cgroups "$CG"
  grep -q "/$CG\$" /proc/self/cgroup || { echo "not in the child cgroup" >&2; exit 97; }
  exec "$@"
}
CG_USED=1   # from here on, cleanup removes the child cgroups

if [ "$(cat "$ROOT$VENV/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  log "building $VENV in the container (offline)"
  rm -rf "${ROOT:?}$VENV"
  mkdir -p "$ROOT/opt/shoprld/src"
  ( in_cgroup_exec timeout 600 "${NSPAWN[@]}" -q -D "$ROOT" -M "$M-setup" --register=no --keep-unit \
      --private-network --bind-ro="$WH:/wheelhouse" --bind="$W/src:$SRC" \
      /bin/sh -ec "python3 -m venv $VENV
                  $VENV/bin/pip install -q --no-index --find-links /wheelhouse -e $SRC" ) \
      > "$OUT/venv.log" 2>&1 < /dev/null || { cat "$OUT/venv.log"; die "venv build failed"; }
  echo "$STAMP" > "$ROOT$VENV/.stamp"
fi
mkdir -p "$ROOT/srv/shoprld" "$ROOT$PARKVOL"

# -- 4. boot -------------------------------------------------------------------------------------
log "booting the container"
( in_cgroup_exec timeout 900 "${NSPAWN[@]}" -D "$ROOT" -M "$M" --boot --register=no --keep-unit \
    --private-network --link-journal=no --console=read-only \
    --bind-ro="$W/src:$SRC" --bind="$W/srv:/srv/shoprld" ) \
    > "$OUT/nspawn.log" 2>&1 < /dev/null &
NSPID=$!   # the subshell, exec'd into timeout; nspawn is its child, the container's systemd nspawn's
for _ in $(seq 200); do
  NS=$(pgrep -P "$NSPID" -x systemd-nspawn || true)
  [ -n "$NS" ] && L=$(pgrep -P "$NS" -x systemd || true)
  [ -n "$L" ] && break
  sleep 0.1
done
[ -n "$L" ] || { cat "$OUT/nspawn.log"; die "container init not found"; }
# the safety rule, checked: the container's systemd is in our child cgroup, not the machine's root
grep -q "/$CG" "/proc/$L/cgroup" || die "container init is not inside the $CG cgroup"

C() { timeout 120 nsenter -t "$L" -a -- "$@"; }
st=""
for _ in $(seq 150); do
  st=$(C systemctl is-system-running 2>/dev/null || true)
  case "$st" in running|degraded) break ;; esac
  sleep 0.2
done
log "container booted: $st"

# -- helpers -------------------------------------------------------------------------------------
record() {  # record NAME OK(0|1) SECONDS DETAIL
  "$HOSTPY" -c 'import json,sys; print(json.dumps({"check": sys.argv[1], "ok": sys.argv[2] == "1",
    "seconds": round(float(sys.argv[3]), 1), "detail": sys.argv[4]}))' "$1" "$2" "$3" "$4" >> "$RESULTS"
  if [ "$2" = 1 ]; then log "PASS $1: $4"; else log "FAIL $1: $4"; fi
}
FAILED=0
run_check() {  # run_check NAME FUNCTION: the function sets $DETAIL and returns 0 for a pass
  local name=$1 s; s=$(date +%s.%N); DETAIL=""
  if "$2"; then record "$name" 1 "$(echo "$(date +%s.%N) - $s" | bc)" "$DETAIL"
  else record "$name" 0 "$(echo "$(date +%s.%N) - $s" | bc)" "$DETAIL"; FAILED=$((FAILED + 1)); fi
}
prop() { C systemctl show -p "$2" --value "shoprld@$1.service"; }
sj() {  # sj INSTANCE PYEXPR: evaluate over status.json (s) from the container's state dir
  "$HOSTPY" - "$ROOT/var/lib/shoprld/$1/status.json" "$2" <<'EOF' 2>/dev/null || echo ""
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    print(""); sys.exit(0)
print(eval(sys.argv[2]))
EOF
}
pages() {  # pages CAMPAIGN PYEXPR: evaluate over the campaign's crashed pages (p, a list) at the receiver
  "$HOSTPY" - "$W/srv/pages.jsonl" "$1" "$2" <<'EOF' 2>/dev/null || echo ""
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
except OSError:
    rows = []
p = [r for r in rows if r.get("event") == "crashed" and r.get("campaign") == sys.argv[2]]
print(eval(sys.argv[3]))
EOF
}
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll every 0.25 s, bounded
  local secs=$1 deadline=$(( $(date +%s) + $1 )) what=$2; shift 2
  while [ "$(date +%s)" -lt "$deadline" ]; do "$@" && return 0; sleep 0.25; done
  DETAIL="timed out after ${secs}s waiting for: $what"; return 1
}
snap() {  # snap FILE INSTANCE: systemctl status + systemd's own lines about the unit
  { echo "### $(date -u +%H:%M:%S) systemctl status shoprld@$2"
    C systemctl status "shoprld@$2.service" --no-pager -l -n 0 || true
    echo "### systemd's lines about shoprld@$2 (the daemon's JSON lines left out)"
    C journalctl -u "shoprld@$2.service" -o short-precise --no-pager | grep -v ']: {' || true
    echo; } > "$OUT/$1"
  cat "$OUT/$1" >> "$OUT/systemctl-status.txt"
}

# -- 5. the demo tree, the unit ------------------------------------------------------------------
t_install() {
  C "$VENV/bin/python" "$SRC/tests/systemd/prepare_tree.py" /srv/shoprld "$PARKVOL" > "$OUT/prepare.log" 2>&1 \
    || { DETAIL="prepare_tree failed: $(tail -1 "$OUT/prepare.log")"; return 1; }
  if C "$VENV/bin/shoprld" --help 2>/dev/null | grep -q install-service; then
    HOW="shoprld install-service"; C "$VENV/bin/shoprld" install-service -c /srv/shoprld/demo.toml --write
  else  # until the lead wires the subcommand into cli.py: the same function, run as a module
    HOW="python -m shoprld.daemon.ops.unit"
    C "$VENV/bin/python" -m shoprld.daemon.ops.unit -c /srv/shoprld/demo.toml --write
  fi > "$OUT/install-service.txt" 2>&1 || { DETAIL="install-service failed: $(tail -2 "$OUT/install-service.txt")"; return 1; }
  cp "$ROOT/etc/systemd/system/shoprld@.service" "$OUT/unit.service"
  cp "$ROOT/etc/systemd/system/shoprld-crashed@.service" "$OUT/crashed-unit.service" \
    || { DETAIL="install-service wrote no shoprld-crashed@.service (the OnFailure= unit)"; return 1; }
  C systemd-analyze verify /etc/systemd/system/shoprld@.service /etc/systemd/system/shoprld-crashed@.service \
    > "$OUT/verify.txt" 2>&1 || { DETAIL="systemd-analyze verify: $(head -3 "$OUT/verify.txt")"; return 1; }
  [ ! -s "$OUT/verify.txt" ] || { DETAIL="verify warned: $(head -3 "$OUT/verify.txt")"; return 1; }
  for d in PrivateTmp=yes ProtectHome=read-only ProtectSystem=strict "ExecStart=$VENV/bin/shoprld run -c /srv/shoprld/%i.toml"; do
    grep -qxF "$d" "$OUT/unit.service" || { DETAIL="rendered unit lacks $d"; return 1; }
  done
  # test-only drop-ins: a 3 s watchdog for the stall test; the park volume is outside the
  # template's ReadWritePaths (the documented per-campaign drop-in)
  mkdir -p "$ROOT/etc/systemd/system/shoprld@wd.service.d" "$ROOT/etc/systemd/system/shoprld@park.service.d"
  printf '[Service]\nWatchdogSec=3s\n' > "$ROOT/etc/systemd/system/shoprld@wd.service.d/50-test.conf"
  printf '[Service]\nReadWritePaths=-%s -/srv/shoprld/park-repo\n' "$PARKVOL" > "$ROOT/etc/systemd/system/shoprld@park.service.d/50-test.conf"
  # the start-limit test: the second start is over the limit (the unit's is 5 in 30 min)
  mkdir -p "$ROOT/etc/systemd/system/shoprld@sl.service.d"
  printf '[Unit]\nStartLimitBurst=1\n[Service]\nRestartSec=1s\n' > "$ROOT/etc/systemd/system/shoprld@sl.service.d/50-test.conf"
  C systemctl daemon-reload
  # the receiver of the campaigns' pages (their .env's SHOPRLD_WEBHOOK_URL), owned by the container's systemd
  rm -f "$W/srv/pages.jsonl"
  C systemd-run --quiet --unit=shoprld-test-hook "$VENV/bin/python" "$SRC/tests/systemd/hook_receiver.py" 8799 \
    /srv/shoprld/pages.jsonl || { DETAIL="the webhook receiver did not start"; return 1; }
  DETAIL="installed via '$HOW'; verify clean; $(grep -c . "$OUT/unit.service") lines"
}

# -- 6. the checks -------------------------------------------------------------------------------
in_round1_train() { [ "$(sj demo "s.get('state') == 'TRAIN' and s.get('round') == 1")" = True ]; }
t_start() {
  local s; s=$(date +%s.%N)
  C systemctl start shoprld@demo.service || { DETAIL="systemctl start failed: $(prop demo Result)"; return 1; }
  local took; took=$(echo "$(date +%s.%N) - $s" | bc)
  [ "$(prop demo ActiveState)" = active ] || { DETAIL="not active after start"; return 1; }
  wait_for 120 "demo in round-001 TRAIN" in_round1_train || return 1
  sleep 3  # a few steps into the round (20 steps x 0.5 s)
  in_round1_train || { DETAIL="round-001 TRAIN was over within 3 s"; return 1; }
  snap status-1-running.txt demo
  local line; line=$(grep -m1 'Status: "' "$OUT/status-1-running.txt" || true)
  [[ "$line" =~ Status:\ \"round-001\ \(2\ of\ 3\)\ TRAIN\ step\ [0-9]+/20 ]] || { DETAIL="no STATUS line: '$line'"; return 1; }
  DETAIL="start returned after READY=1 in ${took}s; $(echo $line)"
}

# after the last start (the "resume" transition): the reconcile round, and the round TRAIN was re-spawned in
resume_facts() {
  "$HOSTPY" - "$ROOT/var/lib/shoprld/demo/journal.jsonl" <<'EOF' 2>/dev/null || true
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
idx = max((i for i, e in enumerate(ev) if e.get("event") == "transition" and e.get("trigger") == "resume"), default=None)
if idx is None:
    sys.exit(0)
after = ev[idx + 1:]
rec = [e["round"] for e in after if e.get("event") == "reconcile"]
train = [e["round"] for e in after if e.get("event") == "stage.spawn" and e.get("role") == "trainer"]
print(f"{rec[0] if rec else ''} {train[0] if train else ''}")
EOF
}
trainer_respawned() { local f; f=$(resume_facts); [ -n "$f" ] && [ -n "${f#* }" ]; }
t_kill9() {
  P1=$(prop demo MainPID); R1=$(sj demo "s['round']")
  C sh -c "kill -9 $P1"
  local s; s=$(date +%s.%N)
  wait_for 90 "the restarted daemon to re-spawn the trainer" trainer_respawned || return 1
  local took; took=$(echo "$(date +%s.%N) - $s" | bc)
  local p2 nr facts rec tr starts; p2=$(prop demo MainPID); nr=$(prop demo NRestarts)
  facts=$(resume_facts); rec=${facts% *}; tr=${facts#* }
  starts=$("$HOSTPY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("starts"))' \
           "$ROOT/var/lib/shoprld/demo/state.json" 2>/dev/null || echo "?")
  sleep 1
  snap status-2-restarted.txt demo
  [ "$p2" != "$P1" ] && [ "$p2" != 0 ] || { DETAIL="MainPID $P1 -> $p2"; return 1; }
  [ "$nr" = 1 ] || { DETAIL="NRestarts=$nr"; return 1; }
  [ "$rec" = "$R1" ] && [ "$tr" = "$R1" ] || { DETAIL="killed in round $R1; after restart: reconcile round $rec, trainer round $tr"; return 1; }
  grep -q 'status=9/KILL' "$OUT/status-2-restarted.txt" || { DETAIL="no 'status=9/KILL' in the journal"; return 1; }
  DETAIL="kill -9 $P1 in round-$(printf %03d "$R1") TRAIN -> restarted as $p2 (NRestarts=$nr, state.json starts=$starts); reconcile and trainer re-spawn in round-$(printf %03d "$tr"), ${took}s after the kill"
}

reloaded() { C journalctl -u shoprld@demo.service -o cat --no-pager | grep -q '"event": "config.reload"'; }
t_reload() {
  local p; p=$(prop demo MainPID)
  C systemctl reload shoprld@demo.service || { DETAIL="systemctl reload failed"; return 1; }
  wait_for 15 "the daemon to log config.reload" reloaded || return 1
  [ "$(prop demo MainPID)" = "$p" ] && [ "$(prop demo ActiveState)" = active ] \
    || { DETAIL="the daemon did not survive SIGHUP"; return 1; }
  DETAIL="ExecReload sent SIGHUP to $p: config.reload logged, still active, same pid"
}

t_stop() {
  local s; s=$(date +%s.%N)
  C systemctl stop shoprld@demo.service || { DETAIL="systemctl stop failed"; return 1; }
  local took; took=$(echo "$(date +%s.%N) - $s" | bc)
  snap status-3-stopped.txt demo
  local res code state; res=$(prop demo Result); code=$(prop demo ExecMainStatus); state=$(sj demo "s.get('state')")
  [ "$res" = success ] && [ "$code" = 0 ] && [ "$state" = STOPPED ] \
    || { DETAIL="Result=$res ExecMainStatus=$code state=$state"; return 1; }
  DETAIL="stop took ${took}s: Result=$res ExecMainStatus=$code state.json=$state ($(sj demo "s.get('stop_reason')"))"
}

park_train() { [ "$(sj park "s.get('state') == 'TRAIN' and s.get('step', 0) >= 1")" = True ]; }
park_done() { case "$(prop park ActiveState)" in failed|inactive) return 0 ;; *) return 1 ;; esac; }
t_park() {
  C mount -t tmpfs -o size=48m shoprld-park "$PARKVOL" || { DETAIL="tmpfs mount failed"; return 1; }
  C systemctl start shoprld@park.service || { DETAIL="start failed: $(prop park Result)"; return 1; }
  wait_for 60 "park in TRAIN" park_train || return 1
  local avail; avail=$(C df -B1 --output=avail "$PARKVOL" | tail -1 | tr -d ' ')
  C fallocate -l $(( avail - 3 * 1024 * 1024 )) "$PARKVOL/filler" || { DETAIL="fallocate failed"; return 1; }
  wait_for 60 "the park unit to exit" park_done || return 1
  sleep 3  # an auto-restart would show as SubState=auto-restart, then activating
  snap status-4-park.txt park
  local code sub nr state; code=$(prop park ExecMainStatus); sub=$(prop park SubState); nr=$(prop park NRestarts)
  state=$(sj park "s.get('state')")
  [ "$code" = 4 ] && [ "$nr" = 0 ] && [ "$sub" = failed ] && [ "$state" = PAUSED_DISK ] \
    || { DETAIL="ExecMainStatus=$code SubState=$sub NRestarts=$nr state=$state"; return 1; }
  DETAIL="filled the 48M tmpfs: exit $code, SubState=$sub, NRestarts=$nr, state.json=$state: $(sj park "s.get('last_error')")"
}

wd_train() { [ "$(sj wd "s.get('state') == 'TRAIN' and s.get('step', 0) >= 1")" = True ]; }
wd_back() {
  local p; p=$(prop wd MainPID)
  [ "$p" != 0 ] && [ "$p" != "$W1" ] && [ "$(prop wd ActiveState)" = active ] && [ "$(prop wd NRestarts)" = 1 ]
}
t_watchdog() {
  C systemctl start shoprld@wd.service || { DETAIL="start failed"; return 1; }
  [ "$(prop wd WatchdogUSec)" = 3s ] || { DETAIL="WatchdogUSec=$(prop wd WatchdogUSec)"; return 1; }
  wait_for 60 "wd in TRAIN" wd_train || return 1
  W1=$(prop wd MainPID)
  C sh -c "kill -STOP $W1"
  local s; s=$(date +%s.%N)
  wait_for 90 "systemd to kill the stalled daemon and restart it" wd_back || return 1
  local took; took=$(echo "$(date +%s.%N) - $s" | bc)
  snap status-5-watchdog.txt wd
  grep -q 'Watchdog timeout' "$OUT/status-5-watchdog.txt" || { DETAIL="no 'Watchdog timeout' in the journal"; return 1; }
  DETAIL="SIGSTOP $W1 -> 'Watchdog timeout (limit 3s)' -> restarted as $(prop wd MainPID) ${took}s later"
  C systemctl stop shoprld@wd.service || true
}

# -- 7. pages about a dead daemon (ExecStopPost= and OnFailure= run `notify-crashed --systemd`) ----
demo_paged() { [ "$(pages demo 'len(p) >= 1')" = True ]; }
t_kill9_paged() {
  wait_for 30 "a crashed page about the kill -9" demo_paged || return 1
  local n msg; n=$(pages demo 'len(p)'); msg=$(pages demo 'p[0]["message"]')
  [ "$n" = 1 ] || { DETAIL="$n crashed pages for one kill"; return 1; }
  [[ "$msg" == *"killed by SIGKILL"*"systemd restarts it"* ]] || { DETAIL="page: $msg"; return 1; }
  DETAIL="ExecStopPost= paged: $(pages demo 'p[0]["state"]') round $(pages demo 'p[0]["round"]'): ${msg:0:160}"
}
t_own_exits_not_paged() {
  local d p; d=$(pages demo 'len(p)'); p=$(pages park 'len(p)')
  [ "$d" = 1 ] && [ "$p" = 0 ] || { DETAIL="crashed pages: demo $d (want 1: the kill -9 only, not the stop), park $p (want 0: exit 4)"; return 1; }
  local parked; parked=$("$HOSTPY" -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if json.loads(l).get("event") == "parked"))' "$W/srv/pages.jsonl")
  DETAIL="after a graceful stop and a disk park (exit 4): no crashed page (park's own parked pages: $parked)"
}
wd_paged() { [ "$(pages wd 'len(p) >= 1')" = True ]; }
t_watchdog_paged() {
  wait_for 30 "a crashed page about the watchdog kill" wd_paged || return 1
  local msg; msg=$(pages wd 'p[0]["message"]')
  [[ "$msg" == *"watchdog"* ]] || { DETAIL="page: $msg"; return 1; }
  DETAIL="${msg:0:160}"
}
sl_train() { [ "$(sj sl "s.get('state') == 'TRAIN' and s.get('step', 0) >= 1")" = True ]; }
sl_gave_up() { [ "$(pages sl 'any(x.get("cause") == "gave_up" for x in p)')" = True ]; }
t_start_limit_paged() {
  C systemctl start shoprld@sl.service || { DETAIL="start failed"; return 1; }
  wait_for 60 "sl in TRAIN" sl_train || return 1
  C sh -c "kill -9 $(prop sl MainPID)"
  wait_for 60 "the OnFailure= page (start limit)" sl_gave_up || return 1
  sleep 2
  snap status-6-start-limit.txt sl
  local res n msg; res=$(prop sl Result); n=$(pages sl 'len(p)')
  msg=$(pages sl '[x for x in p if x.get("cause") == "gave_up"][0]["message"]')
  # systemd 252 keeps the last death's Result (signal), and says why it did not restart in the journal
  [ "$(prop sl ActiveState)" = failed ] && grep -q 'Start request repeated too quickly' "$OUT/status-6-start-limit.txt" \
    || { DETAIL="Result=$res ActiveState=$(prop sl ActiveState), no 'Start request repeated too quickly'"; return 1; }
  [ "$n" = 2 ] || { DETAIL="$n crashed pages (want 2: the kill, then the start limit)"; return 1; }
  [[ "$msg" == *"nothing restarts it"*"systemd stopped restarting shoprld@sl.service"* ]] || { DETAIL="page: $msg"; return 1; }
  DETAIL="kill -9 with StartLimitBurst=1: 'Start request repeated too quickly', Result=$res; 2 pages, the OnFailure= one: ${msg:0:200}"
}

run_check install t_install
if [ "$FAILED" = 0 ]; then
  run_check start_status t_start
  [ "$FAILED" = 0 ] && run_check kill9_restart_resume t_kill9
  run_check kill9_paged t_kill9_paged
  run_check reload_sighup t_reload
  run_check graceful_stop t_stop
  run_check disk_park_not_restarted t_park
  run_check own_exits_not_paged t_own_exits_not_paged
  run_check watchdog_stall t_watchdog
  run_check watchdog_paged t_watchdog_paged
  run_check start_limit_paged t_start_limit_paged
fi
cp "$W/srv/pages.jsonl" "$OUT/pages.jsonl" 2>/dev/null || true
C journalctl -u 'shoprld@*' -o short-precise --no-pager > "$OUT/journal.txt" 2>&1 || true
for i in demo wd park sl; do cp "$ROOT/var/lib/shoprld/$i/journal.jsonl" "$OUT/$i-journal.jsonl" 2>/dev/null || true; done
rm -rf "$OUT/logs"; mkdir -p "$OUT/logs"
for d in "$W"/srv/ephemeral/nemo-rl/*/nemo-rl-auto-research/*/*/logs; do
  [ -d "$d" ] && cp -r "$d" "$OUT/logs/$(basename "$(dirname "$(dirname "$d")")")"
done
TOTAL=$(( $(date +%s) - t0 ))
{ echo "shoprld real-systemd suite: $(grep -c '"ok": true' "$RESULTS") passed, $FAILED failed, ${TOTAL}s"
  echo "systemd in the container: $(C systemctl --version | head -1)"; cat "$RESULTS"; } | tee "$OUT/summary.txt"
[ "$FAILED" = 0 ]
