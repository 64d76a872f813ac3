"""Run the haze benchmarks and print a table (see bench/README.md).

python bench/run.py [--only NAME[,NAME]] [--n N] [--reps R] [--json OUT] [--list]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness

#: Modules that register entries on import. A peer whose library is missing should
#: register anyway and say so through ``skip_reason``, so the table shows the gap.
ENTRY_MODULES = ["memory_driver", "otel", "scale", "lambda_durable"]
#: Entries that start worker processes against a server and take minutes at N=100,000:
#: run only when named (``--only scale-redis-p8`` adds its 1-process baseline).
OPT_IN_GROUPS = ("scale-redis", "scale-postgres")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="entry name(s), comma-separated or repeated; baselines are added",
    )
    parser.add_argument("--n", type=int, default=100_000, help="jobs per measurement (100,000)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each entry (3)")
    parser.add_argument(
        "--warmup", type=int, default=2000, help="jobs in the untimed warm-up (2,000)"
    )
    parser.add_argument("--json", metavar="OUT", help="also write the raw numbers as JSON")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    args = parser.parse_args(argv)

    for mod in ENTRY_MODULES:
        importlib.import_module(mod)
    entries = harness.registry()
    if args.list:
        for e in entries.values():
            base = f" (vs {e.baseline})" if e.baseline else ""
            opt = " (opt-in)" if e.group in OPT_IN_GROUPS else ""
            print(f"{e.name:<22} [{e.group}]{opt}{base} {e.description}")
        return 0
    names = [x.strip() for opt in args.only for x in opt.split(",") if x.strip()] or [
        e.name for e in entries.values() if e.group not in OPT_IN_GROUPS
    ]
    if args.n < 1 or args.reps < 1:
        parser.error("--n and --reps must be at least 1")

    results = harness.run(names, args.n, args.reps, warmup=args.warmup)
    print(harness.table(results, args.n))
    if args.json:
        harness.write_json(args.json, results, args.n)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
