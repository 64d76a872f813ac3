"""SQL-queue benchmarks, side by side in one run: haze's database driver (SQLite,
PostgreSQL, MariaDB) against Procrastinate, PgQueuer and a raw ``SKIP LOCKED`` loop on
the same PostgreSQL.

    python bench/sql.py [--n 5000] [--lat-n 1000] [--rate 200] [--only haze-postgres,...]
    python bench/sql.py --burn 1000000 --burn-workers 4 --no-single   # burn-down only
    python bench/sql.py --enqueue-only 5 --only raw-pg,raw-pg-notify,haze-postgres --n 3000
    python bench/sql.py --enqueue-only 5 --base-src /tmp/base/runtime/src \
        --only raw-pg,raw-pg-notify,haze-postgres-base,haze-postgres   # before and after

Method (the one of shared/tools/peerbench, per peer):
  * enqueue/s: one producer process, N single enqueues with the library's normal API;
    ``raw-pg-notify`` is the like-for-like ceiling of haze's PostgreSQL enqueue (an
    INSERT and its worker wake-up, NOTIFY, in one statement), ``raw-pg`` the plain INSERT,
    ``raw-pg-notify-async`` raw-pg-notify's loop on psycopg's async connection (the floor
    of any asyncio client: what the async driver and the event loop cost per statement);
  * bulk/s: the library's bulk API in chunks of 1,000 (haze: ``Queue.bulk``);
  * drain/s: N jobs queued first, then ONE worker process; rate = (N-1) / (last job start
    - first job start), so start-up is excluded;
  * latency: a worker running and warmed; LAT_N jobs enqueued one at a time at RATE/s;
    latency = job start - time right before the enqueue call;
  * burn-down (``--burn ROWS``, 0 to skip): ROWS jobs queued first with the bulk API
    (untimed), then ``--burn-workers`` worker processes started together; rate =
    (ROWS-1) / (last job start - first job start). The issue's figure is 1,000,000
    rows; the default is small enough for a smoke run.
Each no-op job appends (t_enq, t_start) to a record file (peers/records.py).
The ``haze-*`` rows run producer and worker on asyncio's own loop (``--loop asyncio``),
the ``haze-uvloop-*`` rows on uvloop (``BENCH_LOOP=uvloop``, ``--loop uvloop``).
Procrastinate and PgQueuer run from their own venvs (``bench/setup_peers.sh``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
sys.path.insert(0, str(PEERS))
import records  # noqa: E402

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_DSN = os.environ.get("BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/haze_bench")
MY_URL = os.environ.get("BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/haze_bench")
PROCRASTINATE_PY = HERE / ".venvs" / "procrastinate" / "bin" / "python"
PGQUEUER_PY = HERE / ".venvs" / "pgqueuer" / "bin" / "python"
VENVS = {"procrastinate": PROCRASTINATE_PY, "pgqueuer": PGQUEUER_PY}
#: ``--base-src``: the ``runtime/src`` the haze-postgres-base row imports haze from
BASE_SRC = ""


def peers() -> dict[str, dict[str, object]]:
    haze = [sys.executable, str(PEERS / "haze_sql.py")]
    conc = os.environ.get("BENCH_CONCURRENCY", "8")
    return {
        "raw-pg": {
            "cmd": [sys.executable, str(PEERS / "raw_pg.py")],
            "backend": "postgres",
            "desc": "1x1 SKIP LOCKED loop + LISTEN",
            "env": {},
        },
        "raw-pg-notify": {
            "cmd": [sys.executable, str(PEERS / "raw_pg.py")],
            "backend": "postgres",
            "desc": "raw-pg, each INSERT with its NOTIFY in one statement",
            "env": {"BENCH_RAW_NOTIFY": "1"},
        },
        "raw-pg-notify-async": {
            "cmd": [sys.executable, str(PEERS / "raw_pg.py")],
            "backend": "postgres",
            "desc": "raw-pg-notify's enqueue on psycopg's async connection (asyncio)",
            "env": {"BENCH_RAW_NOTIFY": "1", "BENCH_RAW_ASYNC": "1"},
        },
        "procrastinate": {
            "cmd": [str(PROCRASTINATE_PY), str(PEERS / "procrastinate_peer.py")],
            "backend": "postgres",
            "desc": "1x1 asyncio (its default)",
            "env": {},
        },
        "pgqueuer": {
            "cmd": [str(PGQUEUER_PY), str(PEERS / "pgqueuer_peer.py")],
            "backend": "postgres",
            "desc": "1 process, asyncpg, dequeue batch 10 (its benchmark's)",
            "env": {},
        },
        "haze-postgres": {
            "cmd": haze,
            "backend": "postgres",
            "desc": f"1x{conc} asyncio",
            "env": {"BENCH_DB_URL": PG_DSN},
        },
        "haze-sqlite": {
            "cmd": haze,
            "backend": "sqlite",
            "desc": f"1x{conc} asyncio",
            "env": {"BENCH_DB_URL": "sqlite:////tmp/haze-bench/q.db"},
        },
        "haze-mariadb": {
            "cmd": haze,
            "backend": "mariadb",
            "desc": f"1x{conc} asyncio",
            "env": {"BENCH_DB_URL": MY_URL},
        },
        # ``--base-src``: the haze-postgres row on another tree's runtime (a ``git archive``
        # of the commit to compare with), in the same run
        "haze-postgres-base": {
            "cmd": haze,
            "backend": "postgres",
            "desc": f"1x{conc} asyncio, runtime from --base-src",
            "env": {"BENCH_DB_URL": PG_DSN, "BENCH_BASE_SRC": BASE_SRC},
        },
        **{
            f"haze-uvloop-{backend}": {
                "cmd": haze,
                "backend": backend,
                "desc": f"1x{conc} uvloop (queue:work --loop uvloop, producer on uvloop)",
                "env": {"BENCH_DB_URL": url, "BENCH_LOOP": "uvloop"},
            }
            for backend, url in (
                ("postgres", PG_DSN),
                ("sqlite", "sqlite:////tmp/haze-bench/q.db"),
                ("mariadb", MY_URL),
            )
        },
    }


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {"BENCH_PG_DSN": PG_DSN, "BENCH_RECORDS": records.RECORD_FILE, "PYTHONPATH": str(PEERS)}
    )
    env.update(extra)
    base = env.pop("BENCH_BASE_SRC", "")
    if base:
        env["PYTHONPATH"] = f"{base}{os.pathsep}{env['PYTHONPATH']}"
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def run(peer: dict[str, object], *args: str, timeout: float = 600) -> dict[str, object]:
    out = subprocess.run(
        [*peer["cmd"], *args],
        env=_env(peer["env"]),
        cwd=PEERS,  # type: ignore[misc]
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, object] = json.loads(line[7:])
            return result
    if out.returncode == 0:
        return {}
    raise RuntimeError(f"{peer['cmd']} {args} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")


def worker_cmd(peer: dict[str, object]) -> list[str]:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import importlib; "
        "print('\\0'.join(importlib.import_module(sys.argv[2]).worker_cmd()))"
    )
    script = Path(peer["cmd"][1]).stem  # type: ignore[index]
    out = subprocess.run(
        [peer["cmd"][0], "-c", code, str(PEERS), script],  # type: ignore[index]
        env=_env(peer["env"]),
        cwd=PEERS,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().split("\0")


def start_worker(peer: dict[str, object], cmd: list[str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd or worker_cmd(peer),
        env=_env(peer["env"]),
        cwd=PEERS,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_records(n: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if records.count() >= n:
            return True
        time.sleep(0.05)
    return False


def measure(
    name: str, peer: dict[str, object], n: int, lat_n: int, rate: float
) -> dict[str, object]:
    res: dict[str, object] = {"peer": name, "desc": peer["desc"]}
    run(peer, "clean")
    records.reset()
    res["enqueue"] = run(peer, "enqueue", str(n))["rate"]
    w = start_worker(peer)
    ok = wait_records(n, 300)
    stop(w)
    recs = sorted(r[1] for r in records.read())
    res["drain"] = (len(recs) - 1) / (recs[-1] - recs[0]) if ok and len(recs) > 1 else None
    run(peer, "clean")
    res["bulk"] = run(peer, "bulk", str(n))["rate"]
    run(peer, "clean")
    records.reset()
    w = start_worker(peer)
    try:
        run(peer, "enqueue", "20")
        wait_records(20, 60)
        time.sleep(1.0)
        records.reset()
        run(peer, "latency", str(lat_n), str(rate))
        wait_records(lat_n, 60)
    finally:
        stop(w)
    lat = sorted((s - e) * 1000 for e, s in records.read())
    if lat:
        res["p50"] = statistics.median(lat)
        res["p99"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    run(peer, "clean")
    return res


def burn_down(name: str, peer: dict[str, object], rows: int, workers: int) -> dict[str, object]:
    """ROWS jobs queued (bulk, untimed), then WORKERS worker processes drain them."""
    res: dict[str, object] = {"peer": name, "rows": rows, "workers": workers}
    run(peer, "clean")
    run(peer, "bulk", str(rows), timeout=max(600, rows / 500))
    records.reset()
    cmd = worker_cmd(peer)
    procs = [start_worker(peer, cmd) for _ in range(workers)]
    try:
        ok = wait_records(rows, max(300, rows / 100))
    finally:
        for p in procs:
            stop(p)
    starts = sorted(r[1] for r in records.read())
    res["drain"] = (len(starts) - 1) / (starts[-1] - starts[0]) if ok and len(starts) > 1 else None
    res["done"] = len(starts)
    run(peer, "clean")
    return res


def burn_table(rows: list[dict[str, object]]) -> str:
    raw = next((r for r in rows if r["peer"] == "raw-pg"), {})
    lines = [
        "| peer | worker processes | rows | drain/s | drain vs raw |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r.get("drain"), raw.get("drain")
        ratio = f"{a / b:.2f}x" if isinstance(a, float) and isinstance(b, float) and b else "-"
        lines.append(
            f"| {r['peer']} | {r.get('workers', '-')} | {fmt(r.get('rows'))} | "
            f"{fmt(r.get('drain'))} | {ratio} |"
        )
    return "\n".join(lines)


def prepare() -> None:
    import psycopg

    name = psycopg.conninfo.conninfo_to_dict(PG_DSN)["dbname"]
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            c.execute(f'CREATE DATABASE "{name}"')
    try:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", user="root", port=3306)
        conn.cursor().execute("CREATE DATABASE IF NOT EXISTS haze_bench")
        conn.close()
    except Exception as e:  # MariaDB missing: its row is skipped
        print(f"mariadb unavailable: {e}", file=sys.stderr)
    Path("/tmp/haze-bench").mkdir(exist_ok=True)


def fmt(v: object, digits: int = 0) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.{digits}f}" if isinstance(v, (int, float)) else str(v)


def table(rows: list[dict[str, object]]) -> str:
    base = {r["peer"]: r for r in rows}
    proc = base.get("procrastinate", {})
    raw = base.get("raw-pg", {})
    notify = base.get("raw-pg-notify", {})
    lines = [
        "| peer | procs x conc | enqueue/s | bulk/s | drain/s | drain vs procrastinate "
        "| drain vs raw | enqueue vs raw | enqueue vs raw+notify | latency p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:

        def ratio(a: object, b: object) -> str:
            return (
                f"{a / b:.2f}x"
                if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b
                else "-"
            )

        lines.append(
            f"| {r['peer']} | {r['desc']} | {fmt(r.get('enqueue'))} | {fmt(r.get('bulk'))} | "
            f"{fmt(r.get('drain'))} | {ratio(r.get('drain'), proc.get('drain'))} | "
            f"{ratio(r.get('drain'), raw.get('drain'))} | "
            f"{ratio(r.get('enqueue'), raw.get('enqueue'))} | "
            f"{ratio(r.get('enqueue'), notify.get('enqueue'))} | "
            f"{fmt(r.get('p50'), 1)} / {fmt(r.get('p99'), 1)} |"
        )
    return "\n".join(lines)


def enqueue_rounds(chosen: list[str], n: int, rounds: int) -> list[dict[str, object]]:
    """Single enqueue only: every peer once a round, ROUNDS rounds; the median round."""
    rates: dict[str, list[float]] = {name: [] for name in chosen}
    for i in range(rounds):
        for name in chosen:
            peer = peers()[name]
            run(peer, "clean")
            rate = run(peer, "enqueue", str(n))["rate"]
            assert isinstance(rate, float)
            rates[name].append(rate)
            print(f"round {i + 1} {name}: {rate:,.0f}/s", file=sys.stderr, flush=True)
        run(peers()[chosen[-1]], "clean")
    return [
        {"peer": name, "desc": peers()[name]["desc"], "enqueue": statistics.median(r)}
        for name, r in rates.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--lat-n", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--only", default="")
    ap.add_argument("--burn", type=int, default=20000, help="burn-down rows (0: skip)")
    ap.add_argument("--burn-workers", type=int, default=2)
    ap.add_argument("--no-single", action="store_true", help="burn-down only")
    ap.add_argument("--enqueue-only", type=int, default=0, metavar="ROUNDS")
    ap.add_argument("--json")
    ap.add_argument("--base-src", default="", help="runtime/src of the haze-postgres-base row")
    args = ap.parse_args()
    global BASE_SRC
    BASE_SRC = args.base_src
    prepare()
    chosen = []
    for name in peers():
        if args.only and name not in args.only.split(","):
            continue
        if name == "haze-postgres-base" and not BASE_SRC:
            print(f"{name} needs --base-src", file=sys.stderr)
            continue
        venv = VENVS.get(name)
        if venv is not None and not venv.exists():
            print(f"{name} venv missing: run bench/setup_peers.sh", file=sys.stderr)
            continue
        chosen.append(name)
    rows, burns = [], []
    if args.enqueue_only:
        rows = enqueue_rounds(chosen, args.n, args.enqueue_only)
        args.no_single, args.burn = True, 0
    for name in chosen if not args.no_single else []:
        print(f"== {name}", file=sys.stderr, flush=True)
        try:
            rows.append(measure(name, peers()[name], args.n, args.lat_n, args.rate))
        except Exception as e:
            print(f"{name} failed: {e}", file=sys.stderr)
            rows.append({"peer": name, "desc": f"failed: {type(e).__name__}"})
    for name in chosen if args.burn > 0 else []:
        print(f"== {name} burn-down", file=sys.stderr, flush=True)
        try:
            burns.append(burn_down(name, peers()[name], args.burn, args.burn_workers))
        except Exception as e:
            print(f"{name} burn-down failed: {e}", file=sys.stderr)
            burns.append({"peer": name, "workers": args.burn_workers, "rows": args.burn})
    load = os.getloadavg()[0]
    if rows:
        print(table(rows))
        print(
            f"\nN={args.n}, latency {args.lat_n} jobs at {args.rate:g}/s; one worker process "
            f"each; 1-min load {load:.1f} on {os.cpu_count()} CPUs.\n"
            if not args.enqueue_only
            else f"\nN={args.n} single enqueues, median of {args.enqueue_only} interleaved "
            f"rounds; 1-min load {load:.1f} on {os.cpu_count()} CPUs.\n"
        )
    if burns:
        print(burn_table(burns))
        print(
            f"\nBurn-down: {args.burn:,} rows queued first, {args.burn_workers} worker "
            f"processes; 1-min load {load:.1f} on {os.cpu_count()} CPUs."
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"single": rows, "burn": burns}, indent=2))


if __name__ == "__main__":
    main()
