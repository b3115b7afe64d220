"""``sweepflow.sgd.integration.torch`` (Ray's ``ray.util.sgd.integration.torch``): ``DistributedTrainableCreator``
and the helpers a DDP trainable uses."""

from sweepflow.tune.session import distributed_checkpoint_dir, is_distributed_trainable
from sweepflow.tune.trainable import DistributedTrainableCreator

__all__ = ["DistributedTrainableCreator", "distributed_checkpoint_dir", "is_distributed_trainable"]
