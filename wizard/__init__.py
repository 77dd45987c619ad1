"""nnwizard: a guided troubleshooting wizard for PyTorch training runs."""

__version__ = "0.1.0"


def watch(model=None, optimizer=None, out="nnwizard-watch", on_anomaly="continue", **options):
    """``with nnwizard.watch(model, optimizer, out="nnwizard-watch", on_anomaly="continue"):`` around the
    user's own loop (CONTRACT §7); see :func:`nnwizard.watcher.watch` for the options."""
    from nnwizard.watcher import Watch

    return Watch(model, optimizer, out, on_anomaly, **options)
