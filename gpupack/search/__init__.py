"""Search as you pack (``search=optuna``): an Optuna study whose trials the free slots of streaming lanes ask for.
Optuna is imported inside functions only: a run that searches nothing never imports it."""
