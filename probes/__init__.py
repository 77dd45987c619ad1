"""nnwizard's probes: one module per family; see ``api`` for the contract every probe follows."""

from nnwizard.probes.api import (  # noqa: F401
    BarPlot,
    ImageGrid,
    LinePlot,
    ProbeContext,
    ProbeResult,
    ProbeSpec,
    Table,
    cannot_run,
    could_not_run,
    failed,
    get,
    load_all,
    passed,
    probe,
    skipped,
)
