"""Print pip's package sources as uv flags, one per word: ``--index-url URL``,
``--extra-index-url URL`` and ``--find-links PATH`` for each, as pip is configured here
(config files and ``PIP_*`` variables, as ``pip config list`` reports them; a variable overrides
a file, as in pip). uv does not read pip's configuration; scripts/setup.sh passes these."""

from __future__ import annotations

import ast
import subprocess
import sys

FLAGS = ("index-url", "extra-index-url", "find-links")


def pip_sources(listing: str) -> list[str]:
    """uv flags from the output of ``pip config list`` (``scope.key=repr(value)`` lines; a
    value may hold several whitespace-separated entries)."""
    found: dict[str, str] = {}
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        scope, _, name = key.rpartition(".")
        if sep and name in FLAGS and (name not in found or scope == ":env:"):
            found[name] = ast.literal_eval(value)  # a PIP_* variable wins over the files
    return [word for name in FLAGS for value in found.get(name, "").split()
            for word in (f"--{name}", value)]


if __name__ == "__main__":
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=True,
                             capture_output=True, text=True).stdout
    print(" ".join(pip_sources(listing)))
