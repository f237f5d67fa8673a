"""The flow run of a process that died holding a run: marked crashed by the one that resumes it.

A process ended outright (SIGKILL, the OOM killer, a lost machine, ub's own stop when the
Prefect server went silent) tells the server nothing, so its flow run stayed ``Running`` in
Prefect's UI for good, beside the flow run that resumed the run. Prefect's worker marks the
flow runs it started itself; ``ub train``'s (and a script's) have no worker. So the
``selfplay`` and ``evaluate-run`` flows write their flow run's id into the run's lock
(:class:`ub.run.folder.lock.RunLock`), and the next holder of a lock left by a dead process
sets that flow run ``Crashed`` on the server it reports to, naming itself. Best effort: a flow
run the server does not know (another server's) or has ended already is left as it is, and a
server that fails the call changes nothing in the run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from uuid import UUID

log = logging.getLogger("ub.flow")

FLOW_RUN_KEY = "flow_run"
"""The lock record's key for the holder's flow run id."""


def lock_owner() -> dict[str, str]:
    """What a run's lock records of this process's flow run (nothing outside a flow run)."""
    from prefect.runtime import flow_run

    return {FLOW_RUN_KEY: str(flow_run.id)} if flow_run.id else {}


def crash_dead_holders_flow_run(previous: Mapping[str, Any] | None) -> str | None:
    """Set the flow run of ``previous`` (the record of a lock's dead holder) ``Crashed`` when
    the server this process reports to still shows it running; returns the line it logged
    when it did."""
    from prefect.runtime import flow_run

    record = previous or {}
    dead = record.get(FLOW_RUN_KEY)
    if not dead or not flow_run.id or dead == str(flow_run.id):
        return None
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(dead)).state
            if state is None or not state.is_running():
                return None
            client.set_flow_run_state(UUID(dead), Crashed(message=(
                f"the process driving it (pid {record.get('pid')} on {record.get('host')}) "
                f"died; flow run {flow_run.id} "
                f"({flow_run.name}) took the run over")), force=True)
    except ObjectNotFound:
        return None  # a flow run of another server
    except Exception as exc:  # the server's trouble is not the run's
        log.warning("could not mark flow run %s of the process that died as crashed: %s",
                    dead, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    done = f"marked flow run {dead} of the process that died as crashed"
    log.info("%s", done)
    return done
