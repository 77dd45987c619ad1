"""What a measuring policy is: the recorder's shell (``recorder.py``) calls these at the events it handles
itself; the policy installs the patches it needs and measures at each event. Two exist, chosen once from the
recorder's ``mode``: :class:`~nnwizard.record.full.FullPolicy` (diagnosis: every step, forward and loss call
recorded, the graph mode, small copies) and :class:`~nnwizard.record.light.LightPolicy` (watch: bounded
memory and a few percent of a step at most), each with its own schedule constants."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from nnwizard.record.recorder import Recorder
    from nnwizard.record.records import ModelInfo, OptimizerInfo


class Policy:
    name = ""
    step_s = 0.0                     # the running mean of a step's wall time (light mode measures it)
    grad_norms: tuple | None = None  # (parameters, per-tensor gradient norms) of the step being measured (light)

    def __init__(self, recorder: "Recorder"):
        self.recorder = recorder

    def install(self) -> None:
        """Install the patches and hooks (``Recorder.patch`` / ``on_exit`` undo them)."""

    def uninstall(self) -> None:
        """Before the patches are undone."""

    def finish(self) -> None:
        """The recording ends: close what is open, hold no tensor of the run."""

    def cadence(self, groups: list[dict]) -> tuple[int, int]:
        """An optimizer's detail cadence from its param groups: (first steps measured in detail, then every n-th)."""
        return (0, 1)

    def model_seen(self, info: "ModelInfo", inner, frame) -> None:
        """A model was registered at its first top-level call (``inner``: the model a wrapper runs; ``frame``:
        the frame that called it)."""

    def optimizer_seen(self, info: "OptimizerInfo") -> None:
        """An optimizer was recorded (at construction or at its first step) while installed."""

    def optimizer_built(self, info: "OptimizerInfo") -> None:
        """The optimizer ``info`` was just constructed (``Optimizer.__init__``)."""

    def scheduler_stepped(self, entry: dict) -> None:
        """A scheduler stepped (``entry`` of ``Recording.schedulers``)."""
