# From ../shared/reference/systemd-nspawn/cg_enter.sh (the working recipe), unchanged.
# source me: move the current (sub)shell ($BASHPID) into <current>/$CG in every cgroup hierarchy
enter_cgroups() {
  local CG=$1 cgs id ctrl path dir new
  cgs=$(cat /proc/self/cgroup)     # snapshot first (reading /proc/self/cgroup while moving is racy)
  while IFS=: read -r id ctrl path; do
    case "$ctrl" in "") dir=/sys/fs/cgroup/unified ;; name=systemd) dir=/sys/fs/cgroup/systemd ;; *) dir=/sys/fs/cgroup/$ctrl ;; esac
    [ -d "$dir" ] || continue
    new="${dir}${path%/}/$CG"; mkdir -p "$new"
    if [ "$ctrl" = cpuset ]; then cat "${new%/*}/cpuset.cpus" > "$new/cpuset.cpus"; cat "${new%/*}/cpuset.mems" > "$new/cpuset.mems"; fi
    echo $BASHPID > "$new/cgroup.procs" || echo "WARN: could not join $new" >&2
  done <<< "$cgs"
}
remove_cgroups() {  # rmdir every cgroup dir named $1 (depth-first); only works once empty
  local d; for d in $(find /sys/fs/cgroup -depth -type d -name "$1"); do find "$d" -depth -type d -exec rmdir {} \; ; done
}
