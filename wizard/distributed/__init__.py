"""Distributed training (CONTRACT §8): ``nnwizard diagnose|watch --script train.py --nproc N``, and nnwizard
started by the user under ``torchrun`` themselves.

- :mod:`.env`       the launch environment: is this process a rank of a torchrun job, the backend, the
                    world size a machine can hold, the environment of a one-process run;
- :mod:`.channel`   the store every rank and the parent share (a ``torch.distributed.TCPStore``): digests,
                    heartbeats, the agreed stop, an abort;
- :mod:`.digest`    what one rank records for the cross-rank audits (a recorder listener and a patch set);
- :mod:`.agree`     every rank stops at the same optimizer step;
- :mod:`.heartbeat` a heartbeat per rank, and the watchdog that ends a hang with every rank's stack;
- :mod:`.rank`      one rank's run (``python -m nnwizard.distributed.rank`` under the launcher, or in-process
                    under the user's torchrun);
- :mod:`.launch`    the parent: torch's elastic launcher, the watchdog, Ctrl-C, then the merged diagnosis;
- :mod:`.merged`    the ranks' digests side by side (``DistributedRun``), what the probes read;
- :mod:`.fsdp`      plain copies of FSDP2 modules (one process: the captured model, bundles).
"""

from nnwizard.distributed.env import in_torchrun

__all__ = ["in_torchrun", "run_distributed"]


def run_distributed(opts, view=None) -> int:
    """``diagnose --script --nproc N`` (or nnwizard under the user's torchrun): the exit code. See :mod:`.launch`."""
    from nnwizard.distributed.launch import run_distributed as run

    return run(opts, view)
