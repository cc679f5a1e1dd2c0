# Shared helpers of the benchmarks: a release build, a scratch nats-server, and /proc sampling.
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"
ensure_rust
ensure_python_env
BENCH_DIR="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$BENCH_DIR"; }
trap cleanup EXIT

build_release() { log "building (release)"; cargo build -q --release --bins; BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"; }

start_nats() {
  NATS_PORT="$(free_port)"; NATS_MON="$(free_port)"
  "$NATS_SERVER_BIN" -c "$ROOT/deploy/nats/dev.conf" -a 127.0.0.1 -p "$NATS_PORT" -m "$NATS_MON" -sd "$BENCH_DIR/nats" \
    >"$BENCH_DIR/nats.log" 2>&1 &
  PIDS+=($!)
  wait_http "http://127.0.0.1:$NATS_MON/healthz?js-enabled-only=true" 30 || die "nats-server did not start"
  MULTIPILOT_NATS__URL="nats://127.0.0.1:$NATS_PORT" "$BIN/multipilot" provision >/dev/null
}

# cpu_ticks PID: user+system clock ticks so far
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# rss_kib PID / hwm_kib PID
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
hwm_kib() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }

# sample PID SECONDS LABEL: prints average cores, peak of 1 s cores, average and peak RSS
sample() {
  local pid=$1 secs=$2 label=$3 hz; hz="$(getconf CLK_TCK)"
  local start end prev now peak_c=0 rss sum_rss=0 peak_rss=0
  start="$(cpu_ticks "$pid")"; prev=$start
  for _ in $(seq 1 "$secs"); do
    sleep 1
    now="$(cpu_ticks "$pid")"
    local c=$((now - prev)); prev=$now
    [ "$c" -gt "$peak_c" ] && peak_c=$c
    rss="$(rss_kib "$pid")"; sum_rss=$((sum_rss + rss)); [ "$rss" -gt "$peak_rss" ] && peak_rss=$rss
  done
  end="$(cpu_ticks "$pid")"
  python3 - "$label" "$start" "$end" "$secs" "$hz" "$peak_c" "$sum_rss" "$peak_rss" <<'PY'
import sys
label, start, end, secs, hz, peak_c, sum_rss, peak_rss = sys.argv[1], *map(float, sys.argv[2:])
print(f"{label}: cpu avg {(end-start)/hz/secs:.3f} cores, peak(1s) {peak_c/hz:.2f} cores; "
      f"RSS avg {sum_rss/secs/1024:.1f} MiB, peak {peak_rss/1024:.1f} MiB")
PY
}
