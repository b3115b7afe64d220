"""``sweepflow.sgd.torch`` (Ray's ``ray.util.sgd.torch``): ``is_distributed_trainable`` and
``distributed_checkpoint_dir`` for DDP trials (see ``sweepflow.sgd.integration.torch.DistributedTrainableCreator``)."""

from sweepflow.tune._internal.trainable import DistributedTrainableCreator
from sweepflow.tune.session import distributed_checkpoint_dir, is_distributed_trainable

__all__ = ["DistributedTrainableCreator", "distributed_checkpoint_dir", "is_distributed_trainable"]
