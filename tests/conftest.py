"""Shared by every test directory below: this folder is on ``sys.path`` (pytest puts a
rootdir-level conftest's folder there), so ``import worker_procs`` works everywhere."""
