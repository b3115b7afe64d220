"""``sweepflow.sgd.integration.torch`` (Ray's ``ray.util.sgd.integration.torch``): ``DistributedTrainableCreator``
and the helpers a DDP trainable uses."""

from sweepflow.tune._internal.trainable import DistributedTrainableCreator
from sweepflow.tune.session import distributed_checkpoint_dir, is_distributed_trainable

__all__ = ["DistributedTrainableCreator", "distributed_checkpoint_dir", "is_distributed_trainable"]
