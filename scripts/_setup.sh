# Shared setup for scripts/demo and scripts/test (sourced, not run).
# Installs uv if needed and syncs the workspace venv from uv.lock.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v uv >/dev/null 2>&1; then
    echo "haze: installing uv (the workspace's package manager) with pip" >&2
    python3 -m pip install --quiet --disable-pip-version-check uv \
        || python3 -m pip install --quiet --user --disable-pip-version-check uv
    export PATH="$HOME/.local/bin:$PATH"
fi
uv sync --frozen --quiet
