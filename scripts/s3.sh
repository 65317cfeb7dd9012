#!/usr/bin/env bash
# A throw-away S3-compatible server (moto in server mode, from PyPI) on a free
# loopback port, for the object-storage checkpoint tests.
#   scripts/s3.sh install      -> a venv with moto[server] (once; cached)
#   scripts/s3.sh start DIR    -> starts it, creates the bucket `tally`; writes
#                                 DIR/endpoint (http://127.0.0.1:PORT)
#   scripts/s3.sh stop DIR     -> stops it and removes DIR
# Why moto: it implements S3's conditional writes (`If-None-Match: *` answered with
# 412 since 5.0.15; 5.2.0 answered 500), which tally's checkpoints rely on, starts
# in about a second, and is one `pip install`. It accepts any credentials.
set -euo pipefail

MOTO_VERSION=5.2.5
venv=${TALLY_S3_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tally/moto-$MOTO_VERSION}
cmd=${1:?usage: s3.sh install|start DIR|stop DIR}

install() {
  [ -x "$venv/bin/moto_server" ] && return 0
  echo "s3.sh: installing moto[server]==$MOTO_VERSION into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==$MOTO_VERSION" >&2
}

# Below Linux's ephemeral ports (32768-60999 by default), where the local end of
# an outgoing connection could hold the port without any probe seeing it.
free_port() {
  local p
  for p in $(seq 29000 29999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  echo "s3.sh: no free port" >&2; return 1
}

case "$cmd" in
  install) install ;;
  start)
    dir=${2:?usage: s3.sh start DIR}
    install
    mkdir -p "$dir"
    port=$(free_port)
    "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$dir/server.log" 2>&1 &
    echo $! >"$dir/pid"
    for _ in $(seq 1 300); do
      if curl -fsS -o /dev/null "http://127.0.0.1:$port/moto-api/" 2>/dev/null; then break; fi
      kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/server.log" >&2; exit 1; }
      sleep 0.1
    done
    curl -fsS -o /dev/null -X PUT "http://127.0.0.1:$port/tally" \
      || { echo "s3.sh: the server did not answer" >&2; cat "$dir/server.log" >&2; exit 1; }
    echo "http://127.0.0.1:$port" >"$dir/endpoint"
    echo "s3.sh: S3 (moto $MOTO_VERSION) at $(cat "$dir/endpoint"), bucket tally" >&2
    ;;
  stop)
    dir=${2:?usage: s3.sh stop DIR}
    if [ -f "$dir/pid" ]; then
      kill "$(cat "$dir/pid")" 2>/dev/null || true
    fi
    rm -rf "$dir"
    ;;
  *) echo "usage: s3.sh install|start DIR|stop DIR" >&2; exit 2 ;;
esac
