"""What runs a run's steps: the engine and learner one process holds (``worker``) and the Ray
cluster's workers (``cluster``)."""
