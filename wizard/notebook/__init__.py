"""Jupyter notebooks: ``--script train.ipynb`` runs the code cells as a kernel would (``cells``, ``shell``), and
``%load_ext nnwizard`` gives ``%%nnwizard_watch`` and ``%nnwizard_diagnose`` inside IPython (``magics``)."""
