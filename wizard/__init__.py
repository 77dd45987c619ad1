"""nnwizard: a guided troubleshooting wizard for PyTorch training runs."""

__version__ = "0.2.0"


def watch(model=None, optimizer=None, out="nnwizard-watch", on_anomaly="continue", **options):
    """``with nnwizard.watch(model, optimizer, out="nnwizard-watch", on_anomaly="continue"):`` around the
    user's own loop (CONTRACT §7); see :func:`nnwizard.watcher.watch` for the options."""
    from nnwizard.watcher import Watch

    return Watch(model, optimizer, out, on_anomaly, **options)


def diagnose(script=None, args=None, **options):
    """``nnwizard.diagnose(script="train.py", args=[...], symptoms=["auto"])`` (or ``module=``): the diagnosis the
    ``diagnose`` command runs, as a report object (``.verdict``, ``.hypotheses``, ``.to_dict()``); see
    :func:`nnwizard.api.diagnose` for the options."""
    from nnwizard.api import diagnose as _diagnose

    return _diagnose(script, args, **options)


def load_ipython_extension(ipython):
    """``%load_ext nnwizard``: ``%%nnwizard_watch`` and ``%nnwizard_diagnose`` (nnwizard.notebook.magics)."""
    from nnwizard.notebook.magics import load

    load(ipython)
