"""Training runs: config, run directory layout, lock, the round steps, progress output.

Pure ``ub`` code (no Prefect import): ``flows/`` and ``tasks/`` orchestrate these.
"""
