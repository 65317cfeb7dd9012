#!/usr/bin/env bash
# A throw-away PostgreSQL cluster in a directory of ours, on a free port.
#   scripts/pg.sh start DIR   -> initdb + pg_ctl start; writes DIR/url
#   scripts/pg.sh stop DIR    -> pg_ctl stop (immediate) and removes DIR
#   scripts/pg.sh restart DIR -> pg_ctl restart (fast; same port): clients lose
#                                their connections (the sink's retry test)
# As root, the server runs as the `postgres` user (initdb refuses root).
#
# TLS mode (for the TLS tests): with PG_TLS_DIR (server.pem, server.key, e.g.
# from `tally-dev certs`) and PG_PASSWORD set, the server has ssl=on and a
# pg_hba.conf that admits TCP clients only over TLS with scram-sha-256 (the unix
# socket stays trust, for setting the password). DIR/url has no password.
set -euo pipefail

cmd=${1:?usage: pg.sh start|stop|restart DIR}
dir=${2:?usage: pg.sh start|stop|restart DIR}
case "$dir" in /*) ;; *) dir=$PWD/$dir ;; esac
PGBIN=${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}
[ -x "$PGBIN/initdb" ] || { echo "pg.sh: no PostgreSQL binaries found (run scripts/bootstrap.sh)" >&2; exit 1; }

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# Ports are claimed, not just probed: tests start clusters concurrently, and a
# port that is free when probed may be bound by a sibling's postmaster a moment
# later (or during a sibling's `restart`). A claim is a file named for the port
# in $claims, created with noclobber (atomic), holding the cluster's directory; a
# claim whose directory is gone is stale and taken over. `stop` drops the claim.
# The range lies below Linux's ephemeral ports (32768-60999 by default): a port
# there may be the local end of some outgoing connection, which no probe sees
# but which makes the postmaster's bind fail.
claims=${TMPDIR:-/tmp}/tally-pg-ports
claim_port() {
  local p owner
  mkdir -p "$claims"
  chmod 1777 "$claims" 2>/dev/null || true
  for p in $(seq "$1" 25999); do
    if ! (set -o noclobber; echo "$dir" >"$claims/$p") 2>/dev/null; then
      owner=$(cat "$claims/$p" 2>/dev/null || true)
      [ -n "$owner" ] && [ -d "$owner" ] && continue
      rm -f "$claims/$p"
      (set -o noclobber; echo "$dir" >"$claims/$p") 2>/dev/null || continue
    fi
    # Something other than our clusters may listen there.
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then rm -f "$claims/$p"; continue; fi
    echo "$p"; return 0
  done
  echo "pg.sh: no free port in 25432-25999" >&2; return 1
}

case "$cmd" in
  start)
    mkdir -p "$dir"
    chmod 755 "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir" 2>/dev/null || true
    as_pg "$PGBIN/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    opts="-c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir -c fsync=off -c max_connections=200"
    if [ -n "${PG_TLS_DIR:-}" ]; then
      : "${PG_PASSWORD:?pg.sh: TLS mode needs PG_PASSWORD}"
      install -m 600 "$PG_TLS_DIR/server.key" "$dir/data/server.key"
      install -m 644 "$PG_TLS_DIR/server.pem" "$dir/data/server.crt"
      [ "$(id -u)" -eq 0 ] && chown postgres "$dir/data/server.key" "$dir/data/server.crt"
      printf 'local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n' >"$dir/data/pg_hba.conf"
      opts="$opts -c ssl=on -c password_encryption=scram-sha-256"
    fi
    # A process outside the claims may still bind the port between the probe
    # and the postmaster's bind: then a port after it is tried.
    port=25431
    for attempt in 1 2 3 4 5; do
      port=$(claim_port $((port + 1)))
      rm -f "$dir/server.log"
      if as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
        -o "-p $port $opts" >/dev/null; then
        break
      fi
      rm -f "$claims/$port"
      if [ "$attempt" -lt 5 ] && grep -q "Address already in use" "$dir/server.log"; then
        echo "pg.sh: port $port was taken meanwhile; trying another" >&2
        continue
      fi
      cat "$dir/server.log" >&2; exit 1
    done
    if [ -n "${PG_TLS_DIR:-}" ]; then
      # From stdin: psql interpolates :'pw' (quoted as a literal) there, not in -c.
      echo "ALTER USER postgres PASSWORD :'pw';" | as_pg "$PGBIN/psql" -q -h "$dir" -p "$port" \
        -U postgres -d postgres -v ON_ERROR_STOP=1 -v pw="$PG_PASSWORD" >/dev/null
    fi
    echo "postgres://postgres@127.0.0.1:$port/postgres" >"$dir/url"
    echo "pg.sh: PostgreSQL running at $(cat "$dir/url")" >&2
    ;;
  restart)
    as_pg "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -m fast -w -t 60 restart >/dev/null \
      || { cat "$dir/server.log" >&2; exit 1; }
    ;;
  stop)
    if [ -d "$dir/data" ]; then
      as_pg "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ -f "$dir/url" ]; then
      port=$(sed -n 's|.*:\([0-9]*\)/postgres$|\1|p' "$dir/url")
      [ -n "$port" ] && [ "$(cat "$claims/$port" 2>/dev/null)" = "$dir" ] && rm -f "$claims/$port"
    fi
    rm -rf "$dir"
    ;;
  *) echo "usage: pg.sh start|stop|restart DIR" >&2; exit 2 ;;
esac
