"""``sweepflow.tune.integration``: Ray Tune's integrations with training libraries (``.ray_train``,
``.pytorch_lightning``, ``.keras``): module paths that import, their names refused with what to use instead."""
