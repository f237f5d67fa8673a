"""Keeping vLLM quiet: its expected warnings (CPU machine, ub's settings) are dropped, the rest
still shows. Python loggers get a filter (:func:`quiet_vllm_logging`); native code writing to
file descriptor 2 during the engine start is filtered by :func:`filtered_stderr`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator


class DropKnownNoise(logging.Filter):
    """Drop vLLM warnings that are expected here (CPU machine, our settings) and need no action."""

    PATTERNS = (
        "not found in LD_PRELOAD",  # tcmalloc / Intel OpenMP: optional speed-ups
        "doesn't allow to use `torch.set_num_threads`",  # thread pinning, repeated per step
        "Triton is installed, but doesn't include CPU backend",
        "Triton is not installed",
        "Model Runner V2 requires Triton",
        "Reset SSM cache type",
        "The global random seed is set to",  # the engine restores the caller's RNG state
        "does not officially support disabling chunked prefill",  # on purpose: ub.inference.patches
        "different tokenizers for different LoRAs",  # adapters share the base tokenizer
        "is already registered. Overwriting",  # a second engine in the same process
        "Unknown vLLM environment variable detected: VLLM_DIST_IDENT",  # set by vLLM itself
        "Enforce eager set",  # ub asks for it on the CPU (ub.inference.patches), every start
        "Inductor compilation was disabled",  # the same setting's second line
    )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern in message for pattern in self.PATTERNS)


NOISE_FILTER = DropKnownNoise()

NATIVE_NOISE = (
    # vLLM's CPU worker binds memory to the NUMA node of its cores and says so through torch's
    # C++ warning (straight to fd 2, past Python's logging and warnings) on every engine start.
    b"NUMA binding: Using MEMBIND policy",
)


@contextlib.contextmanager
def filtered_stderr(drop: tuple[bytes, ...]) -> Iterator[None]:
    """Hold what is written to file descriptor 2 during the block (native code included) and
    pass it on afterwards, in order, without the lines that contain any of ``drop``; when the
    block fails, all of it (what led to a failure is not noise). Only for the in-process
    engine start: a child process started inside would keep the held file."""
    import sys
    import tempfile

    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (e.g. captured): as it is
        fd = -1
    if fd < 0:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), fd)
        failed = True
        try:
            yield
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().splitlines(keepends=True)
                    if failed or not any(pattern in line for pattern in drop)]
            data = b"".join(kept)
            while data:  # (os.write may take part of it)
                data = data[os.write(fd, data):]


NOISY_VLLM_MODULES = (
    "config.vllm",
    "engine.arg_utils",
    "platforms.cpu",
    "platforms.interface",
    "triton_utils.dispatcher",
    "triton_utils.importing",
    "v1.engine.input_processor",
    "v1.worker.cpu_worker",
)


def quiet_vllm_logging() -> None:
    """Attach the noise filter to every vLLM logger (the ones that exist now).

    A filter on the logger that emits a record also survives vLLM's logging reconfiguration
    (which replaces the handlers; ub turns it off, a user may turn it back on). It is called
    before import, after import and after start to catch loggers created lazily.
    """
    names = [n for n in logging.root.manager.loggerDict if n.startswith("vllm.")]
    # The emitters of the messages above, which vLLM imports lazily (some only at engine start).
    names += [f"vllm.{name}" for name in NOISY_VLLM_MODULES]
    for name in names:
        logger = logging.getLogger(name)
        if NOISE_FILTER not in logger.filters:
            logger.addFilter(NOISE_FILTER)
    # A deprecated torch attribute that vLLM's dispatcher touches at every start.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")

