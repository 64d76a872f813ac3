"""Run the Python blocks of one Markdown document, in order, the way a reader would.

``python tests/docs_blocks.py DOC.md WORKDIR`` (``tests/test_docs.py`` runs it, one
process per document):

- A block whose first line is a path comment (``# config/queue.py``,
  ``# app/job/send_invoice.py``, ``# haze.config.py``, ``# main.py``) is a file: it is
  written under WORKDIR. The files are loaded with ``App(root=WORKDIR)`` (a bad key or
  a job that cannot be imported fails the document) once the files written so far form
  a set: before the next code block, before a file is replaced by a later version, and
  at the end of the document.
- Any other block is run, in WORKDIR, in one namespace shared by the document's
  blocks (a later block may use a name an earlier one defined, as a reader would).
  A block with a top-level ``await`` runs on one event loop kept for the document.
- ``<!-- docs-test: skip REASON -->`` on the line before a block skips it; the reason
  is required (e.g. it needs a cloud account or a running server).

Prints one line per block (``ran``, ``wrote``, ``skipped``) for the test to check.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

SKIP = re.compile(r"^<!--\s*docs-test:\s*skip\s*(.*?)\s*-->$")
FILE = re.compile(r"^#\s*((?:config/\w+|app/job/[\w/]+|haze\.config|main)\.py)\s*$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    skip: str | None  # the reason, when marked


def blocks(text: str) -> list[Block]:
    """The ``python`` fenced blocks of a Markdown text, with their skip markers."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            previous = lines[start - 1].strip() if start else ""
            marker = SKIP.match(previous)
            out.append(
                Block(
                    start + 1, "\n".join(lines[start + 1 : j]) + "\n", marker[1] if marker else None
                )
            )
            i = j
        i += 1
    return out


def main(doc: Path, workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    sys.path.insert(0, str(workdir))
    namespace: dict[str, object] = {"__name__": "__docs__"}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    written: set[str] = set()

    def validate() -> None:
        if written - {"main.py"}:
            from haze import App

            App(root=workdir)  # validates the config files and imports the jobs
        written.clear()

    for block in blocks(doc.read_text(encoding="utf-8")):
        where = f"{doc.name}:{block.line}"
        if block.skip is not None:
            if not block.skip:
                raise SystemExit(f"{where}: a docs-test skip marker needs a reason")
            print(f"skipped {where}: {block.skip}", flush=True)
            continue
        first = block.code.splitlines()[0] if block.code.strip() else ""
        target = FILE.match(first)
        if target:
            if target[1] in written:
                validate()  # the version this block replaces
            path = workdir / target[1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code, encoding="utf-8")
            written.add(target[1])
            print(f"wrote {where}: {target[1]}", flush=True)
            continue
        validate()
        code = compile(block.code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        if code.co_flags & inspect.CO_COROUTINE:
            loop.run_until_complete(eval(code, namespace))
        else:
            exec(code, namespace)
        print(f"ran {where}", flush=True)
    validate()
    loop.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
