"""``ddp_runtime.huggingface``: Hugging Face integrations, as Ray's ``ray.train.huggingface``.

``ddp_runtime.huggingface.transformers``: ``RayTrainReportCallback`` and ``prepare_trainer`` for a
``transformers.Trainer`` inside a ``TorchTrainer`` rank (the ``transformers`` extra).
"""
