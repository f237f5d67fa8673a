"""Training runs, by what each part holds: a run's folder (:mod:`ub.run.folder`), the processes
that run its steps (:mod:`ub.run.processes`), its config (:mod:`ub.run.config`), the steps of a
round (:mod:`ub.run.steps`) and the checks on a run (:mod:`ub.run.checks`).

Pure ``ub`` code (no Prefect import): ``flows/`` and ``tasks/`` orchestrate these.
"""
