"""Redis queues side by side in one run: haze's ``redis`` driver against bare bullmq,
Huey, Dramatiq, SAQ, Celery, RQ and arq, with a raw redis-py BRPOP loop as the ceiling.

    bench/setup_peers.sh                      # once: a venv per peer under bench/.venvs
    .venv/bin/python bench/redis.py           # everything: N=10,000, 3 reps, ~15 min
    .venv/bin/python bench/redis.py --peers haze,bullmq-c10,huey --n 2000 --reps 1
    .venv/bin/python bench/redis.py --json /tmp/redis.json
    .venv/bin/python bench/redis.py --table /tmp/redis.json    # re-print a saved run

Method (the one of shared/tools/peerbench), per peer:
  * enqueue/s: one producer process, N calls of the library's single-enqueue API (client
    connected before the clock starts);
  * bulk/s: the library's bulk API in chunks of 1,000, where it has one;
  * drain/s: N jobs queued first, then ONE worker process at the library's default
    concurrency (variants say what they change); rate = (N-1) / (last job start - first
    job start), so worker start-up is excluded;
  * latency: a running worker, warmed with 20 jobs; then per rep: 1 s idle, LAT_N jobs
    enqueued one at a time at RATE/s; latency = job start - time.time() right before the
    enqueue call (so it includes the enqueue call itself).
The haze rows run worker and producer on asyncio's own loop (``--loop asyncio``); the
haze-uvloop row runs both on uvloop (``queue:work --loop uvloop``, ``BENCH_LOOP=uvloop``).
Every no-op job appends (t_enq, t_start) to a record file (peers/records.py, ~2 µs).
Throughput runs in rounds (round r measures every peer once) so a burst of load from
other processes hits all peers alike; each cell is the median (min-max) of the reps.

The benchmark owns one Redis database, ``BENCH_REDIS_URL`` (default db 9), and FLUSHDBs
it between steps; db 0 is refused (test suites use it on the same server).
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS_DIR = HERE / "peers"
VENVS = HERE / ".venvs"
RUN_DIR = Path(os.environ.get("BENCH_RUN_DIR", "/tmp/haze-bench-redis"))
RECORDS = RUN_DIR / "records.bin"
os.environ["BENCH_RECORDS"] = str(RECORDS)
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
# This file is named redis.py: its own folder on sys.path would shadow redis-py.
sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != HERE]
sys.path.insert(0, str(PEERS_DIR))
import records  # noqa: E402
import redis_common  # noqa: E402  (refuses db 0 on import)

REDIS_URL = redis_common.REDIS_URL


@dataclass
class Peer:
    name: str
    venv: str  # a bench/.venvs name
    script: str
    worker: list[str]  # argv after the venv's bin/ (first item: a console script or "python")
    shape: str
    bulk: bool = False
    variant: bool = False  # reuses its library's producer; only the worker differs
    n_max: int | None = None  # slow drains: fewer jobs, said in the table
    haze: bool = False
    ceiling: bool = False
    loop: str = "asyncio"  # haze's: queue:work --loop, and the producer's (BENCH_LOOP)

    def python(self) -> str:
        if self.haze and self.venv != "haze":
            return str(VENVS / self.venv / "bin" / "python")  # haze-base: made by hand
        if self.haze:
            # bench/.venvs/haze: this tree's runtime (editable) + the redis extra + hiredis,
            # which `uv sync` cannot strip the way it strips undeclared packages from .venv
            own = VENVS / "haze" / "bin" / "python"
            return str(own) if own.exists() else sys.executable
        return str(VENVS / self.venv / "bin" / "python")

    def worker_argv(self) -> list[str]:
        if self.worker[0] == "haze":
            conc = self.worker[1:]
            return [
                self.python(),
                "-m",
                "haze.cli",
                "--root",
                str(PEERS_DIR / "redis_app"),
                "queue:work",
                "--connection",
                "redis",
                "--queue",
                "bench",
                "--loop",
                self.loop,
                *(["--concurrency", *conc] if conc else []),
            ]
        head = self.worker[0]
        exe = self.python() if head == "python" else str(Path(self.python()).parent / head)
        return [exe, *self.worker[1:]]


PEERS: dict[str, Peer] = {
    p.name: p
    for p in [
        Peer("raw", "rawredis", "redis_raw.py", ["python", "redis_raw.py", "worker"],
             "1x1 BRPOP loop", bulk=True, ceiling=True),
        Peer("haze", "haze", "redis_haze.py", ["haze"],
             "1x1 asyncio (queue:work, driver default concurrency 1)", bulk=True, haze=True),
        Peer("haze-c10", "haze", "redis_haze.py", ["haze", "10"],
             "1x10 asyncio (queue:work --concurrency 10)", variant=True, haze=True),
        # another commit's runtime beside this tree's, for a change's before/after in one
        # run: bench/.venvs/haze-base made by hand (see bench/README.md)
        Peer("haze-base", "haze-base", "redis_haze.py", ["haze"],
             "1x1 asyncio, the base commit's runtime (bench/.venvs/haze-base)", bulk=True,
             haze=True),
        Peer("haze-base-c10", "haze-base", "redis_haze.py", ["haze", "10"],
             "1x10 asyncio, the base commit's runtime", variant=True, haze=True),
        Peer("haze-uvloop", "haze", "redis_haze.py", ["haze"],
             "1x1 uvloop (queue:work --loop uvloop, producer on uvloop)", bulk=True, haze=True,
             loop="uvloop"),
        Peer("bullmq", "bullmq", "redis_bullmq.py", ["python", "redis_bullmq.py", "worker"],
             "1x1 asyncio (Worker default concurrency 1)", bulk=True),
        Peer("bullmq-c10", "bullmq", "redis_bullmq.py",
             ["python", "redis_bullmq.py", "worker", "10"], "1x10 asyncio (concurrency 10)",
             variant=True),
        Peer("huey", "huey", "redis_huey.py", ["huey_consumer", "redis_huey.huey"],
             "1x1 thread (default: -w 1, thread)"),
        Peer("dramatiq", "dramatiq", "redis_dramatiq.py", ["dramatiq", "-p", "1", "redis_dramatiq"],
             "1 process x 8 threads (default threads, -p 1)"),
        Peer("saq", "saq", "redis_saq.py", ["saq", "redis_saq.settings"],
             "1x10 asyncio (default concurrency 10)"),
        Peer("celery", "celery", "redis_celery.py",
             ["celery", "-A", "redis_celery", "worker", "-l", "WARNING"],
             "1 main + 2 prefork children (default: one per CPU)", bulk=True),
        Peer("rq", "rq", "redis_rq.py", ["rq", "worker", "-q", "-u", REDIS_URL, "bench"],
             "1x1, fork per job (default Worker)", bulk=True, n_max=2000),
        Peer("rq-simple", "rq", "redis_rq.py",
             ["rq", "worker", "-q", "-w", "rq.worker.SimpleWorker", "-u", REDIS_URL, "bench"],
             "1x1 SimpleWorker (no fork)", variant=True),
        Peer("arq", "arq", "redis_arq.py", ["arq", "redis_arq.WorkerSettings"],
             "1x10 asyncio (defaults: max_jobs 10, poll_delay 0.5 s)", n_max=2000),
    ]
}  # fmt: skip
DEFAULT = "raw,haze,haze-c10,haze-uvloop,bullmq,bullmq-c10,huey,dramatiq,saq,celery,rq,arq"


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def _env(peer: Peer) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(PEERS_DIR), PYTHONUNBUFFERED="1")
    env["BENCH_LOOP"] = peer.loop
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


def call(peer: Peer, *args: object, timeout: float = 600) -> dict[str, Any]:
    out = subprocess.run(
        [peer.python(), peer.script, *map(str, args)],
        cwd=PEERS_DIR,
        env=_env(peer),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    if out.returncode == 0:
        return {}
    raise RuntimeError(
        f"{peer.script} {' '.join(map(str, args))} exited {out.returncode}:\n"
        f"{out.stdout[-1500:]}\n{out.stderr[-2500:]}"
    )


class Worker:
    def __init__(self, peer: Peer) -> None:
        self.log = open(RUN_DIR / f"worker-{peer.name}.log", "ab")  # noqa: SIM115
        self.launched = time.time()
        self.proc = subprocess.Popen(
            peer.worker_argv(),
            cwd=PEERS_DIR,
            env=_env(peer),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals only ours
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # children of the group (celery's prefork pool, rq's work-horse)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()


def wait_records(n: int, worker: Worker | None, timeout: float, stall: float = 60) -> bool:
    """Poll the record file until ``n`` jobs ran; give up on a deadline, a stall or a
    dead worker."""
    deadline = time.monotonic() + timeout
    last, changed = -1, time.monotonic()
    while time.monotonic() < deadline:
        c = records.count()
        if c >= n:
            return True
        now = time.monotonic()
        if c != last:
            last, changed = c, now
        elif now - changed > stall:
            return False
        if worker is not None and not worker.alive():
            return False
        time.sleep(0.02)
    return False


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    f = int(k)
    c = min(f + 1, len(xs) - 1)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


@dataclass
class Result:
    name: str
    shape: str
    version: str = ""
    n: int = 0
    enqueue: list[float] = field(default_factory=list)
    bulk: list[float] = field(default_factory=list)
    drain: list[float] = field(default_factory=list)
    drain_wall: list[float] = field(default_factory=list)
    lat_p50: list[float] = field(default_factory=list)
    lat_p99: list[float] = field(default_factory=list)
    lat_max: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def throughput(peer: Peer, res: Result, n: int, rep: int) -> None:
    call(peer, "clean")
    records.reset()
    r = call(peer, "enqueue", n)
    if not peer.variant:
        res.enqueue.append(r["rate"])
    w = Worker(peer)
    ok = wait_records(n, w, timeout=max(120.0, n / 20))
    done = time.time()
    w.stop()
    starts = sorted(s for _, s in records.read())
    if len(starts) > 1 and starts[-1] > starts[0]:
        res.drain.append((len(starts) - 1) / (starts[-1] - starts[0]))
        res.drain_wall.append(len(starts) / (done - w.launched))
    if not ok:
        res.notes.append(f"rep {rep}: drain incomplete, {len(starts)}/{n} jobs ran")
    if peer.bulk and not peer.variant:
        call(peer, "clean")
        res.bulk.append(call(peer, "bulk", n)["rate"])
    res.load.append(os.getloadavg()[0])
    log(
        f"  {peer.name} rep {rep}: enqueue={_num(r.get('rate')) if not peer.variant else '-'} "
        f"bulk={_num(res.bulk[-1]) if peer.bulk and not peer.variant else '-'} "
        f"drain={_num(res.drain[-1]) if res.drain else '-'} ({len(starts)}/{n}) "
        f"load={res.load[-1]:.1f}"
    )


def latency(peer: Peer, res: Result, lat_n: int, rate: float, reps: int) -> None:
    call(peer, "clean")
    records.reset()
    w = Worker(peer)
    try:
        call(peer, "latency", 20, 50)
        if not wait_records(20, w, timeout=90, stall=60):
            res.notes.append("latency: the worker did not run the 20 warm-up jobs")
            return
        for rep in range(reps):
            time.sleep(1.0)
            records.reset()
            call(peer, "latency", lat_n, rate)
            ok = wait_records(lat_n, w, timeout=120, stall=30)
            lats = [(s - e) * 1000 for e, s in records.read()]
            if not ok:
                res.notes.append(f"latency rep {rep}: {len(lats)}/{lat_n} jobs ran")
            if lats:
                res.lat_p50.append(pct(lats, 0.5))
                res.lat_p99.append(pct(lats, 0.99))
                res.lat_max.append(max(lats))
                log(
                    f"  {peer.name} latency rep {rep}: p50={res.lat_p50[-1]:.2f} ms "
                    f"p99={res.lat_p99[-1]:.2f} ms max={res.lat_max[-1]:.1f} ms"
                )
    finally:
        w.stop()
        call(peer, "clean")


# ----------------------------------------------------------------------------- the table


def _num(v: float | None, digits: int = 0) -> str:
    return "n/a" if v is None else f"{v:,.{digits}f}"


def _cell(xs: list[float], digits: int = 0) -> str:
    if not xs:
        return "n/a"
    s = _num(statistics.median(xs), digits)
    if len(xs) > 1:
        s += f" ({_num(min(xs), digits)}-{_num(max(xs), digits)})"
    return s


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def best_peer(results: list[Result], metric: str) -> tuple[str, float] | None:
    """The best non-haze, non-ceiling entry on a metric (highest rate)."""
    best: tuple[str, float] | None = None
    for r in results:
        peer = PEERS.get(r.name)
        if peer is None or peer.haze or peer.ceiling:
            continue
        v = _med(getattr(r, metric))
        if v is not None and (best is None or v > best[1]):
            best = (r.name, v)
    return best


def table(results: list[Result], meta: dict[str, Any]) -> str:
    order = {name: i for i, name in enumerate(PEERS)}
    results = sorted(results, key=lambda r: order.get(r.name, 99))
    best = {m: best_peer(results, m) for m in ("enqueue", "bulk", "drain")}

    def ratio(r: Result, metric: str) -> str:
        v, b = _med(getattr(r, metric)), best[metric]
        return "" if v is None or b is None else f" · {v / b[1]:.2f}×"

    lines = [
        "| peer | procs × conc (default unless said) | enqueue/s | bulk/s | drain/s "
        "| latency p50 / p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        peer = PEERS.get(r.name)
        name = f"**{r.name}**" if peer is not None and peer.haze else r.name
        shape = r.shape + (f"; N={r.n:,}" if r.n != meta["n"] else "")
        enq = "(same producer)" if peer is not None and peer.variant else _cell(r.enqueue)
        bulk = _cell(r.bulk) if r.bulk else ("-" if peer is not None and peer.variant else "no API")
        lines.append(
            f"| {name} | {shape} | {enq}{ratio(r, 'enqueue') if r.enqueue else ''} "
            f"| {bulk}{ratio(r, 'bulk') if r.bulk else ''} | {_cell(r.drain)}{ratio(r, 'drain')} "
            f"| {_cell(r.lat_p50, 2)} / {_cell(r.lat_p99, 2)} |"
        )
    out = ["\n".join(lines), ""]
    named = ", ".join(f"{m} {b[0]} ({_num(b[1])}/s)" for m, b in best.items() if b is not None)
    out.append(
        f"Cells: median (min-max) of {meta['reps']} reps; `· x×` = ratio to the best peer "
        f"(haze and the raw ceiling excluded): {named}. N={meta['n']:,} jobs, latency "
        f"{meta['lat_n']:,} jobs at {meta['rate']:g}/s after a 20-job warm-up. Redis "
        f"{meta.get('server', '?')} at {meta['redis_url']}; {meta['cpus']} CPUs, 1-min load "
        f"{meta['load_start']:.1f} at the start, {meta['load_end']:.1f} at the end "
        f"(median {meta.get('load_median', 0):.1f} over the throughput steps)."
    )
    out.append("")
    for r in results:
        out.append(
            f"- {r.name}: {r.version}" + (f" — NOTE: {'; '.join(r.notes)}" if r.notes else "")
        )
    haze = next((r for r in results if r.name == "haze"), None)
    if haze is not None:
        out.append("")
        out.append(targets(results, haze))
    return "\n".join(out)


def targets(results: list[Result], haze: Result) -> str:
    """The issue's targets for the haze rows (drain: the better of haze and haze-c10)."""
    best = {m: best_peer(results, m) for m in ("enqueue", "drain")}
    drains = [(r.name, _med(r.drain)) for r in results if r.name in ("haze", "haze-c10")]
    drains = [(n, v) for n, v in drains if v is not None]
    checks = []
    if drains and best["drain"] is not None:
        name, v = max(drains, key=lambda x: x[1])
        checks.append(
            f"drain ≥ 1.2× best peer: {name} {v / best['drain'][1]:.2f}× "
            f"{'met' if v >= 1.2 * best['drain'][1] else 'MISSED'}"
        )
    enq = _med(haze.enqueue)
    if enq is not None and best["enqueue"] is not None:
        checks.append(
            f"enqueue ≥ best peer: {enq / best['enqueue'][1]:.2f}× "
            f"{'met' if enq >= best['enqueue'][1] else 'MISSED'}"
        )
    bulk = _med(haze.bulk)
    if bulk is not None:
        checks.append(f"bulk ≥ 20,000/s: {_num(bulk)} {'met' if bulk >= 20000 else 'MISSED'}")
    p50, p99 = _med(haze.lat_p50), _med(haze.lat_p99)
    if p50 is not None and p99 is not None:
        checks.append(
            f"p50 ≤ 1 ms: {p50:.2f} {'met' if p50 <= 1 else 'MISSED'}; "
            f"p99 ≤ 3 ms: {p99:.2f} {'met' if p99 <= 3 else 'MISSED'}"
        )
    checks.extend(_relative_targets(results, haze, best["drain"]))
    return "Targets (haze): " + "; ".join(checks) + "."


def _relative_targets(
    results: list[Result], haze: Result, best_drain: tuple[str, float] | None
) -> list[str]:
    """Drain at the driver's default concurrency ≥ 1.5× the best peer, and p50 latency
    ≤ 1.5× the raw loop's, each against the same run."""
    checks = []
    drain = _med(haze.drain)
    if drain is not None and best_drain is not None:
        x = drain / best_drain[1]
        checks.append(
            f"drain at the default concurrency ≥ 1.5× best peer: {x:.2f}× "
            f"{'met' if x >= 1.5 else 'MISSED'}"
        )
    raw = next((r for r in results if r.name == "raw"), None)
    p50, raw_p50 = _med(haze.lat_p50), _med(raw.lat_p50) if raw is not None else None
    if p50 is not None and raw_p50:
        x = p50 / raw_p50
        checks.append(f"p50 ≤ 1.5× raw: {x:.2f}× {'met' if x <= 1.5 else 'MISSED'}")
    return checks


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--peers", default=DEFAULT, help=f"comma-separated; known: {', '.join(PEERS)}")
    ap.add_argument("--n", type=int, default=10_000, help="jobs per throughput step (10,000)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (3)")
    ap.add_argument("--lat-n", type=int, default=1000, help="jobs per latency rep (1,000)")
    ap.add_argument("--rate", type=float, default=200.0, help="latency dispatch rate (200/s)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--json", metavar="OUT", help="also write the raw numbers as JSON")
    ap.add_argument("--table", metavar="JSON", help="print the table of a saved run and exit")
    a = ap.parse_args(argv)
    if a.table:
        saved = json.loads(Path(a.table).read_text())
        print(table([Result(**r) for r in saved["results"]], saved["meta"]))
        return 0
    names = [x.strip() for x in a.peers.split(",") if x.strip()]
    unknown = [x for x in names if x not in PEERS]
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    peers: list[Peer] = []
    for name in names:
        p = PEERS[name]
        if not Path(p.python()).exists():
            log(f"{name}: no venv at {p.python()}: run bench/setup_peers.sh; skipped")
            continue
        peers.append(p)
    meta: dict[str, Any] = {
        "n": a.n,
        "reps": a.reps,
        "lat_n": a.lat_n,
        "rate": a.rate,
        "redis_url": REDIS_URL,
        "cpus": os.cpu_count(),
        "load_start": os.getloadavg()[0],
        "started": time.strftime("%Y-%m-%d %H:%M"),
    }
    log(f"peers {', '.join(p.name for p in peers)}; load {os.getloadavg()}")
    results: dict[str, Result] = {}
    for p in peers:
        res = results[p.name] = Result(p.name, p.shape, n=min(a.n, p.n_max or a.n))
        try:
            res.version = call(p, "info").get("version", "?")
            meta.setdefault("server", _server_version())
        except Exception as e:
            res.notes.append(f"info failed: {e}")
    failed: set[str] = set()
    for rep in range(a.reps):
        log(f"throughput round {rep + 1}/{a.reps}")
        for p in peers:
            if p.name in failed:
                continue
            try:
                throughput(p, results[p.name], results[p.name].n, rep)
            except Exception as e:
                failed.add(p.name)
                results[p.name].notes.append(f"throughput failed: {str(e)[:300]}")
                log(f"  {p.name} failed: {e}")
    if not a.skip_latency:
        log("latency")
        for p in peers:
            if p.name in failed:
                continue
            try:
                latency(p, results[p.name], a.lat_n, a.rate, a.reps)
            except Exception as e:
                results[p.name].notes.append(f"latency failed: {str(e)[:300]}")
                log(f"  {p.name} latency failed: {e}")
    meta["load_end"] = os.getloadavg()[0]
    loads = [x for r in results.values() for x in r.load]
    meta["load_median"] = statistics.median(loads) if loads else meta["load_end"]
    rows = list(results.values())
    print(table(rows, meta))
    if a.json:
        Path(a.json).write_text(
            json.dumps({"meta": meta, "results": [r.__dict__ for r in rows]}, indent=1)
        )
    return 0


def _server_version() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
