#!/usr/bin/env bash
# Writes link/text-order.txt: the functions a server runs, which the release build's
# linker places first in the binary's machine code (build.rs passes the file to LLD as
# its symbol ordering file), so that a running server maps that code and little else.
#
#   link/text-order.sh [--binary FILE] [--kubeconfig FILE]...
#
# Runs the server under valgrind's callgrind (it needs `valgrind` and `python3`; nothing
# else beyond the build) as a deployment runs it: over simulated clusters (some serving
# streaming lists, one refusing them as API servers before v1.27 do) and the contexts of
# each `--kubeconfig` given (real API servers: their certificates, authentication and
# versions take code of their own), a first sync into an empty store, every query and
# stream a client makes, scrapes and probes, a restart over the store, a clean stop.
# Without `--binary` it builds target/release/fleetscope first. Every function that
# ran, named as the binary names it, is written in the order the linker had them, so
# that code which ran together stays together.
#
# Run it again when the toolchain or Cargo.lock changes, or a release is cut: a symbol's
# name carries a hash of its crate's build, so a file made for other versions no longer
# names the code (the linker skips such names and the binary is only larger in memory,
# never wrong).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "text-order.sh: valgrind is needed (Debian: valgrind)" >&2; exit 1; }

bin=""
kubeconfigs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) bin="$2"; shift 2 ;;
    --kubeconfig) kubeconfigs+=(--kubeconfig "$(realpath "$2")"); shift 2 ;;
    *) echo "usage: link/text-order.sh [--binary FILE] [--kubeconfig FILE]..." >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ]; then
  cargo build --release --locked --bin fleetscope
  bin=target/release/fleetscope
fi
bin="$(realpath "$bin")"
work="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT

# A free loopback port, from the kernel.
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
grpc="127.0.0.1:$(port)"
metrics="127.0.0.1:$(port)"

# An HTTP GET without curl: the path's body is not needed, only that the server answered.
http_get() {
  exec 3<>"/dev/tcp/${metrics%:*}/${metrics#*:}"
  printf 'GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$1" "$metrics" >&3
  cat <&3 >/dev/null
  exec 3<&-
}

# Waits (up to ten minutes: valgrind runs the server some fifty times slower) until
# every cluster is SYNCED; stops the script if the server process $1 ended, or the
# time is up, with the end of its log $2.
synced() {
  for _ in $(seq 1 1200); do
    if "$bin" clusters -s "http://$grpc" 2>/dev/null |
      awk 'NR > 1 && $2 != "SYNCED" { bad = 1 } END { exit bad || NR < 2 }'; then
      return 0
    fi
    kill -0 "$1" 2>/dev/null || break
    sleep 0.5
  done
  echo "text-order.sh: the server did not sync; the end of its log:" >&2
  tail -20 "$2" >&2
  exit 1
}

"$bin" sim --names sim-a,sim-b --objects 2000 --churn 20 --kubeconfig-out "$work/sims" \
  >"$work/sims.log" 2>&1 &
pids+=($!)
"$bin" sim --names sim-old --objects 2000 --churn 20 --streaming-lists unknown \
  --kubeconfig-out "$work/sim-old" >"$work/sim-old.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 600); do [ -s "$work/sims" ] && [ -s "$work/sim-old" ] && break; sleep 0.1; done
kubeconfigs+=(--kubeconfig "$work/sims" --kubeconfig "$work/sim-old")

# One run of the server under callgrind over the simulated clusters and those of each
# `--kubeconfig` given, with the store in $work/data; its profile in $work/callgrind.$1.
profile() {
  # As the image runs it: its allocator setting, no backtraces.
  env -u RUST_BACKTRACE -u RUST_LOG MIMALLOC_PURGE_DELAY=1000 \
    valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.$1" \
    "$bin" serve "${kubeconfigs[@]}" --data-dir "$work/data" \
    --listen "$grpc" --metrics-listen "$metrics" >"$work/serve.$1.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  synced "$pid" "$work/serve.$1.log"
  local s="http://$grpc"
  "$bin" get pods -A -s "$s" >/dev/null
  "$bin" get deployments -A -l app -s "$s" -o json >/dev/null
  "$bin" get pods -A --field-selector status.phase=Running -s "$s" --metadata-only >/dev/null
  "$bin" count pods -s "$s" >/dev/null
  "$bin" describe namespaces -s "$s" >/dev/null
  "$bin" clusters -o wide -s "$s" >/dev/null
  "$bin" store -s "$s" >/dev/null
  timeout 20 "$bin" watch pods -A --initial -s "$s" >/dev/null || true
  for path in /metrics /readyz /livez /healthz; do http_get "$path"; done
  kill -TERM "$pid"
  wait "$pid" || true
}
profile first
profile restart

# Every defined function of the binary, by address; those that ran, in that order.
nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ { print $1, $3 }' | sort >"$work/symbols"
cat "$work"/callgrind.* |
  sed -n 's/^c\{0,1\}fn=([0-9]*) \(.*\)$/\1/p' | sort -u >"$work/ran"
{
  echo "# The functions a server runs, for the linker to place first (link/text-order.sh)."
  echo "# $("$bin" version), $(rustc --version), $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  awk 'NR == FNR { ran[$0] = 1; next } ($2 in ran) { print $2 }' "$work/ran" "$work/symbols"
} >link/text-order.txt
echo "link/text-order.txt: $(grep -vc '^#' link/text-order.txt) functions"
