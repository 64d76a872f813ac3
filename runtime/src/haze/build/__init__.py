"""``haze build --preset NAME``: turn an app into a deployable entrypoint under ``dist/``.

Each preset is one module in this package with a ``build(ctx) -> BuildResult``
function; :data:`PRESETS` maps the preset name to its module. A preset writes only
under ``ctx.dest`` (``dist/<preset>/``) and, where the platform wants a file beside
it, under ``ctx.out`` (``dist/wrangler.json``, ``dist/aws-lambda.zip``).

The app is loaded (config validated, jobs discovered) before any file is written, so a
broken app fails the build instead of the deploy. A preset writes into a staging
directory inside the output directory; only a build that finishes is moved into place
(``dist/<preset>/`` swapped whole, files beside it replaced), so a build that fails
leaves the previous output as it was and writes nothing. Before that, every file the
preset generated is read back the way its tools will read it (TOML, JSON, Python): a
build that wrote one they would reject fails, naming it. The output directory may not
be the app's root or lie inside its sources (``config/``, ``app/``, ``database/``),
which the presets copy into the output.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from haze._app.app import App
from haze._base.errors import ConfigError
from haze._base.hints import install_hint

__all__ = ["PRESETS", "BuildContext", "BuildResult", "build", "deterministic_zip", "install_hint"]

#: Preset name -> module (under ``haze.build``) whose ``build(ctx)`` writes it.
PRESETS: dict[str, str] = {
    "cloudflare": "cloudflare",
    "aws-lambda": "aws_lambda",
    "docker": "docker",
    "server": "server",
    "vercel": "vercel",
}

#: Never copied into a bundle: build output, caches, virtualenvs, VCS data.
IGNORED = ("dist", "__pycache__", "*.pyc", ".venv", "venv", ".git", ".pytest_cache", "*.db")


@dataclass
class BuildResult:
    """What a preset wrote: its directory, the files, and notes for the user."""

    preset: str
    path: Path
    files: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class BuildContext:
    """Everything a preset needs: the loaded app, its root, and where to write."""

    app: App
    root: Path
    out: Path
    preset: str
    #: every file ``write`` made: checked before the build is published
    generated: list[Path] = field(default_factory=list)

    @property
    def dest(self) -> Path:
        """``<out>/<preset>/``: the preset's own directory."""
        return self.out / self.preset

    def write(self, relative: str, text: str, *, base: Path | None = None) -> Path:
        """Write ``text`` to ``<base or dest>/relative`` (parents created)."""
        path = (base or self.dest) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        self.generated.append(path)
        return path

    def copy_app(self, dest: Path) -> list[Path]:
        """Copy the app (``config/``, ``app/``, ``database/``, ``haze.config.py``) to ``dest``.

        Returns the files written. Build output, caches and SQLite files are skipped.
        """
        written: list[Path] = []
        ignore = shutil.ignore_patterns(*IGNORED)
        for name in ("config", "app", "database"):
            src = self.root / name
            if src.is_dir():
                shutil.copytree(src, dest / name, ignore=ignore, dirs_exist_ok=True)
                written.extend(p for p in (dest / name).rglob("*") if p.is_file())
        for name in ("haze.config.py",):
            src = self.root / name
            if src.is_file():
                dest.mkdir(parents=True, exist_ok=True)
                written.append(Path(shutil.copy2(src, dest / name)))
        return written

    def vendor(self, packages: Iterable[str], dest: Path) -> list[Path]:
        """Copy the installed pure-Python packages (e.g. ``haze``) into ``dest``.

        The copy is of the package as imported here, so the bundle runs the same
        runtime as the build.
        """
        written: list[Path] = []
        ignore = shutil.ignore_patterns(*IGNORED)
        for name in packages:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as e:
                if e.name != name:
                    raise
                raise ConfigError(
                    f"the {self.preset} preset bundles {name!r}, which is not installed here; "
                    f"{install_hint(package=name)} (in the environment that runs `haze build`)",
                    key="--preset",
                ) from None
            if module.__file__ is None:
                raise ConfigError(f"cannot vendor {name!r}: it is not a regular package")
            src = Path(module.__file__).parent
            shutil.copytree(src, dest / name, ignore=ignore, dirs_exist_ok=True)
            written.extend(p for p in (dest / name).rglob("*") if p.is_file())
        return written


def build(root: str | Path, preset: str, out: str | Path | None = None) -> BuildResult:
    """Build ``preset`` for the app at ``root`` into ``out`` (default ``<root>/dist``).

    Example::

        from haze.build import build
        result = build(".", "aws-lambda")
        print(result.path)  # ./dist/aws-lambda
    """
    if preset not in PRESETS:
        raise ConfigError(
            f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}", key="--preset"
        )
    root = Path(root).resolve()
    app = App(root=root)
    target = Path(out).resolve() if out is not None else root / "dist"
    _check_target(root, target)
    name = f"{__name__}.{PRESETS[preset]}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        raise ConfigError(
            f"the {preset!r} preset is not available in this haze installation "
            f"(no module {name}); upgrade haze",
            key="--preset",
        ) from None
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    for stale in target.glob(".haze-build-*"):  # left by a build that was killed
        shutil.rmtree(stale, ignore_errors=True)
    # Inside the output directory: the same file system, so moving into place is a rename.
    staging = Path(tempfile.mkdtemp(prefix=".haze-build-", dir=target))
    try:
        ctx = BuildContext(app=app, root=root, out=staging, preset=preset)
        ctx.dest.mkdir(parents=True)
        result: BuildResult = module.build(ctx)
        _check_generated(ctx.generated, staging)
        _check_replaced(root, staging, target)
        _publish(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        if staging.exists() and not any(staging.iterdir()):
            staging.rmdir()

    def moved(path: Path) -> Path:
        return target / path.relative_to(staging) if path.is_relative_to(staging) else path

    return BuildResult(
        preset=result.preset,
        path=moved(result.path),
        files=[moved(f) for f in result.files],
        notes=[n.replace(str(staging), str(target)) for n in result.notes],
    )


#: The folders of an app that presets copy into their output.
_SOURCES = ("config", "app", "database")


def _check_target(root: Path, target: Path) -> None:
    """Refuse an output directory that is the app's root or inside what is copied from
    it: the copy would copy its own output, deeper each time, until paths are too long."""
    inside = next((s for s in _SOURCES if target.is_relative_to(root / s)), None)
    if target == root or inside is not None:
        where = "the app's root" if inside is None else f"{inside}/"
        raise ConfigError(
            f"--out {target} is inside the app's sources ({where}), which the build copies "
            "into its output; choose a folder outside them, e.g. the default dist/",
            key="--out",
        )


def _check_generated(files: Iterable[Path], staging: Path) -> None:
    """Read each generated file as its tools will; a ``ConfigError`` names the first
    that they would reject (nothing has been published yet)."""
    import tomllib

    readers = {".toml": tomllib.loads, ".json": json.loads, ".jsonc": json.loads}
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".py":
                compile(text, str(path), "exec")
            elif path.suffix in readers:
                readers[path.suffix](text)
        except (ValueError, SyntaxError) as e:
            shown = path.relative_to(staging).as_posix() if path.is_relative_to(staging) else path
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(
                f"the build wrote {shown}, which its tools would reject ({reason}); nothing "
                "was written. Check the values haze.config.py and config/ put in it",
                key="--preset",
            ) from None


def _check_replaced(root: Path, staging: Path, target: Path) -> None:
    """Refuse, before anything moves, an output whose build folder (``<out>/<preset>``
    and the like) is the app's root or holds it: publishing replaces that folder whole,
    which would delete the app."""
    for entry in staging.iterdir():
        dest = target / entry.name
        if root.is_relative_to(dest):
            raise ConfigError(
                f"--out {target}: the build would replace {dest}, which holds the app "
                f"({root}); choose another folder, e.g. the default dist/",
                key="--out",
            )


def _publish(staging: Path, target: Path) -> None:
    """Move what a finished build wrote from ``staging`` into ``target``: a directory
    replaces the old one whole (the old one is renamed aside, then removed), a file
    replaces the old file (``os.replace``)."""
    for entry in sorted(staging.iterdir()):
        dest = target / entry.name
        if entry.is_dir():
            old = None
            if dest.exists():
                old = staging.with_name(f"{staging.name}-old-{entry.name}")
                dest.rename(old)
            entry.rename(dest)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        else:
            if dest.is_dir():
                shutil.rmtree(dest)
            os.replace(entry, dest)


#: The timestamp of every entry of a bundle zip (the zip format's earliest), so that the
#: same inputs give byte-identical archives and a deploy tool sees no change.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def compile_bytecode(src: Path) -> list[Path]:
    """Write the bytecode of every ``.py`` under ``src`` beside it; returns the files written.

    For a bundle whose code directory is read-only where it runs (``/var/task`` on AWS
    Lambda): Python could not save bytecode there, so each cold start would compile every
    module again. The bytecode is for this build's Python (its ``cache_tag``), hash-based
    and unchecked: it holds no time stamp, so the zip stays deterministic and the files
    are used whatever times they unpack with. The file names in it are relative to ``src``.

    Example::

        compile_bytecode(Path("dist/aws-lambda"))
    """
    import py_compile
    import sys

    tag = sys.implementation.cache_tag
    written: list[Path] = []
    for path in sorted(src.rglob("*.py")):
        relative = path.relative_to(src).as_posix()
        try:
            cached = py_compile.compile(
                str(path),
                # beside the source, whatever PYTHONPYCACHEPREFIX says where this build runs
                cfile=str(path.parent / "__pycache__" / f"{path.stem}.{tag}.pyc"),
                dfile=relative,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
            )
        except py_compile.PyCompileError as e:
            message = " ".join(str(e.exc_value).split())
            raise ConfigError(
                f"{relative} does not compile: {message}; fix it and build again"
            ) from None
        if cached is not None:  # always a path with doraise=True; typed as optional
            written.append(Path(cached))
    return written


def deterministic_zip(src: Path, dest: Path) -> Path:
    """Zip every file under ``src`` into ``dest``: sorted entries, fixed timestamps and
    permissions (0644), so the archive's bytes depend only on the files' paths and contents.

    Example::

        deterministic_zip(Path("dist/aws-lambda"), Path("dist/aws-lambda.zip"))
    """
    import zipfile

    files = sorted(
        (p for p in src.rglob("*") if p.is_file()), key=lambda p: p.relative_to(src).as_posix()
    )
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(src).as_posix(), date_time=ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100644 & 0xFFFF) << 16
            info.create_system = 3  # unix, so the permission bits above are honoured
            z.writestr(info, path.read_bytes())
    return dest
