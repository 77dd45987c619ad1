"""``nnwizard.record``: the one place that intercepts torch. The recorder watches a real PyTorch program
through torch's public hooks and a few patches and keeps a per-step trace of what the training loop actually
did (a :class:`Recording`); the tracers probes run on their own forward/backward passes (``OpTracer``,
``LossCalls``, ``trace_modules``, ``Reductions``) and the keeper of a step's model calls watch bundles
(``calls.CallKeeper``) live here too. See docs/architecture.md for the layout.

    from nnwizard.record import Recorder, StopRun
"""

from nnwizard.record.listeners import EVENTS, Listener, StepCalls, StopRun
from nnwizard.record.patches.losses import LOSS_FUNCTIONS
from nnwizard.record.frames import first_line, plain_text, user_frame
from nnwizard.record.recorder import Recorder
from nnwizard.record.records import (ClipCall, ForwardEvent, LoaderInfo, LossCall, ModelInfo, OptimizerInfo,
                                     RecordedError, Recording, SchedulerEvent, StepRecord, blank_step, inner_model)
from nnwizard.record.tensors import cpu_copy, fingerprint, nonfinite_inputs, tensors_in, total_norm

__all__ = [
    "EVENTS", "LOSS_FUNCTIONS", "ClipCall", "ForwardEvent", "Listener", "LoaderInfo", "LossCall", "ModelInfo",
    "OptimizerInfo", "RecordedError", "Recorder", "Recording", "SchedulerEvent", "StepCalls", "StepRecord", "StopRun",
    "blank_step", "cpu_copy", "fingerprint", "first_line", "inner_model", "nonfinite_inputs", "plain_text", "tensors_in",
    "total_norm", "user_frame",
]
