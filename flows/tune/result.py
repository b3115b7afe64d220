"""``sweepflow.tune.result``: the names of the result keys Ray Tune gives constants for (``ray.tune.result``), for
the keys a sweepflow result carries or a script passes as a metric name (``metric=MEAN_ACCURACY``,
``stop={TRAINING_ITERATION: 10}``, ``result[SHOULD_CHECKPOINT] = True`` in a callback).

Which keys a result carries: every report has ``training_iteration`` (counted by the sweep); a class trainable's
also ``time_this_iter_s`` and ``time_total_s``, and the schedulers see ``time_total_s`` for every trial; a
callback's ``on_trial_result`` also gets ``trial_id``, ``experiment_tag``, ``timestamp`` and ``done``. The rest are
metric names Ray's examples report and tune by. Ray's host and process fields are refused (results carry none).

Loads without Prefect or MLflow: a trainable imports it on the workers.
"""

from __future__ import annotations

from sweepflow.tune.not_built import refusing

# Counted by the sweep, on every report (a trial resumed from its checkpoint counts on from there).
TRAINING_ITERATION = "training_iteration"
# Seconds the trial has trained (a class trainable reports it; schedulers see it for every trial).
TIME_TOTAL_S = "time_total_s"
# Seconds a class trainable's last step took.
TIME_THIS_ITER_S = "time_this_iter_s"
# A step's result that says the trial is finished (a class trainable stops there); False in callbacks' results.
DONE = "done"
# In a class trainable's step result, or set by a callback's on_trial_result: checkpoint the trial at this report.
SHOULD_CHECKPOINT = "should_checkpoint"
# What a callback's on_trial_result also gets: the trial's id, its tag (number and searched values), when.
TRIAL_ID = "trial_id"
EXPERIMENT_TAG = "experiment_tag"
TIMESTAMP = "timestamp"

# Metric names Ray's examples report and tune by (metric=..., stop=..., a scheduler's time_attr).
MEAN_ACCURACY = "mean_accuracy"
MEAN_LOSS = "mean_loss"
EPISODE_REWARD_MEAN = "episode_reward_mean"
TIMESTEPS_TOTAL = "timesteps_total"

__all__ = [
    "DONE",
    "EPISODE_REWARD_MEAN",
    "EXPERIMENT_TAG",
    "MEAN_ACCURACY",
    "MEAN_LOSS",
    "SHOULD_CHECKPOINT",
    "TIMESTAMP",
    "TIMESTEPS_TOTAL",
    "TIME_THIS_ITER_S",
    "TIME_TOTAL_S",
    "TRAINING_ITERATION",
    "TRIAL_ID",
]

__getattr__ = refusing(__name__)  # Ray names not built here: refused with the reason and the fix
