"""The long fault-injection run: many randomized SIGKILL sequences of a real ``ub train``.

Not a test. ``.venv/bin/python bench/faults.py [--runs 10] [--kills 4] [--seed 0]``
(about a minute per run on 2 cores).

The suite's version (``tests/faults/test_kill_resume.py``) kills one run three times. This one
plays ``--runs`` runs of the same small config (``tests/faults/runs.py``), each killed up to
``--kills`` times at fault points drawn at random from a census of where an uninterrupted run
goes (mid-rollout, mid-shard-write, between shard files, mid-update, mid-checkpoint-write,
mid-rating, before the commit), then resumed; after each it checks everything a resume relies
on against the uninterrupted run (``ub doctor`` finds nothing; games, steps, eval games, rating
snapshots, a ratings rebuild, every checkpoint's adapter and optimizer bytes). Prints each run's
kills and problems, then ``faults: N injected, N survived, N lost``; exits 1 if anything was
lost.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from faults.runs import CONFIG, differences, plan_faults, train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--kills", type=int, default=4, help="kills per run (at most)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    work = Path(tempfile.mkdtemp(prefix="ub-bench-faults-"))
    config = work / "faults.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    census_file = work / "census.txt"
    counts: Counter = Counter()
    with prefect_test_harness(server_startup_timeout=120):
        api = PREFECT_API_URL.value()
        done = train(config, work / "reference", api, env={"UB_FAULT_LOG": str(census_file)})
        if done.returncode != 0:
            sys.exit(f"the reference run failed:\n{done.stderr[-3000:]}")
        census = Counter(census_file.read_text().split())
        rng = random.Random(args.seed)
        for i in range(args.runs):
            root = work / f"run-{i:03d}"
            injected = []
            for fault in plan_faults(census, rng, args.kills):
                done = train(config, root, api, env={"UB_FAULT_AT": fault})
                if done.returncode == 0:
                    break
                if done.returncode != -signal.SIGKILL:
                    sys.exit(f"run {i}: {fault} ended with {done.returncode}:\n"
                             f"{done.stderr[-3000:]}")
                injected.append(fault)
            done = train(config, root, api)
            found = (differences(root / "run", work / "reference" / "run")
                     if done.returncode == 0 else [f"resume failed: {done.stderr[-500:]}"])
            counts["injected"] += len(injected)
            counts["survived" if not found else "lost"] += len(injected)
            print(f"run {i}: killed at {', '.join(injected) or 'nothing'}; "
                  f"{found or 'ok'}", flush=True)
    print(f"faults: {counts['injected']} injected, {counts['survived']} survived, "
          f"{counts['lost']} lost")
    sys.exit(1 if counts["lost"] else 0)


if __name__ == "__main__":
    main()
