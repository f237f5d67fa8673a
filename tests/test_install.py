"""`pip install` puts ub's own name in site-packages and no other: the folders flows/ and tasks/
install as ub.flows and ub.tasks (the links ub/flows and ub/tasks), never as the generic top-level
packages `flows` and `tasks` that any other project's module of that name would collide with."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_ub_alone_with_its_flows_and_tasks(tmp_path):
    # Built from a copy of what the wheel is made of, so the checkout gets no build/ folder.
    source = tmp_path / "src"
    for name in ("ub", "flows", "tasks"):
        shutil.copytree(ROOT / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "--quiet", "-w", str(tmp_path / "dist")],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("ub-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/")[0] for name in names}
        dist_info = next(top for top in tops if top.endswith(".dist-info"))
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
        top_level = archive.read(f"{dist_info}/top_level.txt").decode().split()
        for folder in ("flows", "tasks"):
            files = sorted(p.name for p in (ROOT / folder).glob("*.py"))
            assert sorted(n.rpartition("/")[2] for n in names
                          if n.startswith(f"ub/{folder}/")) == files
            for file in files:
                assert (archive.read(f"ub/{folder}/{file}")
                        == (ROOT / folder / file).read_bytes())
    assert tops == {"ub", dist_info}
    assert top_level == ["ub"]
    assert "ub = ub.flows.cli:entry" in entry_points
