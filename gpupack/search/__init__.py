"""Search as you pack (``search=optuna``): an Optuna study whose trials the free slots of streaming lanes ask for.

:mod:`gpupack.search.space` reads the search space (Hydra's override grammar), :mod:`gpupack.search.options` the
``search.*`` options, and :mod:`gpupack.search.study` keeps the study in the run directory as an append-only journal.
Optuna is imported inside functions only: a run that searches nothing never imports it.
"""
