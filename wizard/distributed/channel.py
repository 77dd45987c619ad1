"""The store the ranks and the parent share: a ``torch.distributed.TCPStore`` (key -> bytes, over TCP), outside
the script's process group, so nothing of nnwizard's enters the collectives the script makes.

- ``--nproc N``: the parent serves a store of its own (``serve()``) and passes its address to the ranks
  (``connect(address)``);
- under the user's ``torchrun``: the elastic agent's store where the ranks use it
  (``TORCHELASTIC_USE_AGENT_STORE=True``), else rank 0 serves the store at ``MASTER_ADDR:MASTER_PORT`` with
  multi-tenancy, which the script's own ``init_process_group`` then shares (``for_torchrun()``).

Keys (under ``nnwizard/<run>/``): ``hb/<rank>`` a heartbeat, ``digest/<rank>`` a rank's digest, ``stack/<rank>``
its Python stacks after an abort, ``stop`` the agreed stop step, ``abort`` why the watchdog ended the run.
Values are JSON.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

PREFIX = "nnwizard/"


def _store_class():
    from torch.distributed import TCPStore

    return TCPStore


def serve(timeout_s: float = 60.0):
    """A store served by this process on a free port of 127.0.0.1: (store, "host:port")."""
    store = _store_class()("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    return store, f"127.0.0.1:{store.port}"


def connect(address: str, timeout_s: float = 60.0):
    host, _, port = address.rpartition(":")
    return _store_class()(host, int(port), None, False, timedelta(seconds=timeout_s))


def for_torchrun(rank: int, world: int, timeout_s: float = 120.0):
    """The store of the job the user started under torchrun (see the module docstring)."""
    host, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500"))
    cls = _store_class()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return cls(host, port, world, False, timedelta(seconds=timeout_s))
    return cls(host, port, world, rank == 0, timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True)


class Channel:
    """JSON values under the run's prefix; ``get`` never blocks (None when the key is not there yet)."""

    def __init__(self, store, run: str = ""):
        self.store = store
        self.prefix = f"{PREFIX}{run}/" if run else PREFIX

    def put(self, key: str, value: Any) -> None:
        self.store.set(self.prefix + key, json.dumps(value, default=str))

    def get(self, key: str) -> Any:
        name = self.prefix + key
        if not self.store.check([name]):
            return None
        try:
            return json.loads(self.store.get(name))
        except ValueError:
            return None

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(self.prefix + key, amount))

    def first(self, key: str, value: int) -> int:
        """Sets ``key`` to ``value`` unless a value is there already; returns the value that stands (the first
        writer's: every caller agrees on it)."""
        name = self.prefix + key
        current = self.store.compare_set(name, "", str(value))
        try:
            return int(current)
        except ValueError:
            return value
