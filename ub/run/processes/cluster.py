"""A round's heavy steps on a Ray cluster: workers that hold an engine or the learner for life.

With ``cluster.address`` set, the flow's tasks go through prefect-ray's ``RayTaskRunner``
(Prefect keeps the retries, states and UI) and each task hands its step to a named Ray actor:

- ``rollout-0 .. rollout-{n-1}``: one vLLM engine each, started on first use and kept across
  rounds; new checkpoints arrive as new LoRA adapters by path. Round shards go to
  ``shard % n``, evaluations to ``rollout-0``.
- ``learner-0 .. learner-{m-1}``: the learner's base model and optimizer, kept across
  rounds; with ``learner_workers`` above 1 they form a ``torch.distributed`` group and train
  data-parallel (:mod:`ub.distributed`).

Actors, not plain tasks, hold the resources: Ray reuses a task's worker process but may hand
the next task other GPUs, while the engine stays on the device it started on. An actor owns
its GPUs (or CPUs) for its lifetime, so the engine and the scheduler agree. The flow process
creates the actors and owns them: they stop with it, and Ray restarts one that dies (the task's
retry then replays its shard from the same seeds).

Without an address every step runs in the calling process, and nothing here imports Ray.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import re
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ub.errors import UbError

if TYPE_CHECKING:
    from ub.run.processes.worker import Worker

log = logging.getLogger("ub.flow")
T = TypeVar("T")

NAMESPACE = "ub"
# Settings a worker must share with the flow process: where Prefect's API and home are,
# offline switches, ub's own settings, where a run store is and which profile reaches it
# (workers publish their own files). Ray workers inherit the raylet's environment otherwise.
# Ray shows what it forwards (``runtime_env``) to whoever can read the cluster's state, so a
# variable whose name says it holds a secret (SECRET_WORDS) is forwarded only when the run
# needs it (a hosted opponent's ``key=``) or UB_RAY_ENV names it: credentials are each node's
# own (docs/security.md).
FORWARDED_PREFIXES = ("PREFECT_", "UB_", "HF_", "VLLM_", "TRANSFORMERS_", "WANDB_", "AWS_",
                      "GOOGLE_", "FSSPEC_")
FORWARDED_NAMES = ("DO_NOT_TRACK", "TOKENIZERS_PARALLELISM")
SECRET_WORDS = frozenset({"KEY", "KEYS", "APIKEY", "SECRET", "SECRETS", "TOKEN", "TOKENS",
                          "PASSWORD", "PASSWD", "PASS", "CREDENTIAL", "CREDENTIALS", "AUTH",
                          "COOKIE", "PRIVATE", "SIGNATURE"})
"""A word of a variable's name (between ``_``) that marks it as a secret, and so does a word
that holds one of the longer ones or ends in ``KEY``/``KEYS`` (``HF_HUB_APITOKEN``,
``MY_ACCESSKEY``)..."""
SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "SIGNATURE",
                "PRIVATE")
URL_PASSWORD = re.compile(r"://[^/@\s]*:[^/@\s]*@")
"""A value that is (or holds) a URL with a password (``https://user:pass@host``): a secret
too, whatever the variable's name."""
PATH_SUFFIXES = ("_FILE", "_PATH", "_DIR")
"""...unless the name ends in one of these, or is GOOGLE_APPLICATION_CREDENTIALS: it names a
file (which each node must have), not the secret in it."""
PREFECT_CREDENTIALS = ("PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")
"""What the tasks on the workers present to the Prefect API they report to, where it asks."""
EXTRA_VARIABLES = "UB_RAY_ENV"
"""Comma-separated names of further variables to forward, secrets included (visible then to
whoever can read the cluster's state)."""


def on_worker(run: Any, role: str, index: int, step: Callable[..., T], *args: Any,
              worker: Worker) -> T:
    """``step(*args, worker=W)`` on the run's ``role`` worker ``index``, with ``W`` that Ray
    actor's :class:`~ub.run.processes.worker.Worker`; without a cluster here, with ``worker``."""
    if run.config.cluster.address is None:
        return step(*args, worker=worker)
    import ray

    actor = ray.get_actor(worker_name(run, role, index), namespace=NAMESPACE)
    try:
        return ray.get(actor.call.remote(step, *args))
    except ray.exceptions.ActorUnavailableError:
        # The actor died mid-step and Ray is restarting it (a new process and engine: a
        # minute on the CPU, more on a GPU). The task's retry replays the step (each commits
        # atomically): it must find the actor restarted, not still restarting (the retry
        # came 2 s later and failed the run the same way).
        _wait_until_restarted(actor)
        raise


RESTART_WAIT_S = 1800.0
"""How long a step's failure waits for its Ray actor to restart before the retry."""


def _wait_until_restarted(actor: Any) -> None:
    """Return when ``actor`` answers again, or after :data:`RESTART_WAIT_S` (the retry then
    fails as Ray says); an actor out of restarts raises Ray's error at once."""
    import time

    import ray

    deadline = time.monotonic() + RESTART_WAIT_S
    while time.monotonic() < deadline:
        try:
            ray.get(actor.describe.remote(), timeout=60)
            return
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            time.sleep(1)


def on_learners(run: Any, step: Callable[..., T], *args: Any, worker: Worker) -> T:
    """``step(*args, worker=W)`` on every learner rank at once (they meet in their
    collectives), each with its own worker; rank 0's result, or here (with ``worker``)
    without a cluster."""
    workers = run.config.cluster.learner_workers
    if run.config.cluster.address is None:
        return step(*args, worker=worker)
    if workers == 1:
        return on_worker(run, "learner", 0, step, *args, worker=worker)
    import ray

    handles = [ray.get_actor(worker_name(run, "learner", rank), namespace=NAMESPACE)
               for rank in range(workers)]
    return ray.get([handle.call.remote(step, *args) for handle in handles])[0]


def worker_name(run: Any, role: str, index: int) -> str:
    """Unique per run directory: two runs on one cluster never share a worker."""
    digest = hashlib.sha1(str(run.paths.root).encode()).hexdigest()[:10]
    return f"{run.name}-{digest}-{role}-{index}"


def rollout_worker(run: Any, shard: int) -> int:
    return shard % run.config.cluster.rollout_workers


def is_secret_name(name: str) -> bool:
    """Whether variable ``name`` says it holds a secret (``AWS_SECRET_ACCESS_KEY``, ``HF_TOKEN``,
    ``WANDB_API_KEY``, ``PREFECT_API_KEY``), not a file that holds one."""
    if name.endswith(PATH_SUFFIXES) or name == "GOOGLE_APPLICATION_CREDENTIALS":
        return False
    return any(word in SECRET_WORDS or word.endswith(("KEY", "KEYS"))
               or any(part in word for part in SECRET_PARTS)
               for word in name.upper().split("_"))


def run_variables(config: Any) -> list[str]:
    """The environment variables the run's actors read on its workers: each hosted opponent's
    ``key=`` (the rollouts that seat it run there)."""
    from ub.actors.spec import parse_actor

    names = [*config.opponents.fixed_names(), *config.eval.opponents]
    return sorted({key for name in names for key in parse_actor(name).environment_variables()})


def forwarded_environment(needed: Iterable[str] = ()) -> dict[str, str]:
    """The flow process's settings that its Ray workers need (see ``FORWARDED_PREFIXES``)
    without those that hold secrets, and ``needed`` (the run's, :func:`run_variables`) and the
    variables :data:`EXTRA_VARIABLES` names whatever they hold; without ub's per-engine
    defaults of this process (a worker's engine decides its own: its platform and model folder
    may differ, e.g. GPU workers of a CPU driver)."""
    from ub.vllm_environment import ENGINE_DEFAULTS, SET_BY_UB

    named = {*needed, *(n.strip() for n in os.environ.get(EXTRA_VARIABLES, "").split(",") if n)}
    return {k: v for k, v in os.environ.items()
            if (k in named or ((k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES)
                               and not is_secret_name(k) and not URL_PASSWORD.search(v)))
            and not (k in ENGINE_DEFAULTS and SET_BY_UB.get(k) == v)}


def ray_init_kwargs(api_url: str | None, needed: Iterable[str] = ()) -> dict[str, Any]:
    """``ray.init`` settings of the flow process: its environment for every worker (with the
    Prefect API the flow reports to and its credentials, and ``needed``: the variables the
    run's actors read), Ray's dashboard and log forwarding off (ub has its own logs under
    ``RUN/logs``)."""
    env = forwarded_environment([*needed, *PREFECT_CREDENTIALS])
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return {"namespace": NAMESPACE, "runtime_env": {"env_vars": env},
            "include_dashboard": False, "log_to_driver": False}


def connect_error(address: str, exc: BaseException) -> UbError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UbError(f"cannot reach the Ray cluster at cluster.address={address} ({first}): start "
                   "it (`ray start --head`), fix the address, or set cluster.address to null "
                   "to run in this process")


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a port that is none (``HOST:99999``) and on a ``HOST:PORT`` nobody listens
    on (Ray itself retries for minutes)."""
    from ub.numbers import NumberError, parse_port, url_port

    if address == "auto":
        return  # Ray resolves it itself
    host, colon, port_text = address.rpartition(":")
    try:
        port = url_port(address) if "://" in address else (
            parse_port(port_text) if colon else None)
    except NumberError as exc:
        raise UbError(f"cluster.address={address}: {exc}") from None
    if "://" in address or port is None:
        return  # (ray://HOST:PORT: Ray's client connects, and says why it cannot)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise connect_error(address, exc) from None


def alive_nodes() -> int:
    """The nodes of the Ray cluster this process is connected to."""
    import ray

    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_api_shared(api_url: str, nodes: int) -> None:
    """Tasks run on every node and report to the Prefect API: with several nodes, an API on
    this machine's loopback (the temporary server ``ub train`` starts) cannot be theirs."""
    from urllib.parse import urlparse

    if nodes > 1 and urlparse(api_url).hostname in ("127.0.0.1", "localhost", "::1"):
        raise UbError(f"the Ray cluster has {nodes} nodes, but the Prefect API ({api_url}) is "
                      "on this machine's loopback, which the other nodes cannot reach: start "
                      "`prefect server start --host 0.0.0.0` on a node they all reach and "
                      "export PREFECT_API_URL=http://THAT_HOST:4200/api before `ub train`")


def start_workers(run: Any) -> list[Any]:
    """Create (or find, after a restart of the flow) the run's workers; returns their handles,
    which the caller keeps while the run goes on. Waits until every worker is up."""
    import ray

    cluster = run.config.cluster
    worker_class = ray.remote(RoundWorker)
    roles = [("rollout", i, cluster.rollout) for i in range(cluster.rollout_workers)]
    roles += [("learner", i, cluster.learner) for i in range(cluster.learner_workers)]
    check_fits(roles, ray.cluster_resources())
    idle = idle_engines(run.config)
    if idle:
        log.warning("%s", idle)
    handles = []
    for role, index, resources in roles:
        handles.append(worker_class.options(
            name=worker_name(run, role, index), namespace=NAMESPACE, get_if_exists=True,
            num_cpus=resources.num_cpus, num_gpus=resources.num_gpus, max_restarts=2,
        ).remote(run.paths.logs, resources.num_cpus, resources.num_gpus, role == "rollout"))
    for (role, index, _), info in zip(roles, ray.get([h.describe.remote() for h in handles]),
                                      strict=True):
        log.info("ray worker %s-%d: pid %s on %s, cores %s, gpus %s", role, index, info["pid"],
                 info["node"], info["cores"], info["gpus"])
    learners = handles[cluster.rollout_workers:]
    if len(learners) > 1:  # rank 0's node hosts the group's rendezvous
        address = ray.get(learners[0].rendezvous.remote())
        ray.get([h.join_learners.remote(rank, len(learners), address)
                 for rank, h in enumerate(learners)])
        log.info("learners: %d data-parallel ranks, rendezvous %s", len(learners), address)
    return handles


def idle_engines(config: Any) -> str | None:
    """The warning for a round's shards that leave engine workers idle, or ``None``. Shard
    ``s`` goes to worker ``s % rollout_workers`` and a worker plays its shards one after
    another, so fewer shards than workers idle the rest every round, and a count that is no
    multiple of them keeps the others waiting for the workers with a shard more. Said when
    the workers start and by ``ub train --dry-run``."""
    shards, workers = config.rollout.shards, config.cluster.rollout_workers
    if shards < workers:
        return (f"rollout.shards {shards} < cluster.rollout_workers {workers}: "
                f"{workers - shards} engine(s) idle every round; set rollout.shards to a "
                f"multiple of {workers}")
    if shards % workers:
        return (f"rollout.shards {shards} is no multiple of cluster.rollout_workers {workers}: "
                f"{shards % workers} engine(s) play a shard more each round while the others "
                f"wait; set rollout.shards to a multiple of {workers}")
    return None


def check_fits(roles: list[tuple[str, int, Any]], available: dict[str, float]) -> None:
    """Refuse workers the cluster can never hold at once (Ray would wait for them forever), and
    workers without a GPU on a cluster that has GPUs: Ray hides no GPU from a worker that asked
    for none, so every engine and learner would see them all and run on GPU 0 while the others
    idle."""
    gpus = available.get("GPU", 0.0)
    for role in ("rollout", "learner"):
        if gpus and any(r == role and not res.num_gpus for r, _, res in roles):
            raise UbError(
                f"the Ray cluster has {gpus:g} GPUs, but the run's {role} workers ask for none "
                f"(cluster.{role}.num_gpus: 0): each would see every GPU and run on GPU 0 while "
                "the others idle. Give each worker its GPU: cluster.rollout.num_gpus: 1 and "
                "cluster.learner.num_gpus: 1 (0.5: two workers share one), as the GPU presets "
                "do")
    for key, field in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        wanted = sum(getattr(resources, field) for _, _, resources in roles)
        if wanted > available.get(key, 0.0) + 1e-9:
            learners = sum(1 for role, _, _ in roles if role == "learner")
            raise UbError(
                f"the run's Ray workers need {wanted:g} {key}s ({len(roles) - learners} rollout "
                f"and {learners} learner workers, cluster.rollout/learner.{field}), the "
                f"cluster has {available.get(key, 0.0):g}: lower cluster.rollout_workers, "
                f"cluster.learner_workers or the {field} settings, or add nodes")


class RoundWorker:
    """The body of a Ray actor: runs round steps in a process that keeps what they load (its
    :class:`~ub.run.processes.worker.Worker`, which every step it runs is given).

    A CPU engine worker pins its vLLM threads to cores no other ub worker on the node holds
    (vLLM-CPU binds its threads to cores; two engines bound to the same cores would halve each
    other). A learner worker uses as many torch threads as it has CPUs.
    """

    def __init__(self, logs: Path, num_cpus: float, num_gpus: float, engine: bool) -> None:
        from ub.run.folder.logs import run_logs
        from ub.run.processes.worker import Worker

        self.worker = Worker()

        self.cores = None
        if engine and not num_gpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
            self.cores = claim_cores(max(1, math.ceil(num_cpus)))
            if self.cores:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = self.cores
        if not engine and num_cpus >= 1:
            import torch

            torch.set_num_threads(int(num_cpus))
        # The components' log files of the run, appended by every process (lines stay whole).
        self._logs = run_logs(Path(logs))
        self._logs.__enter__()

    def describe(self) -> dict[str, Any]:
        import ray

        context = ray.get_runtime_context()
        return {"pid": os.getpid(), "node": ray.util.get_node_ip_address(),
                "cores": self.cores or "all", "gpus": context.get_accelerator_ids().get("GPU")}

    def call(self, step: Callable[..., T], *args: Any) -> T:
        return step(*args, worker=self.worker)

    def rendezvous(self) -> str:
        """``HOST:PORT`` for the learners' process group, on this (rank 0's) node."""
        import ray

        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def join_learners(self, rank: int, world: int, address: str) -> None:
        from ub.distributed import join

        join(rank, world, address)
        log.info("learner rank %d of %d joined the process group at %s", rank, world, address)


_CLAIMED: list[Any] = []  # open lock files: a claim lasts as long as the process


def claim_cores(count: int, lock_dir: Path | None = None) -> str | None:
    """Claim ``count`` of this node's cores for this process, as a vLLM CPU list (``"2-3"``).

    Slots of ``count`` consecutive cores are claimed with a lock file each (released when the
    process exits, even by SIGKILL). ``None`` when every slot is taken: the caller then shares
    all cores.
    """
    cores = sorted(os.sched_getaffinity(0))
    folder = lock_dir or Path(os.environ.get("TMPDIR", "/tmp")) / "ub-cores"
    folder.mkdir(parents=True, exist_ok=True)
    for slot in range(len(cores) // count):
        chosen = cores[slot * count:(slot + 1) * count]
        handle = open(folder / f"cores-{chosen[0]}-{chosen[-1]}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _CLAIMED.append(handle)
        from ub.vllm_environment import core_list

        return core_list(chosen)
    log.warning("every core of this node is claimed by another ub engine: sharing all cores")
    return None
