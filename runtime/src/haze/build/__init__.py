"""``haze build --preset NAME``: turn an app into a deployable entrypoint under ``dist/``.

Each preset is one module in this package with a ``build(ctx) -> BuildResult``
function; :data:`PRESETS` maps the preset name to its module. A preset writes only
under ``ctx.dest`` (``dist/<preset>/``) and, where the platform wants a file beside
it, under ``ctx.out`` (``dist/wrangler.json``, ``dist/aws-lambda.zip``).

The app is loaded (config validated, jobs discovered) before any file is written, so a
broken app fails the build instead of the deploy.
"""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..app import App

__all__ = ["PRESETS", "BuildContext", "BuildResult", "build", "deterministic_zip"]

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

    @property
    def dest(self) -> Path:
        """``<out>/<preset>/``: the preset's own directory."""
        return self.out / self.preset

    def write(self, relative: str, text: str, *, base: Path | None = None) -> Path:
        """Write ``text`` to ``<base or dest>/relative`` (parents created)."""
        path = (base or self.dest) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
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
                dist = name.replace("_", "-")
                raise ConfigError(
                    f"the {self.preset} preset bundles {name!r}, which is not installed here; "
                    f"pip install {dist} (in the environment that runs `haze build`)",
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
    from ..app import App

    root = Path(root).resolve()
    app = App(root=root)
    target = Path(out).resolve() if out is not None else root / "dist"
    ctx = BuildContext(app=app, root=root, out=target, preset=preset)
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
    if ctx.dest.exists():
        shutil.rmtree(ctx.dest)
    ctx.dest.mkdir(parents=True)
    result: BuildResult = module.build(ctx)
    return result


#: The timestamp of every entry of a bundle zip (the zip format's earliest), so that the
#: same inputs give byte-identical archives and a deploy tool sees no change.
ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


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
