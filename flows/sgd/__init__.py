"""Ray SGD's legacy APIs on sweepflow's ddp_runtime (``sweepflow.sgd.pytorch``: ``PyTorchTrainer``,
``PyTorchTrainable``): scripts written for ``ray.experimental.sgd`` / ``ray.util.sgd`` change only their imports."""
