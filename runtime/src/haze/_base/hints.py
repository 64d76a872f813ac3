"""Hints in messages: ``did you mean …?`` for a mistyped name, and the command that
installs a part of haze (``pip install 'haze-jobs[redis]'``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["DISTRIBUTION", "DISTRIBUTIONS", "did_you_mean", "install_hint"]

#: Import package -> (its distribution, its project directory in a haze checkout). The
#: distributions are not named after the packages: ``haze`` on PyPI is another project.
DISTRIBUTIONS = {
    "haze": ("haze-jobs", "runtime"),
    "haze_cloudflare": ("haze-cloudflare", "adapters/cloudflare"),
    "haze_lambda": ("haze-lambda", "adapters/lambda"),
    "haze_infra": ("haze-infra", "infra"),
}

#: The distribution of the runtime (import ``haze``).
DISTRIBUTION = DISTRIBUTIONS["haze"][0]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'tries'?)"`` for the closest choice, or ``""`` when none is close.

    >>> did_you_mean("retries", ["tries", "backoff"])
    " (did you mean 'tries'?)"
    """
    # difflib and pathlib load here, on an error's path: every import of haze loads
    # this module, and a Worker's or a Lambda's cold start would pay for them.
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _checkout() -> Path | None:
    """The haze checkout this haze runs from (its ``runtime/`` is this package's
    project), or None for an installed haze."""
    from pathlib import Path

    # runtime/src/haze/_base/hints.py -> the checkout holding runtime/ and adapters/
    here = Path(__file__).resolve()
    if len(here.parents) < 5:
        return None
    runtime = here.parents[3]
    if runtime.name == "runtime" and (runtime / "pyproject.toml").is_file():
        return runtime.parent
    return None


def install_hint(extras: str = "", *, package: str = "haze") -> str:
    """The command that installs ``package`` (an import name) with ``extras`` where
    this haze runs: the distribution, or the checkout's project when haze runs from
    a checkout of its repository.

    >>> install_hint("redis")  # an installed haze
    "pip install 'haze-jobs[redis]'"
    >>> install_hint("dashboard")  # from a checkout, in its folder
    "pip install './runtime[dashboard]'"
    """
    dist, member = DISTRIBUTIONS.get(package, (package.replace("_", "-"), ""))
    suffix = f"[{extras}]" if extras else ""
    checkout = _checkout()
    if checkout is None or not member or not (checkout / member / "pyproject.toml").is_file():
        target = f"{dist}{suffix}"
        return f"pip install '{target}'" if suffix else f"pip install {target}"
    where = f"./{member}" if checkout.cwd().resolve() == checkout else str(checkout / member)
    hint = f"pip install '{where}{suffix}'" if suffix else f"pip install {where}"
    return hint if package == "haze" else f"{hint} (or `uv sync` in {checkout})"
