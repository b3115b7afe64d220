"""``sweepflow.tune.search``: search algorithms (``sweepflow.tune.search.optuna.OptunaSearch``)."""
