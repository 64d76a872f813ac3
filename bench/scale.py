"""Scale, soak, delayed jobs and cold start of ``haze queue:work`` (bench/README.md,
"Scale and soak"). Bounded runs for a quiet box, not for CI.

    .venv/bin/python bench/scale.py scale      # 1, 2, 4, 8 worker processes, Redis + PostgreSQL
    .venv/bin/python bench/scale.py soak       # 1M jobs through one worker: RSS + table size
    .venv/bin/python bench/scale.py delayed    # 100k jobs delayed 1-60 s: once each, p99 late
    .venv/bin/python bench/scale.py coldstart  # spawn -> first job's side effect
    .venv/bin/python bench/scale.py all --smoke   # every scenario at a small size

Every scenario starts real ``python -m haze.cli queue:work`` processes on the apps of
bench/peers (``app`` for SQL, ``redis_app`` for Redis; no-op job ``noop``, which appends
(t_enq, t_start) to a record file, and ``delayed_probe``, which appends (id, due, start)).
Jobs are queued by a producer subprocess (``scale.py _feed``) with ``Queue.bulk``.
The scaling curve is also registered with bench/run.py (entries ``scale-redis-pN`` and
``scale-postgres-pN``, reported against 1 process).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import resource
import signal
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
RUN_DIR = Path(os.environ.get("BENCH_RUN_DIR", "/tmp/haze-bench-scale"))
RUN_DIR.mkdir(parents=True, exist_ok=True)
os.environ["BENCH_RECORDS"] = str(RUN_DIR / "records.bin")
os.environ["BENCH_DELAYED_RECORDS"] = str(RUN_DIR / "delayed.bin")
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
if __name__ == "__main__":  # bench/redis.py would shadow redis-py
    sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != HERE]
sys.path.insert(0, str(PEERS))
import records  # noqa: E402

PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/postgres")
#: A database of its own: bench/sql.py empties haze_bench's jobs table between steps.
PG_DSN = os.environ.get(
    "BENCH_SCALE_PG_DSN", "postgresql://postgres@127.0.0.1:5432/haze_bench_scale"
)
MYSQL_ADMIN = os.environ.get("BENCH_MYSQL_ADMIN", "mysql://root@127.0.0.1:3306/")
MYSQL_DSN = os.environ.get("BENCH_SCALE_MYSQL_DSN", MYSQL_ADMIN + "haze_bench_scale")
#: The delayed scenario's target: p99 of (start - due) at most this (seconds).
DELAYED_P99_TARGET = 1.0
#: The interpreter the workers and the producer run in (this tree's haze must import).
PYTHON = os.environ.get("BENCH_HAZE_PYTHON", sys.executable)
DELAYED = struct.Struct("ddd")


@dataclass(frozen=True)
class Backend:
    name: str
    root: Path
    connection: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def sql(self) -> bool:
        return self.connection == "db"

    def worker_argv(self, concurrency: int | None = None, quiet: bool = False) -> list[str]:
        argv = [PYTHON, "-m", "haze.cli", "--root", str(self.root), "queue:work"]
        argv += ["--quiet"] if quiet else []
        argv += ["--connection", self.connection, "--queue", "bench"]
        return argv + (["--concurrency", str(concurrency)] if concurrency else [])


BACKENDS = {
    "redis": Backend("redis", PEERS / "redis_app", "redis"),
    "postgres": Backend("postgres", PEERS / "app", "db", {"BENCH_DB_URL": PG_DSN}),
    "mariadb": Backend("mariadb", PEERS / "app", "db", {"BENCH_DB_URL": MYSQL_DSN}),
    "sqlite": Backend(
        "sqlite", PEERS / "app", "db", {"BENCH_DB_URL": f"sqlite:///{RUN_DIR}/scale.db"}
    ),
}


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def _env(b: Backend) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(PEERS), PYTHONUNBUFFERED="1", **b.env)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def rss_kb(pid: int) -> int:
    """VmRSS of a process in kB (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def _redis() -> Any:
    """redis-py, also when bench/ (with its redis.py) is on sys.path (bench/run.py)."""
    if "redis" in sys.modules and hasattr(sys.modules["redis"], "Redis"):
        return sys.modules["redis"]
    saved = sys.path[:]
    sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != HERE]
    try:
        import redis

        return redis
    finally:
        sys.path[:] = saved


def skip_reason(name: str) -> str | None:
    """Why a backend cannot run here (no server), or None."""
    try:
        if name == "redis":
            _redis().Redis.from_url(os.environ["BENCH_REDIS_URL"], socket_timeout=2).ping()
        elif name == "postgres":
            import psycopg

            psycopg.connect(PG_ADMIN, connect_timeout=2).close()
        elif name == "mariadb":
            _mysql_admin().close()
    except Exception as e:
        return f"{name} unreachable: {e}"
    return None


def _mysql_admin() -> Any:
    from urllib.parse import urlsplit

    import pymysql

    u = urlsplit(MYSQL_ADMIN)
    return pymysql.connect(
        host=u.hostname, port=u.port or 3306, user=u.username or "root",
        password=u.password or "", connect_timeout=2,
    )  # fmt: skip


def prepare(b: Backend) -> None:
    if b.name == "mariadb":
        with _mysql_admin() as c, c.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{MYSQL_DSN.rsplit('/', 1)[1]}`")
    if b.name == "postgres":
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            db = PG_DSN.rsplit("/", 1)[1]
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone():
                c.execute(f'CREATE DATABASE "{db}"')
    helper(b, "_clean")


def helper(b: Backend, *args: object, timeout: float = 3600) -> None:
    subprocess.run(
        [PYTHON, __file__, *map(str, args), b.name],
        env=_env(b),
        cwd=PEERS,
        check=True,
        timeout=timeout,
    )


def feeder(b: Backend, n: int, backlog: int = 0, delay: tuple[float, float] | None = None):  # type: ignore[no-untyped-def]
    """A producer subprocess: N jobs with Queue.bulk, keeping at most BACKLOG not yet run."""
    args = ["_feed", n, backlog, *(delay or (0, 0)), b.name]
    return subprocess.Popen([PYTHON, __file__, *map(str, args)], env=_env(b), cwd=PEERS)


class Worker:
    def __init__(self, b: Backend, concurrency: int | None = None, quiet: bool = False) -> None:
        self.log = open(RUN_DIR / f"worker-{b.name}.log", "ab")  # noqa: SIM115
        self.spawned = time.time()
        self.proc = subprocess.Popen(
            b.worker_argv(concurrency, quiet),
            env=_env(b),
            cwd=PEERS,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop() signals only ours
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


def wait_count(
    count: Any, n: int, workers: list[Worker], timeout: float, stall: float = 60
) -> bool:
    deadline, last, changed = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        c = count()
        if c >= n:
            return True
        if c != last:
            last, changed = c, time.monotonic()
        elif time.monotonic() - changed > stall or not all(w.alive() for w in workers):
            return False
        time.sleep(0.02)
    return False


def delayed_read() -> list[tuple[float, float, float]]:
    try:
        data = Path(os.environ["BENCH_DELAYED_RECORDS"]).read_bytes()
    except FileNotFoundError:
        return []
    return [DELAYED.unpack_from(data, i * DELAYED.size) for i in range(len(data) // DELAYED.size)]


def delayed_count() -> int:
    try:
        return os.path.getsize(os.environ["BENCH_DELAYED_RECORDS"]) // DELAYED.size
    except FileNotFoundError:
        return 0


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# ------------------------------------------------------------------------------ scaling


def scale_once(b: Backend, procs: int, n: int, concurrency: int | None = None) -> dict[str, Any]:
    """N jobs queued first, then PROCS workers started together; rate from first to last
    job start. cpu: the workers' CPU seconds (reaped children)."""
    helper(b, "_clean")
    records.reset()
    f = feeder(b, n)
    if f.wait() != 0:
        raise RuntimeError(f"{b.name}: the producer exited {f.returncode}")
    cpu0 = children_cpu()
    workers = [Worker(b, concurrency) for _ in range(procs)]
    try:
        ok = wait_count(records.count, n, workers, timeout=max(120.0, n / 50))
    finally:
        for w in workers:
            w.stop()
    cpu = children_cpu() - cpu0
    starts = sorted(s for _, s in records.read())
    span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
    if not ok or span <= 0:
        raise RuntimeError(f"{b.name} x{procs}: {len(starts)}/{n} jobs ran")
    return {"n": len(starts), "span": span, "rate": (len(starts) - 1) / span, "cpu": cpu}


def cmd_scale(a: argparse.Namespace) -> str:
    procs = [int(x) for x in a.procs.split(",")]
    rates: dict[tuple[str, int], list[float]] = {}
    cpus: dict[tuple[str, int], list[float]] = {}
    backends = [BACKENDS[x] for x in a.backends.split(",")]
    for b in backends:
        prepare(b)
    for rep in range(a.reps):  # rounds: a burst of load hits every cell alike
        for b in backends:
            for p in procs:
                r = scale_once(b, p, a.n, a.concurrency)
                rates.setdefault((b.name, p), []).append(r["rate"])
                cpus.setdefault((b.name, p), []).append(r["cpu"] / r["n"] * 1e6)
                log(
                    f"scale {b.name} x{p} rep {rep}: {r['rate']:,.0f} jobs/s "
                    f"({r['cpu'] / r['n'] * 1e6:.0f} us cpu/job) load {os.getloadavg()[0]:.1f}"
                )
    lines = [
        "| backend | worker processes | jobs/s | vs 1 process "
        "| worker CPU us/job (incl. start-up) |",
        "|---|---|---|---|---|",
    ]
    for b in backends:
        one = statistics.median(rates[(b.name, procs[0])])
        for p in procs:
            med = statistics.median(rates[(b.name, p)])
            lines.append(
                f"| {b.name} | {p} | {_cell(rates[(b.name, p)])} | {med / one:.2f}x "
                f"| {statistics.median(cpus[(b.name, p)]):.0f} |"
            )
    conc = a.concurrency or "driver default"
    lines.append(
        f"\nN={a.n:,} jobs queued first, {a.reps} rep(s), concurrency {conc} per "
        f"process; {_machine()}"
    )
    return "\n".join(lines)


# --------------------------------------------------------------------------------- soak


def pg_sizes() -> dict[str, Any]:
    import psycopg

    with psycopg.connect(PG_DSN, autocommit=True) as c:
        row = c.execute(
            "SELECT pg_relation_size('jobs'), pg_indexes_size('jobs'), n_live_tup, n_dead_tup, "
            "autovacuum_count FROM pg_stat_user_tables WHERE relname = 'jobs'"
        ).fetchone()
    keys = ("table_bytes", "index_bytes", "live_tup", "dead_tup", "autovacuums")
    return dict(zip(keys, row or (0,) * 5, strict=True))


def cmd_soak(a: argparse.Namespace) -> str:
    out: list[str] = []
    for name in a.backends.split(","):
        b = BACKENDS[name]
        prepare(b)
        records.reset()
        w = Worker(b, a.concurrency, quiet=True)  # a line per job: GBs of log at 1M
        f = feeder(b, a.n, backlog=a.backlog)
        samples: list[dict[str, Any]] = []
        t0, mark = time.monotonic(), a.every
        try:
            deadline = t0 + max(600.0, a.n / 100)
            while time.monotonic() < deadline and w.alive():
                c = records.count()
                if c >= mark:
                    s: dict[str, Any] = {
                        "jobs": c,
                        "seconds": round(time.monotonic() - t0, 2),
                        "rss_kb": rss_kb(w.proc.pid),
                    }
                    if b.name == "postgres":
                        s.update(pg_sizes())
                    samples.append(s)
                    mark = (c // a.every + 1) * a.every
                if c >= a.n:
                    break
                if f.poll() not in (None, 0):
                    raise RuntimeError(f"soak {name}: the producer exited {f.returncode}")
                time.sleep(0.02)
        finally:
            w.stop()
            if f.poll() is None:
                f.terminate()
            f.wait()
        ran = records.count()
        path = Path(a.csv_dir) / f"soak-{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as fh:
            wr = csv.DictWriter(fh, fieldnames=list(samples[0]) if samples else ["jobs"])
            wr.writeheader()
            wr.writerows(samples)
        out.append(soak_table(name, samples, a.n, ran, path))
    out.append(
        f"\nOne worker, concurrency {a.concurrency or 'driver default'}; producer "
        f"keeps at most {a.backlog:,} jobs queued; {_machine()}"
    )
    return "\n".join(out)


def soak_table(name: str, samples: list[dict[str, Any]], n: int, ran: int, path: Path) -> str:
    if not samples:
        return f"{name}: no samples ({ran}/{n} jobs ran)"
    at10 = next((s for s in samples if s["jobs"] >= n // 10), samples[0])
    last = samples[-1]
    growth = (last["rss_kb"] - at10["rss_kb"]) / at10["rss_kb"] * 100 if at10["rss_kb"] else 0
    verdict = "met" if growth < 5 else "MISSED"
    pick = samples[:: max(1, len(samples) // 10)]
    if pick[-1] is not last:
        pick.append(last)
    pg = "table_bytes" in last
    head = "| jobs | s | worker RSS MiB |" + (
        " jobs table MiB | indexes MiB | dead tuples | autovacuums |" if pg else ""
    )
    lines = [
        f"\n**{name}**: {ran:,}/{n:,} jobs ran; RSS {at10['rss_kb'] / 1024:.1f} MiB at job "
        f"{at10['jobs']:,} -> {last['rss_kb'] / 1024:.1f} MiB at job {last['jobs']:,}: "
        f"{growth:+.1f}% (target < 5%: {verdict}); curve: {path}",
        "",
        head,
        "|---|---|---|" + ("---|---|---|---|" if pg else ""),
    ]
    for s in pick:
        row = f"| {s['jobs']:,} | {s['seconds']:.0f} | {s['rss_kb'] / 1024:.1f} |"
        if pg:
            row += (
                f" {s['table_bytes'] / 2**20:.1f} | {s['index_bytes'] / 2**20:.1f} | "
                f"{s['dead_tup']:,} | {s['autovacuums']} |"
            )
        lines.append(row)
    return "\n".join(lines)


# ------------------------------------------------------------------------------ delayed


def cmd_delayed(a: argparse.Namespace) -> str:
    out: list[str] = []
    for name in a.backends.split(","):
        b = BACKENDS[name]
        prepare(b)
        Path(os.environ["BENCH_DELAYED_RECORDS"]).unlink(missing_ok=True)
        w = Worker(b, a.concurrency, quiet=True)
        rss: list[int] = []
        t0 = time.monotonic()
        try:
            f = feeder(b, a.n, delay=(a.min, a.max))
            deadline = t0 + a.max + max(120.0, a.n / 200)
            while time.monotonic() < deadline and w.alive() and delayed_count() < a.n:
                if delayed_count():  # from the first job that fired: the worker is warm
                    rss.append(rss_kb(w.proc.pid))
                time.sleep(0.5)
            f.wait()
            time.sleep(a.grace)  # a job firing twice would show up here
            rss.append(rss_kb(w.proc.pid))
        finally:
            w.stop()
        recs = delayed_read()
        ids = [int(r[0]) for r in recs]
        late = sorted(r[2] - r[1] for r in recs)
        twice, missing = len(ids) - len(set(ids)), a.n - len(set(ids))
        rk = [k for k in rss if k]
        verdict = "ok" if twice == 0 and missing == 0 else "FAILED"
        p99 = _pct(late, 0.99)
        target = "met" if p99 <= DELAYED_P99_TARGET else "MISSED"
        out.append(
            f"**{name}**: {a.n:,} jobs delayed {a.min:g}-{a.max:g} s: ran {len(set(ids)):,}, "
            f"twice {twice}, missing {missing} ({verdict}); start - due p50 "
            f"{_pct(late, 0.5) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms (target "
            f"<= {DELAYED_P99_TARGET:g} s: {target}), max "
            f"{(late[-1] if late else 0) * 1000:.0f} ms; worker RSS min/max/last "
            f"{min(rk, default=0) / 1024:.1f}/{max(rk, default=0) / 1024:.1f}/"
            f"{(rk[-1] if rk else 0) / 1024:.1f} MiB over {len(rk)} samples from the first "
            "job that ran"
        )
    out.append(f"\nOne worker, concurrency {a.concurrency or 'driver default'}; {_machine()}")
    return "\n".join(out)


# ---------------------------------------------------------------------------- cold start


def cmd_coldstart(a: argparse.Namespace) -> str:
    times: dict[str, list[float]] = {}
    backends = [BACKENDS[x] for x in a.backends.split(",")]
    for b in backends:
        prepare(b)
    for rep in range(a.reps):
        for b in backends:
            helper(b, "_clean")
            f = feeder(b, 1)
            f.wait()
            records.reset()
            w = Worker(b)
            try:
                ok = wait_count(records.count, 1, [w], timeout=60)
            finally:
                w.stop()
            recs = records.read()
            if not ok or not recs:
                raise RuntimeError(f"cold start {b.name}: the job did not run")
            times.setdefault(b.name, []).append((recs[0][1] - w.spawned) * 1000)
            log(f"coldstart {b.name} rep {rep}: {times[b.name][-1]:.0f} ms")
    lines = ["| backend | spawn -> first job runs, ms: median (min-max) |", "|---|---|"]
    lines += [f"| {k} | {_cell(v)} |" for k, v in times.items()]
    lines.append(
        f"\n{a.reps} reps, one job queued before `haze queue:work` is spawned; "
        f"{_machine()} Import cost alone: bench/import_time.py."
    )
    return "\n".join(lines)


# ------------------------------------------------------------------------------ helpers


def _pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else 0.0


def _cell(xs: list[float]) -> str:
    s = f"{statistics.median(xs):,.0f}"
    return s + (f" ({min(xs):,.0f}-{max(xs):,.0f})" if len(xs) > 1 else "")


def _machine() -> str:
    return f"{os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.1f} at the end."


async def _feed(n: int, backlog: int, dmin: float, dmax: float, name: str) -> None:
    from haze import App, Queue

    b = BACKENDS[name]
    app = App(root=b.root)
    await app.__aenter__()
    if b.sql:
        from haze.connectors.migrations import ensure_queue_tables

        await ensure_queue_tables(app)
    from app.job.delayed_probe import delayed_probe
    from app.job.noop import noop

    sent = 0
    while sent < n:
        if backlog and sent - records.count() >= backlog:
            await asyncio.sleep(0.02)
            continue
        k = min(1000, n - sent)
        if dmax:
            now = time.time()
            items = []
            for i in range(sent, sent + k):
                d = random.uniform(dmin, dmax)
                items.append(delayed_probe.with_({"id": i, "due": now + d}).delay(d))
        else:
            items = [noop.with_({"t": time.time()}) for _ in range(k)]
        await Queue.bulk(items)
        sent += k
    await app.__aexit__(None, None, None)


async def _clean(name: str) -> None:
    b = BACKENDS[name]
    if not b.sql:
        import redis_common

        redis_common.clean()
        return
    from haze import App
    from haze.connectors.migrations import ensure_queue_tables

    app = App(root=b.root)
    await app.__aenter__()
    await ensure_queue_tables(app)
    if name == "postgres":  # the soak's size curve starts from an empty file
        await app.database().execute("TRUNCATE jobs, failed_jobs")
    else:
        await app.database().execute("DELETE FROM jobs")
        await app.database().execute("DELETE FROM failed_jobs")
    await app.__aexit__(None, None, None)


SMOKE = {
    "scale": {"n": 2000, "procs": "1,2,4,8", "reps": 1},
    "soak": {"n": 20_000, "every": 1000, "backlog": 5000},
    "delayed": {"n": 5000, "min": 1.0, "max": 5.0, "grace": 2.0},
    "coldstart": {"reps": 2},
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_feed":
        n, backlog, dmin, dmax, name = argv[1:]
        asyncio.run(_feed(int(n), int(backlog), float(dmin), float(dmax), name))
        return 0
    if argv and argv[0] == "_clean":
        asyncio.run(_clean(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("scenario", choices=["scale", "soak", "delayed", "coldstart", "all"])
    ap.add_argument("--smoke", action="store_true", help="small sizes: proves it runs")
    ap.add_argument("--backends", help="comma-separated: redis, postgres, mariadb, sqlite")
    ap.add_argument("--n", type=int, help="jobs (scale 20,000; soak 1,000,000; delayed 100,000)")
    ap.add_argument("--procs", default="1,2,4,8", help="scale: worker process counts")
    ap.add_argument("--reps", type=int, help="scale 3, coldstart 5")
    ap.add_argument("--concurrency", type=int, help="per worker (default: the driver's)")
    ap.add_argument("--every", type=int, help="soak: sample every K jobs (N/100)")
    ap.add_argument("--backlog", type=int, default=20_000, help="soak: jobs queued ahead (20,000)")
    ap.add_argument("--csv-dir", default=str(RUN_DIR), help="soak: where the CSV curves go")
    ap.add_argument("--min", type=float, default=1.0, help="delayed: shortest delay, s")
    ap.add_argument("--max", type=float, default=60.0, help="delayed: longest delay, s")
    ap.add_argument("--grace", type=float, default=10.0, help="delayed: wait after the last")
    a = ap.parse_args(argv)
    given = {x.lstrip("-").split("=")[0].replace("-", "_") for x in argv if x.startswith("--")}
    scenarios = ["scale", "soak", "delayed", "coldstart"] if a.scenario == "all" else [a.scenario]
    defaults = {
        "scale": {"n": 20_000, "reps": 3, "backends": "redis,postgres"},
        "soak": {"n": 1_000_000, "backends": "redis,postgres"},
        "delayed": {"n": 100_000, "backends": "redis,postgres,mariadb,sqlite"},
        "coldstart": {"reps": 5, "backends": "sqlite,postgres,redis"},
    }
    status = 0
    for sc in scenarios:
        # the scenario's defaults, then its smoke sizes, then what was given on the line
        opts = {**vars(a), **defaults[sc], **(SMOKE[sc] if a.smoke else {})}
        opts.update({k: v for k, v in vars(a).items() if v is not None and k in given})
        if sc == "soak" and opts.get("every") is None:
            opts["every"] = max(1, opts["n"] // 100)
        ns = argparse.Namespace(**opts)
        missing = [x for x in ns.backends.split(",") if skip_reason(x)]
        if missing:
            print(f"{sc}: skipped, {'; '.join(filter(None, map(skip_reason, missing)))}")
            status = 1
            continue
        log(f"{sc}: {ns.backends}")
        text = {
            "scale": cmd_scale,
            "soak": cmd_soak,
            "delayed": cmd_delayed,
            "coldstart": cmd_coldstart,
        }[sc](ns)
        print(f"\n### {sc}\n\n{text}\n", flush=True)
    return status


# --------------------------------------------------------------------- bench/run.py entries


def _register() -> None:
    import harness

    for name in ("redis", "postgres"):
        for p in (1, 2, 4, 8):

            def fn(n: int, _b: Backend = BACKENDS[name], _p: int = p) -> harness.Measurement:
                prepare(_b)
                r = scale_once(_b, _p, n)
                return harness.Measurement(r["n"] - 1, r["span"], r["cpu"])

            harness.entry(
                f"scale-{name}-p{p}",
                baseline=None if p == 1 else f"scale-{name}-p1",
                group=f"scale-{name}",
                description=f"{p} `haze queue:work` process(es) drain N queued jobs ({name}); "
                "cpu = the workers' CPU",
                skip_reason=lambda _n=name: skip_reason(_n),
            )(fn)


if __name__ == "__main__":
    sys.exit(main())
else:
    _register()
