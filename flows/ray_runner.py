"""The selfplay flow's tasks on a Ray cluster: prefect-ray's task runner, swapped in while the
flow runs (the cluster's address is in the run's config, which the flow reads only then)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from ub.errors import UbError
from ub.run.steps.rounds import Run

log = logging.getLogger("ub.flow")


@contextmanager
def cluster_tasks(run: Run) -> Iterator[None]:
    """With ``cluster.address`` set: the flow's submitted tasks go through prefect-ray's
    ``RayTaskRunner`` and the run's Ray workers start (see :mod:`ub.run.processes.cluster`).

    The address is in the run's config, which the flow reads only once it runs, so the flow
    swaps its task runner here rather than at decoration. The tasks themselves ask Ray for no
    resources: they wait on the workers, which hold the CPUs and GPUs.
    """
    address = run.config.cluster.address
    if address is None:
        if run.config.cluster.learner_workers > 1:
            log.warning("cluster.learner_workers=%d applies on a Ray cluster only "
                        "(cluster.address or --ray); this run learns in one process",
                        run.config.cluster.learner_workers)
        yield
        return
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext
    from prefect_ray import RayTaskRunner
    from prefect_ray.context import remote_options

    from ub.run.processes.cluster import (
        alive_nodes,
        check_api_shared,
        connect_error,
        ray_init_kwargs,
        run_variables,
        start_workers,
    )

    # (The run's preflight has checked that the cluster answers.)
    with get_client(sync_client=True) as client:
        api_url = str(client.api_url)  # also the temporary server's, which workers must share
    context = FlowRunContext.get()
    runner = RayTaskRunner(address=address,
                           init_kwargs=ray_init_kwargs(api_url, run_variables(run.config)))
    try:
        runner.__enter__()
    except (ConnectionError, TimeoutError, RuntimeError) as exc:
        raise connect_error(address, exc) from None
    try:
        check_api_shared(api_url, alive_nodes())
    except UbError:
        runner.__exit__(None, None, None)
        raise
    previous, context.task_runner = context.task_runner, runner
    try:
        workers = start_workers(run)  # noqa: F841 (the flow owns them while it runs)
        with remote_options(num_cpus=0):
            yield
    finally:
        context.task_runner = previous
        runner.__exit__(None, None, None)
