"""Single enqueue on Redis, haze against Huey, call by call (bench/README.md, "Profiles").

    bench/setup_peers.sh      # bench/.venvs/haze and bench/.venvs/huey
    .venv/bin/python bench/profile_enqueue.py                  # 5,000 calls, 5 rounds
    .venv/bin/python bench/profile_enqueue.py --n 2000 --reps 2 --cprofile

``--pg`` profiles PostgreSQL instead (``BENCH_PG_DSN``): haze's dispatch, its lean
execute alone, and one ``INSERT … pg_notify`` statement on psycopg's async and sync
connections; ``--base-src DIR`` adds ``haze-asyncio-base`` / ``haze-pg-base`` sides that
import haze from another tree's ``runtime/src`` (a ``git archive`` of the commit before).

Each round runs every side once, in fresh processes, one after the other (so a burst
of load hits them alike): haze's ``await job.dispatch()`` on asyncio and on uvloop (when
installed in bench/.venvs/haze), Huey's ``task()``, and two floors with no queue library
at all: a blocking-socket ``PING`` and an asyncio-protocol ``PING`` (on each loop).
Every call is timed with ``perf_counter_ns``; the table gives the median (and p90/p99)
per-call latency, CPU per call, the share of calls slower than twice the median, the
garbage collections inside the window, and the Redis server's own time per command
(``INFO commandstats``, the difference over each side's window).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
VENVS = HERE / ".venvs"
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/9")
os.environ.setdefault("BENCH_RECORDS", "/tmp/haze-bench-profile-records.bin")
sys.path[:] = [x for x in sys.path if Path(x or ".").resolve() != HERE]  # bench/redis.py


def _py(venv: str | None) -> str:
    """The venv's python; the workspace's for None (PostgreSQL: psycopg is there)."""
    own = VENVS / venv / "bin" / "python" if venv else None
    return str(own) if own is not None and own.exists() else sys.executable


SIDES: dict[str, tuple[str | None, list[str]]] = {
    "haze-asyncio": ("haze", ["haze", "asyncio"]),
    "haze-asyncio-base": ("haze", ["haze", "asyncio"]),
    "haze-uvloop": ("haze", ["haze", "uvloop"]),
    "huey": ("huey", ["huey", "-"]),
    "ping-sync": ("huey", ["ping-sync", "-"]),
    "ping-asyncio": ("haze", ["ping-async", "asyncio"]),
    "ping-uvloop": ("haze", ["ping-async", "uvloop"]),
    # PostgreSQL (--pg): haze's dispatch, its lean execute alone, psycopg async and sync
    "haze-pg": (None, ["haze-pg", "asyncio"]),
    "haze-pg-base": (None, ["haze-pg", "asyncio"]),
    "pg-lean": (None, ["pg-lean", "asyncio"]),
    "pg-async": (None, ["pg-async", "asyncio"]),
    "pg-sync": (None, ["pg-sync", "-"]),
}
REDIS_SIDES = "haze-asyncio,haze-uvloop,huey,ping-sync,ping-asyncio,ping-uvloop"
PG_SIDES = "haze-pg,pg-lean,pg-async,pg-sync"
#: ``--base-src``: the runtime/src the ``*-base`` sides import haze from
BASE_SRC = ""


def _has(venv: str, module: str) -> bool:
    return (
        subprocess.run([_py(venv), "-c", f"import {module}"], capture_output=True).returncode == 0
    )


def _cmdstats() -> dict[str, tuple[int, int]]:
    import redis

    c = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    try:
        stats = c.info("commandstats")
    finally:
        c.close()
    return {k: (v["calls"], v["usec"]) for k, v in stats.items()}


def _server_us(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> str:
    """The commands of the window that ran most, with Redis's µs per call for each."""
    diff = []
    for k, (calls, usec) in after.items():
        c0, u0 = before.get(k, (0, 0))
        if calls - c0 >= 100:
            diff.append((calls - c0, k.removeprefix("cmdstat_"), (usec - u0) / (calls - c0)))
    diff.sort(reverse=True)
    return ", ".join(f"{name} {us:.1f}" for _, name, us in diff[:3])


def run_side(name: str, n: int, cprofile: bool) -> dict[str, Any]:
    venv, args = SIDES[name]
    who, loop = args
    argv = [_py(venv), str(PEERS / "enqueue_profile.py"), who, str(n), loop]
    if cprofile and who in ("haze", "huey", "haze-pg"):
        argv.append("cprofile")
    path = f"{BASE_SRC}{os.pathsep}{PEERS}" if name.endswith("-base") else str(PEERS)
    env = dict(os.environ, PYTHONPATH=path)
    before = _cmdstats()
    out = subprocess.run(argv, env=env, cwd=PEERS, capture_output=True, text=True, timeout=600)
    after = _cmdstats()
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            res: dict[str, Any] = json.loads(line[7:])
            res["server"] = _server_us(before, after)
            return res
    raise RuntimeError(f"{name} exited {out.returncode}: {out.stderr[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="timed calls per side and round")
    ap.add_argument("--reps", type=int, default=5, help="rounds (5)")
    ap.add_argument("--sides", default=REDIS_SIDES)
    ap.add_argument("--pg", action="store_true", help=f"PostgreSQL sides: {PG_SIDES}")
    ap.add_argument("--base-src", default="", help="runtime/src of the *-base sides")
    ap.add_argument("--cprofile", action="store_true", help="also print cProfile top lists")
    a = ap.parse_args()
    global BASE_SRC
    BASE_SRC = a.base_src
    sides = [s for s in (PG_SIDES if a.pg and a.sides == REDIS_SIDES else a.sides).split(",") if s]
    if not BASE_SRC:
        sides = [s for s in sides if not s.endswith("-base")]
    if not _has("haze", "uvloop"):
        sides = [s for s in sides if "uvloop" not in s]
        print(
            "uvloop not in bench/.venvs/haze (bench/setup_peers.sh adds haze[uvloop]): "
            "its sides are left out",
            file=sys.stderr,
        )
    res: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
    for rep in range(a.reps):
        for s in sides:
            r = run_side(s, a.n, False)
            res[s].append(r)
            print(
                f"{time.strftime('%H:%M:%S')} rep {rep} {s}: {r['rate']:,.0f}/s p50 "
                f"{r['p50']:.1f} us cpu {r['cpu_us']:.1f} us slow {r['slow_share']:.1%} "
                f"gc {r['gc_collections']} load {r['load']:.1f}",
                file=sys.stderr,
                flush=True,
            )

    def med(s: str, k: str) -> float:
        return statistics.median(r[k] for r in res[s])

    def span(s: str, k: str, fmt: str = ",.0f") -> str:
        xs = [r[k] for r in res[s]]
        return f"{statistics.median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    print(
        "| side | calls/s | per call p50 / p90 / p99 µs | CPU µs/call | calls > 2× p50 "
        "| GCs in window | Redis µs/command (most frequent) |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in sides:
        print(
            f"| {s} | {span(s, 'rate')} | {med(s, 'p50'):.0f} / {med(s, 'p90'):.0f} / "
            f"{med(s, 'p99'):.0f} | {span(s, 'cpu_us', '.1f')} | {med(s, 'slow_share'):.1%} "
            f"| {med(s, 'gc_collections'):.0f} | {res[s][-1]['server']} |"
        )
    for a_side, b_side in (
        ("haze-asyncio", "haze-asyncio-base"),
        ("haze-pg", "haze-pg-base"),
        ("haze-pg", "pg-sync"),
    ):
        if a_side in res and b_side in res:
            ratios = [x["rate"] / y["rate"] for x, y in zip(res[a_side], res[b_side], strict=True)]
            print(
                f"{a_side}/{b_side} per round: {', '.join(f'{x:.2f}' for x in ratios)} "
                f"(median {statistics.median(ratios):.2f}×)"
            )
    if "huey" in res and "haze-asyncio" in res:
        ratios = [
            h["rate"] / y["rate"] for h, y in zip(res["haze-asyncio"], res["huey"], strict=True)
        ]
        print(
            f"\nhaze/Huey per round: {', '.join(f'{x:.2f}' for x in ratios)} "
            f"(median {statistics.median(ratios):.2f}×)"
        )
    if "haze-uvloop" in res and "huey" in res:
        ratios = [
            h["rate"] / y["rate"] for h, y in zip(res["haze-uvloop"], res["huey"], strict=True)
        ]
        print(f"haze on uvloop/Huey per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    loads = [r["load"] for rs in res.values() for r in rs]
    print(
        f"\nN={a.n:,} calls per side and round after 500 untimed, {a.reps} rounds; "
        f"{os.cpu_count()} CPUs, 1-min load {min(loads):.1f}-{max(loads):.1f}."
    )
    # profiled in a round of its own: the profiler's overhead stays out of the table
    for s in sides if a.cprofile else []:
        if s in ("haze-asyncio", "haze-uvloop", "huey", "haze-pg"):
            prof = run_side(s, a.n, True)["profile"]
            print(f"\n#### cProfile, {s} (an extra round, by own time)\n\n```\n{prof}```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
