# Start the local servers the integration tests talk to, when they are not running.
# Sourced by scripts/test. Each start command is this machine kind's documented one.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
    local port=$1 name=$2
    for _ in $(seq 1 60); do port_open "$port" && return 0; sleep 0.5; done
    echo "haze: $name did not start on port $port" >&2
    return 1
}

# Debian tools some tests drive: chromium for the dashboard's browser tests
# (tests/dashboard), tmux for the live `queue:top` view (tests/test_queue_top_tmux.py).
# Installed once, when missing and apt-get can run (root); otherwise those tests skip
# locally and fail under CI=true.
ensure_tools() {
    local missing=()
    for tool in chromium tmux; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ -n "${HAZE_NO_APT:-}" ] && return 0
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "haze: ${missing[*]} not found; the dashboard's browser tests need chromium and" \
            "the live queue:top test needs tmux. Installing ${missing[*]} now with" \
            "apt-get update && apt-get install (a few minutes the first time; log in" \
            "/tmp/haze-tools-install.log). HAZE_NO_APT=1 skips this: those tests then skip" \
            "locally and fail under CI=true." >&2
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") \
            >/tmp/haze-tools-install.log 2>&1 \
            || echo "haze: installing ${missing[*]} failed (see /tmp/haze-tools-install.log)" >&2
    fi
}

ensure_services() {
    ensure_tools
    if ! port_open 5432 && command -v pg_ctlcluster >/dev/null 2>&1; then
        echo "haze: starting PostgreSQL" >&2
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
        wait_port 5432 PostgreSQL || true
    fi
    if ! port_open 6379 && command -v redis-server >/dev/null 2>&1; then
        echo "haze: starting Redis" >&2
        redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
            --dir /tmp --logfile /tmp/haze-redis.log || true
        wait_port 6379 Redis || true
    fi
    if ! port_open 3306 && command -v mariadbd >/dev/null 2>&1; then
        echo "haze: starting MariaDB" >&2
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
        wait_port 3306 MariaDB || true
    fi
}
