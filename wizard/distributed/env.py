"""The launch environment of a distributed run: whether this process is one rank of a job the user started
(``torchrun``, or any launcher that sets ``RANK`` and ``WORLD_SIZE``), which backend a rank uses, how many
ranks the machine can hold, and the environment in which a distributed script runs as one process."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager

from nnwizard.errors import UsageError

# what a launcher sets for its ranks (torch.distributed.run, torch.distributed.launch, mpirun through env://)
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
             "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
             "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
CONFIG_VAR = "NNWIZARD_DIST"   # set by nnwizard's own launcher for the ranks it starts (JSON, see launch.py)


def in_torchrun() -> bool:
    """This process is one rank of a job of several (the user's ``torchrun ... -m nnwizard``), not a rank that
    nnwizard's own launcher started."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        int(os.environ["RANK"])
    except (KeyError, ValueError):
        return False
    return world > 1 and CONFIG_VAR not in os.environ


def rank_and_world() -> tuple[int, int, int]:
    """(RANK, LOCAL_RANK, WORLD_SIZE) from the environment."""
    rank = int(os.environ.get("RANK", "0"))
    return rank, int(os.environ.get("LOCAL_RANK", str(rank))), int(os.environ.get("WORLD_SIZE", "1"))


def cuda_devices() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return 0


def device_kind(device: str) -> str:
    """``cuda`` (ranks on GPUs, nccl) or ``cpu`` (gloo) for ``--device auto|cpu|cuda``."""
    if device == "cpu":
        return "cpu"
    if device == "cuda" or cuda_devices():
        return "cuda"
    return "cpu"


def check_nproc(nproc: int, device: str) -> str:
    """The device kind the ranks use; UsageError (exit 2, one line) when the machine cannot hold ``nproc`` ranks."""
    if nproc < 1:
        raise UsageError(f"--nproc {nproc}: expected at least 1")
    kind = device_kind(device)
    if kind == "cuda":
        gpus = cuda_devices()
        if device == "cuda" and not gpus:
            raise UsageError("--device cuda: no CUDA device is available")
        if nproc > gpus:
            raise UsageError(f"--nproc {nproc}: this machine has {gpus} GPU(s); one rank per GPU (nccl) needs "
                             f"--nproc {gpus} or fewer (--device cpu runs the ranks on the CPU with gloo)")
        return kind
    cores = os.cpu_count() or 1
    if nproc > cores:
        raise UsageError(f"--nproc {nproc}: this machine has {cores} CPU core(s); CPU ranks (gloo) need one core each, "
                         f"so --nproc {cores} or fewer")
    return kind


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def environment(values: dict[str, str], hide: tuple[str, ...] = ()):
    """Environment variables set to ``values`` (and ``hide`` removed) meanwhile; restored afterwards."""
    saved = {k: os.environ.get(k) for k in (*hide, *values)}
    for k in hide:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def one_process():
    """The environment of a distributed script run as one process: ``RANK=0``, ``WORLD_SIZE=1``, a free
    ``MASTER_PORT`` on 127.0.0.1, so that its ``init_process_group`` makes a group of one (the diagnosis reruns
    the script under interventions this way). A launcher's own variables (an agent's store) are hidden
    meanwhile and restored afterwards."""
    return environment({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}, hide=(*RANK_VARS, CONFIG_VAR))
