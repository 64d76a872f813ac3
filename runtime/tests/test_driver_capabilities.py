"""Drivers declare their optional capabilities (``haze.contracts.driver``) by subclassing
the Protocols, so mypy checks each method's signature against the contract. A declared
method the driver does not define (a misspelt name) would fall back to the Protocol's
empty stub and silently do nothing: this test fails on it instead."""

from __future__ import annotations

import importlib
import inspect
from typing import Protocol

import pytest

DRIVERS = [
    ("haze.drivers.memory", "MemoryDriver"),
    ("haze.drivers.sql", "DatabaseDriver"),
    ("haze.drivers.redis", "RedisDriver"),
    ("haze.drivers.sqs", "SqsDriver"),
    ("haze.drivers.cloudflare", "CloudflareDriver"),
    ("haze.drivers.failover", "FailoverDriver"),
]


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False)) or cls is Protocol


@pytest.mark.parametrize(("module", "name"), DRIVERS)
def test_every_declared_capability_method_is_implemented(module: str, name: str) -> None:
    driver = getattr(importlib.import_module(module), name)
    declared = [c for c in driver.__mro__[1:] if _is_protocol(c) and c is not Protocol]
    assert declared, f"{name} declares no capability"
    own = [c for c in driver.__mro__ if not _is_protocol(c) and c is not object]
    for capability in declared:
        for member, value in vars(capability).items():
            if member.startswith("_") or not inspect.isfunction(value):
                continue
            assert any(member in vars(c) for c in own), (
                f"{name} declares {capability.__name__} but does not define {member}()"
            )
