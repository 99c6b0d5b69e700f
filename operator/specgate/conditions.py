"""Kubernetes-style conditions derived from the phase (pure).

Available/Progressing/Degraded follow the Kubebuilder vocabulary and Ready/Reconciling/Stalled follow
kstatus, so `kubectl wait`, Flux health checks and Argo CD all read the same status.
"""

from __future__ import annotations

from specgate.api import Condition, Phase

_IN_PROGRESS = {
    Phase.PENDING,
    Phase.BASELINE,
    Phase.CANARY,
    Phase.ANALYZING,
    Phase.PROMOTING,
    Phase.ROLLING_BACK,
}
# Stalled: nothing more happens without a person (a spec change, spec.rollout.retry, or unpausing).
_STALLED = {Phase.FAILED, Phase.PAUSED, Phase.ROLLED_BACK}
# Every type conditions_for sets (the operator's metrics drop a deleted object's series by them).
TYPES = ("Available", "Progressing", "Degraded", "Ready", "Reconciling", "Stalled")
# True while reconciles keep raising the same exception (handlers.reconcile); False once one succeeds.
RECONCILE_ERROR = "ReconcileError"


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of new.type, keeping lastTransitionTime when the status did not change."""
    old = next((c for c in conditions if c.type == new.type), None)
    if old is not None and old.status == new.status:
        new = new.model_copy(update={"last_transition_time": old.last_transition_time})
    return [c for c in conditions if c.type != new.type] + [new]


def _truth(flag: bool) -> str:
    return "True" if flag else "False"


def conditions_for(
    conditions: list[Condition],
    phase: Phase,
    reason: str,
    message: str,
    generation: int,
    now: str,
    degraded: bool = False,
) -> list[Condition]:
    """Every condition type for the phase; `degraded` adds Degraded in any phase (a blind guard).

    RolledBack still serves (Available) but is Degraded, not Ready and Stalled: a GitOps tool
    should show the change that was pushed as not taking effect.
    """
    in_progress = phase in _IN_PROGRESS
    flags = {
        "Available": phase in (Phase.PROMOTED, Phase.ROLLED_BACK),
        "Progressing": in_progress,
        "Degraded": degraded or phase in (Phase.ROLLED_BACK, Phase.ROLLING_BACK, Phase.FAILED),
        "Ready": phase == Phase.PROMOTED,
        "Reconciling": in_progress,
        "Stalled": phase in _STALLED,
    }
    for kind, flag in flags.items():
        cond = Condition(
            type=kind,
            status=_truth(flag),
            reason=reason,
            message=message,
            last_transition_time=now,
            observed_generation=generation,
        )
        conditions = set_condition(conditions, cond)
    return conditions


def reconcile_failing(
    conditions: list[Condition], error: str, count: int, generation: int, now: str
) -> list[Condition]:
    """ReconcileError True: the last `count` reconciles raised `error` (the exception's type and
    message). The phase's conditions stay as the last successful reconcile left them: nothing moved."""
    message = (
        f"the last {count} reconciles raised the same error, so the rollout does not advance (the "
        f"status above is the last one written): {error}"
    )
    failing = Condition(
        type=RECONCILE_ERROR,
        status="True",
        reason=RECONCILE_ERROR,
        message=message[:1024],
        last_transition_time=now,
        observed_generation=generation,
    )
    return set_condition(conditions, failing)


def reconcile_succeeded(conditions: list[Condition], generation: int, now: str) -> list[Condition]:
    """ReconcileError False once a reconcile succeeds; nothing added where it never failed."""
    if not any(c.type == RECONCILE_ERROR and c.status == "True" for c in conditions):
        return conditions
    recovered = Condition(
        type=RECONCILE_ERROR,
        status="False",
        reason="Reconciled",
        message="the last reconcile succeeded",
        last_transition_time=now,
        observed_generation=generation,
    )
    return set_condition(conditions, recovered)
