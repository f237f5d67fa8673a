"""``ub doctor``: check a run's integrity; ``--repair`` quarantines what is broken."""

from __future__ import annotations

import argparse

from ub.cli.args import add_root_argument, run_dir


def add_parser(sub) -> None:
    doctor = sub.add_parser("doctor", help="check a run's integrity (--repair: quarantine "
                            "what is broken so it can resume)")
    doctor.add_argument("run", help="run name (under --root) or run directory")
    add_root_argument(doctor)
    doctor.add_argument("--repair", action="store_true",
                        help="move untrustworthy files to RUN/quarantine/ (nothing is deleted)")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from ub.run.checks.doctor import examine, repair
    from ub.run.folder.layout import RunPaths, round_label
    from ub.run.folder.lock import RunLock, holder

    root = run_dir(args).absolute()
    if not args.repair:
        live = holder(root / "run.lock")
        if live is not None:
            print(f"note: run {root.name} is in use by pid {live.get('pid', '?')}: checking its "
                  "committed rounds only")
        exam = examine(root, live=live is not None)
        _print_findings(exam)
        return 1 if exam.findings else 0
    # Nothing may write the run while it is repaired; a dead driver's record stays for the
    # next `ub train` (which marks its flow run crashed).
    with RunLock(root / "run.lock", pass_on_recovered=True):
        exam = examine(root)
        _print_findings(exam)
        if not exam.findings:
            return 0
        moved = repair(exam)
    for source, target in moved:
        print(f"quarantined {source.relative_to(root)} -> {target.relative_to(root)}")
    rewritten = [f for f in exam.findings if f.derived and f.path.exists()]
    for finding in rewritten:
        print(f"rewrote {finding.path.relative_to(root)} from the run's data")
    first = exam.first_broken_round
    if first is not None:
        resume = RunPaths(root).resume_command
        replays = (f"replays rounds {first + 1}..{exam.rounds[-1] + 1} as they were (same "
                   "seed, same games)" if exam.rounds and first <= exam.rounds[-1] else
                   "plays on from there")
        print(f"run {root.name} is back at {round_label(first)}: `{resume}` {replays}")
    return 0


def _print_findings(exam) -> None:
    for note in exam.notes:
        print(f"note: {note}")
    for finding in exam.findings:
        print(f"problem: {finding.line(exam.root)}")
    verdict = (f"{len(exam.findings)} problem(s); `ub doctor {exam.root} --repair` quarantines "
               "what cannot be trusted" if exam.findings else "ok")
    print(f"{exam.root.name}: {len(exam.rounds)} committed round(s), {verdict}")
    print(exam.format_line)
