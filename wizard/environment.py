"""The environment header of every report (in the spirit of torch.utils.collect_env)."""

from __future__ import annotations

import platform
import sys

import torch

import nnwizard


def collect(device: torch.device) -> dict[str, str]:
    env = {
        "nnwizard": nnwizard.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "cuda": torch.version.cuda or "none",
        "cuda_available": str(torch.cuda.is_available()),
        "device": str(device),
        "threads": str(torch.get_num_threads()),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    from nnwizard.cuda_lost import rerun_note

    note = rerun_note()
    if note:
        env["cuda_lost"] = note
    return env
