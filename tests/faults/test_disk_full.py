"""The disk filling up mid-run: one clear error, nothing half-written visible, and once space
is freed the same command resumes to the same run as if nothing happened. Uses a real small
tmpfs (needs root, as on CI machines; skipped elsewhere)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from faults.runs import differences, train


@pytest.fixture()
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_is_one_clear_error_and_resume_works_after(reference, fault_config,
                                                              prefect_api, small_disk, ledger):
    ref, _ = reference
    # Leave room for about half of the run.
    ballast = small_disk / "ballast"
    free = shutil.disk_usage(small_disk).free
    ballast.write_bytes(b"\0" * (free - 2 * 2**20))
    ledger["faults injected"] += 1
    result = train(fault_config, small_disk, prefect_api)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("ub: error:")]
    assert len(lines) == 1 and "No space left on device" in lines[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]

    ballast.unlink()
    result = train(fault_config, small_disk, prefect_api)
    assert result.returncode == 0, result.stderr[-2000:]
    found = differences(small_disk / "run", ref)
    ledger["faults survived" if not found else "faults lost"] += 1
    assert not found
