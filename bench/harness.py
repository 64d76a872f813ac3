"""The bench harness: a registry of entries, interleaved repetitions, a table.

An entry is a plain function ``fn(n) -> Measurement``. It owns everything about how
it runs (its own event loop, a subprocess, a server it talks to), so in-process
entries and out-of-process peers (haze-redis vs bullmq, huey, ...) plug in the same way:

    @entry("haze-memory", baseline="bare-asyncio", group="memory")
    def haze_memory(n: int) -> Measurement: ...

The harness times nothing itself; entries time exactly the window they claim to.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Entry", "Measurement", "Result", "entry", "registry", "run", "table", "timer"]


@dataclass
class Measurement:
    """One repetition of one entry: ``n`` jobs in ``wall`` seconds (``cpu``: this process)."""

    n: int
    wall: float
    cpu: float
    #: Optional sub-windows (seconds) that add up to about ``wall``, e.g. dispatch / drain.
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def us_per_job(self) -> float:
        return self.wall / self.n * 1e6

    @property
    def cpu_us_per_job(self) -> float:
        return self.cpu / self.n * 1e6


@dataclass
class Entry:
    name: str
    fn: Callable[[int], Measurement]
    #: The entry this one is reported against (its ratio column), measured in the same run.
    baseline: str | None = None
    group: str = "default"
    description: str = ""
    #: Targets from the issue tracker: {"ratio": 10.0, "us": 40.0}; shown as pass/fail.
    targets: dict[str, float] = field(default_factory=dict)
    #: Set when an entry cannot run here (missing peer library, no server); shown, not fatal.
    skip_reason: Callable[[], str | None] | None = None


_registry: dict[str, Entry] = {}


def entry(
    name: str,
    *,
    baseline: str | None = None,
    group: str = "default",
    description: str = "",
    targets: dict[str, float] | None = None,
    skip_reason: Callable[[], str | None] | None = None,
) -> Callable[[Callable[[int], Measurement]], Callable[[int], Measurement]]:
    def register(fn: Callable[[int], Measurement]) -> Callable[[int], Measurement]:
        if name in _registry:
            raise ValueError(f"bench entry {name!r} is registered twice")
        _registry[name] = Entry(
            name,
            fn,
            baseline,
            group,
            description or (fn.__doc__ or "").strip().split("\n")[0],
            dict(targets or {}),
            skip_reason,
        )
        return fn

    return register


def registry() -> dict[str, Entry]:
    return dict(_registry)


@contextmanager
def timer() -> Iterator[Callable[[], tuple[float, float]]]:
    """``with timer() as elapsed: ...; wall, cpu = elapsed()`` -- elapsed() may be read inside."""
    w0, c0 = time.perf_counter(), time.process_time()
    yield lambda: (time.perf_counter() - w0, time.process_time() - c0)


# ------------------------------------------------------------------------------- running


@dataclass
class Result:
    entry: Entry
    reps: list[Measurement] = field(default_factory=list)
    #: us/job over the baseline's us/job, one per repetition (paired: same round of the
    #: same run), from wall-clock and from this process's CPU time.
    ratios: list[float] = field(default_factory=list)
    cpu_ratios: list[float] = field(default_factory=list)
    skipped: str | None = None
    error: str | None = None


def _with_baselines(names: list[str], entries: dict[str, Entry]) -> list[str]:
    """The selection plus the baselines it needs, baselines first (so each round runs them
    just before the entries compared with them)."""
    out: list[str] = []

    def add(name: str) -> None:
        if name in out:
            return
        base = entries[name].baseline
        if base is not None:
            add(base)
        out.append(name)

    for name in names:
        add(name)
    return out


def run(
    names: list[str],
    n: int,
    reps: int,
    *,
    warmup: int = 2000,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> list[Result]:
    """Run the entries in rounds: round r runs every entry once, so a noisy minute on a
    shared machine hits the entry and its baseline alike, and ratios are taken per round."""
    entries = registry()
    unknown = [x for x in names if x not in entries]
    if unknown:
        raise SystemExit(f"unknown bench entries {unknown}; known: {', '.join(entries)}")
    order = _with_baselines(names, entries)
    results = {name: Result(entries[name]) for name in order}

    for name in order:
        res = results[name]
        reason = res.entry.skip_reason() if res.entry.skip_reason else None
        if reason:
            res.skipped = reason
            log(f"skip {name}: {reason}")
            continue
        if warmup:
            # First-call costs (imports, worker start, code objects) are not per-job costs.
            try:
                res.entry.fn(min(n, warmup))
            except Exception as e:
                res.error = f"{type(e).__name__}: {e}"
                log(f"error {name} (warm-up): {res.error}")

    for r in range(reps):
        for name in order:
            res = results[name]
            if res.skipped or res.error:
                continue
            gc.collect()
            try:
                m = res.entry.fn(n)
            except Exception as e:
                res.error = f"{type(e).__name__}: {e}"
                log(f"error {name}: {res.error}")
                continue
            res.reps.append(m)
            base = results.get(res.entry.baseline or "")
            if base is not None and len(base.reps) == len(res.reps):
                b = base.reps[-1]
                res.ratios.append(m.us_per_job / b.us_per_job)
                res.cpu_ratios.append(m.cpu_us_per_job / b.cpu_us_per_job)
            log(f"rep {r + 1}/{reps} {name:<22} {m.us_per_job:8.2f} us/job")
    return [results[name] for name in order]


# ------------------------------------------------------------------------------- report


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{format(med, fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def _target(res: Result) -> str:
    """Judged on CPU time: on a shared machine wall-clock also counts other processes."""
    t = res.entry.targets
    if not t or not res.reps:
        return ""
    us = statistics.median(m.cpu_us_per_job for m in res.reps)
    parts = []
    if "ratio" in t and res.cpu_ratios:
        ratio = statistics.median(res.cpu_ratios)
        parts.append(f"{'ok' if ratio <= t['ratio'] else 'MISS'} <={t['ratio']:g}x")
    if "us" in t:
        parts.append(f"{'ok' if us < t['us'] else 'MISS'} <{t['us']:g}us")
    return ", ".join(parts)


def table(results: list[Result], n: int) -> str:
    """Markdown table: median (min-max) over repetitions."""
    rows = [
        [
            "entry",
            "us/job wall",
            "ratio wall",
            "us/job cpu",
            "ratio cpu",
            "phases (wall us/job, median)",
            "target (cpu)",
        ]
    ]
    for res in results:
        name = res.entry.name
        if res.skipped or res.error:
            rows.append([name, f"({res.skipped or res.error})", "", "", "", "", ""])
            continue
        ms = res.reps
        ratio = cpu_ratio = "1 (baseline)" if any(r.entry.baseline == name for r in results) else ""
        if res.ratios:
            ratio = _spread(res.ratios, ".1f") + "x"
            cpu_ratio = _spread(res.cpu_ratios, ".1f") + "x"
        phase_names = list(ms[0].phases) if ms else []
        phases = " + ".join(
            f"{p} {statistics.median(m.phases[p] / m.n * 1e6 for m in ms):.1f}" for p in phase_names
        )
        rows.append(
            [
                name,
                _spread([m.us_per_job for m in ms], ".2f"),
                ratio,
                _spread([m.cpu_us_per_job for m in ms], ".2f"),
                cpu_ratio,
                phases,
                _target(res),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    reps = max((len(r.reps) for r in results), default=0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines.append(
        f"\nN={n:,} jobs, {reps} rep(s); median (min-max); ratio = us/job over the "
        f"baseline's us/job in the same round. {os.cpu_count()} CPUs, 1-min load "
        f"{load:.1f} at the end (above ~1, wall-clock includes other processes' time)."
    )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
    except Exception:
        rev = ""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "git": rev,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def to_json(results: list[Result], n: int) -> dict[str, Any]:
    return {
        "machine": machine(),
        "n": n,
        "entries": {
            res.entry.name: {
                "group": res.entry.group,
                "baseline": res.entry.baseline,
                "skipped": res.skipped,
                "error": res.error,
                "reps": [
                    {"n": m.n, "wall": m.wall, "cpu": m.cpu, "phases": m.phases} for m in res.reps
                ],
                "us_per_job": [m.us_per_job for m in res.reps],
                "ratios": res.ratios,
                "cpu_ratios": res.cpu_ratios,
            }
            for res in results
        },
    }


def write_json(path: str, results: list[Result], n: int) -> None:
    with open(path, "w") as f:
        json.dump(to_json(results, n), f, indent=2)
        f.write("\n")
