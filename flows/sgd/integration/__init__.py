"""``sweepflow.sgd.integration`` (Ray's ``ray.util.sgd.integration``)."""
