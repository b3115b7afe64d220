"""The pipeline's ``scheduler`` section: one typed section per early-stopping scheduler, chosen by
``scheduler.type`` (a pydantic tagged union; no type means ASHA), each building the Tune face's class."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from sweepflow.flows.section import Section as _Section
from sweepflow.tasks.sweep.hyperband import HyperBandScheduler
from sweepflow.tasks.sweep.pbt import PopulationBasedTraining, mutations_from_spec
from sweepflow.tasks.sweep.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule, TrialScheduler

__all__ = [
    "SCHEDULER_SECTIONS",
    "SCHEDULER_TYPES",
    "AshaSettings",
    "FifoSettings",
    "HyperBandSettings",
    "MedianStoppingSettings",
    "PbtSettings",
    "SchedulerSettings",
]


class _Scheduled(_Section):
    """What every early-stopping scheduler reads: the reported metric it compares trials by, and its direction.
    Trials report once per epoch; the schedulers count reports (Ray's ``time_attr="training_iteration"``)."""

    metric: str = Field("val_loss", description="A metric the training function reports every epoch")
    mode: Literal["min", "max"] = Field("min", description="Whether a lower or higher metric is better")

    def max_reports(self, epochs: int) -> int:
        """Reports a trial makes at most: the epochs unless the scheduler caps them."""
        return epochs

    def build(self) -> TrialScheduler:  # pragma: no cover - every scheduler section overrides it
        raise NotImplementedError

    @model_validator(mode="after")
    def _valid(self) -> _Scheduled:
        try:  # the scheduler's own checks (Ray's argument rules), before any trial runs
            self.build()
        except TypeError as exc:  # pydantic reports ValueErrors only
            raise ValueError(str(exc)) from None
        return self


class FifoSettings(_Section):
    """No early stopping: every trial trains all its epochs (Ray's ``FIFOScheduler``)."""

    type: Literal["fifo"] = "fifo"

    metric: ClassVar[None] = None

    def max_reports(self, epochs: int) -> int:
        return epochs

    def build(self) -> TrialScheduler:
        return FIFOScheduler()


class AshaSettings(_Scheduled):
    """Asynchronous successive halving (Ray's ``ASHAScheduler``): at each rung (grace_period x
    reduction_factor^k reports) a trial continues only if it is in the top 1/reduction_factor so far."""

    type: Literal["asha"] = "asha"
    max_t: int = Field(4, ge=1, description="Max reports (epochs) per trial")
    grace_period: int = Field(1, ge=1, description="Reports before a trial can be stopped")
    reduction_factor: float = Field(2, gt=1, description="Keep the top 1/reduction_factor at each rung")
    brackets: int = Field(
        1, ge=1, description="Brackets (Ray's asynchronous HyperBand): bracket s's first rung is at grace_period x "
        "reduction_factor^s; trials are dealt to brackets at random (softmax of their rung counts)",
    )

    def max_reports(self, epochs: int) -> int:
        return self.max_t

    def build(self) -> TrialScheduler:
        return ASHAScheduler(
            metric=self.metric, mode=self.mode, max_t=self.max_t,
            grace_period=self.grace_period, reduction_factor=self.reduction_factor, brackets=self.brackets,
        )


class HyperBandSettings(_Scheduled):
    """Synchronous HyperBand (Ray's ``HyperBandScheduler``): trials fill brackets; at each milestone a bracket
    pauses its trials, keeps the best 1/reduction_factor and resumes them from their checkpoints. The training
    function must resume from ``get_checkpoint()``."""

    type: Literal["hyperband"] = "hyperband"
    max_t: int = Field(4, ge=1, description="Max reports (epochs) per trial")
    reduction_factor: float = Field(3, gt=1, description="Keep the best 1/reduction_factor at each milestone")

    def max_reports(self, epochs: int) -> int:
        return self.max_t

    def build(self) -> TrialScheduler:
        return HyperBandScheduler(
            metric=self.metric, mode=self.mode, max_t=self.max_t, reduction_factor=self.reduction_factor
        )


class MedianStoppingSettings(_Scheduled):
    """The median stopping rule (Ray's ``MedianStoppingRule``): after grace_period reports, a trial whose best
    metric is worse than the median of the other trials' running means at the same report is stopped."""

    type: Literal["median_stopping"] = "median_stopping"
    grace_period: int = Field(1, ge=0, description="Reports before a trial can be stopped")
    min_samples_required: int = Field(3, ge=1, description="Other trials needed at a report to compare with")

    def build(self) -> TrialScheduler:
        return MedianStoppingRule(
            metric=self.metric, mode=self.mode, grace_period=self.grace_period,
            min_samples_required=self.min_samples_required,
        )


class PbtSettings(_Scheduled):
    """Population based training (Ray's ``PopulationBasedTraining``): every perturbation_interval reports, a
    trial in the bottom quantile copies a top trial's checkpoint and config, then perturbs hyperparam_mutations.
    The training function must resume from ``get_checkpoint()`` (the built-in one does)."""

    type: Literal["pbt"] = "pbt"
    perturbation_interval: int = Field(2, ge=1, description="Reports between perturbations")
    burn_in_period: int = Field(0, ge=0, description="Reports before the first perturbation")
    hyperparam_mutations: dict[str, Any] = Field(
        description="name -> a list of values or a search-space spec ({type: loguniform, low:, high:}), or a "
        "dict of those for a nested config; resampled or perturbed (x perturbation_factors) on exploit",
    )
    quantile_fraction: float = Field(
        0.25, ge=0, le=0.5, description="Bottom share that copies the top share at each perturbation"
    )
    resample_probability: float = Field(
        0.25, ge=0, le=1, description="Chance a mutated value is resampled instead of perturbed"
    )
    perturbation_factors: tuple[float, ...] = Field(
        (1.2, 0.8), description="Factors a continuous value is multiplied by when perturbed"
    )
    synch: bool = Field(False, description="Perturb all trials together once each reached the interval")

    def build(self) -> TrialScheduler:
        return PopulationBasedTraining(
            time_attr="training_iteration", metric=self.metric, mode=self.mode,
            perturbation_interval=self.perturbation_interval, burn_in_period=self.burn_in_period,
            hyperparam_mutations=mutations_from_spec(self.hyperparam_mutations),
            quantile_fraction=self.quantile_fraction, resample_probability=self.resample_probability,
            perturbation_factors=self.perturbation_factors, synch=self.synch,
        )


def _scheduler_type(value: Any) -> str:
    # No `type` key means ASHA, the default (a file may set only its metric and max_t).
    found = value.get("type", "asha") if isinstance(value, Mapping) else getattr(value, "type", "asha")
    return found if found in SCHEDULER_TYPES else "unknown"


#: The early-stopping schedulers a pipeline names by ``scheduler.type``: the Tune face's classes
#: (sweepflow.tune.schedulers), built from these typed sections.
SCHEDULER_TYPES = ("asha", "fifo", "hyperband", "median_stopping", "pbt")

SCHEDULER_SECTIONS = {
    "asha": AshaSettings, "fifo": FifoSettings, "hyperband": HyperBandSettings,
    "median_stopping": MedianStoppingSettings, "pbt": PbtSettings,
}

SchedulerSettings = Annotated[
    Annotated[AshaSettings, Tag("asha")]
    | Annotated[FifoSettings, Tag("fifo")]
    | Annotated[HyperBandSettings, Tag("hyperband")]
    | Annotated[MedianStoppingSettings, Tag("median_stopping")]
    | Annotated[PbtSettings, Tag("pbt")],
    Discriminator(_scheduler_type, custom_error_type="scheduler_type",
                  custom_error_message=f"scheduler.type must be one of {', '.join(SCHEDULER_TYPES)}"),
]
