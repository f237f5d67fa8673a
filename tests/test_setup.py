"""scripts/setup.sh installs the lock with uv when it can: uv does not read pip's configuration,
so the package sources pip is configured with (this machine's mirrors, say) are handed to it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "pip_sources.py"


def test_uv_gets_the_sources_pip_is_configured_with(tmp_path):
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nextra-index-url = file:///a/simple\n    file:///b/simple\n"
                      "find-links = /wheels-from-file\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(config), PIP_INDEX_URL="https://mirror.example/simple",
               PIP_FIND_LINKS="/wheels-from-env")  # pip: a variable overrides the files
    flags = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True,
                           text=True, check=True, timeout=120).stdout.split()
    assert flags == ["--index-url", "https://mirror.example/simple",
                     "--extra-index-url", "file:///a/simple",
                     "--extra-index-url", "file:///b/simple",
                     "--find-links", "/wheels-from-env"]
