"""Gate verdicts and their statistics (pure), one module per concern:

- common: Verdict, GateResult, AcceptanceWindow and the spread estimators the others share;
- acceptance: the acceptance gate (an SPRT on traffic, a fixed-sample test for a benchmark), its
  interval and the deadline rule;
- breakeven: the acceptance gate at the cost model's break-even alpha (minAcceptanceRatePolicy
  BreakEven);
- drift: the traffic mix's drift and a steady history's design effect;
- guard: the CUSUM that watches alpha after promotion;
- latency: histograms and the quantile gates;
- load: whether two tracks carried comparable load;
- speedup: the canary's mean time per output token against the baseline's (an SPRT on paired
  windows).

The public names are re-exported here, so callers write `gates.latency_gate(...)`; a private
helper is imported from its module.
"""

from specgate.gates.acceptance import (
    MIN_ACCEPTANCE_WINDOW_SECONDS,
    MIN_WINDOWS,
    OVERSHOOT,
    SPREAD_ERROR_SHARE,
    TIGHTEST_AT_WINDOWS,
    acceptance_gate,
    acceptance_interval,
    confidence_radius,
    decide_at_deadline,
    fixed_sample_acceptance_gate,
    mean_variance,
    residual_variance,
    span_seconds,
    spec_acceptance_gate,
    sprt_bounds,
    sprt_log_lr,
    sprt_step_sd,
    wald_bounds,
)
from specgate.gates.breakeven import BreakEvenGate, break_even_gate
from specgate.gates.common import (
    HAC_LAGS,
    AcceptanceWindow,
    GateResult,
    Verdict,
    autocovariances,
    binomial_variance,
    centred,
    judged_windows,
    long_run_variance,
    plug_in_spread,
    student_t_quantile,
    variance_upper_bound,
    worst,
)
from specgate.gates.drift import (
    DRIFT_BLOCK_SECONDS,
    DRIFT_MAX_LAG_SECONDS,
    DRIFT_MIN_LAG_BLOCKS,
    DRIFT_SIGNIFICANCE,
    DRIFT_TIMESCALES,
    MIN_DESIGN_WINDOWS,
    MIN_DRIFT_HISTORY_SECONDS,
    MIN_DRIFT_SD,
    NO_DRIFT,
    MixDrift,
    drift_from_history,
    fallback_drift,
    history_design_effect,
    measure_mix_drift,
    mix_drift_variance,
)
from specgate.gates.guard import (
    GUARD_MARGIN,
    MAX_AUTOCORRELATION,
    MAX_GUARD_LAGS,
    MAX_PREWHITENING,
    MIN_GUARD_BLOCKS,
    MIN_GUARD_REFERENCE_BLOCKS,
    MONTH_SECONDS,
    GuardResult,
    acceptance_guard,
    drift_spread,
    guard_spread,
    guard_threshold,
    prewhitened_long_run_variance,
)
from specgate.gates.latency import (
    STALL_FIGURE,
    Histogram,
    cdf,
    histogram_quantile,
    latency_gate,
    per_step,
    stall_samples,
    step_stall_gate,
)
from specgate.gates.load import (
    Load,
    comparable_load,
)
from specgate.gates.speedup import (
    SPEEDUP_INDIFFERENCE,
    PerTokenWindow,
    decide_speedup_at_deadline,
    speedup_gate,
)

__all__ = [
    "DRIFT_BLOCK_SECONDS",
    "DRIFT_MAX_LAG_SECONDS",
    "DRIFT_MIN_LAG_BLOCKS",
    "DRIFT_SIGNIFICANCE",
    "DRIFT_TIMESCALES",
    "GUARD_MARGIN",
    "HAC_LAGS",
    "MAX_AUTOCORRELATION",
    "MAX_GUARD_LAGS",
    "MAX_PREWHITENING",
    "MIN_ACCEPTANCE_WINDOW_SECONDS",
    "MIN_DESIGN_WINDOWS",
    "MIN_DRIFT_HISTORY_SECONDS",
    "MIN_DRIFT_SD",
    "MIN_GUARD_BLOCKS",
    "MIN_GUARD_REFERENCE_BLOCKS",
    "MIN_WINDOWS",
    "MONTH_SECONDS",
    "NO_DRIFT",
    "OVERSHOOT",
    "SPEEDUP_INDIFFERENCE",
    "SPREAD_ERROR_SHARE",
    "STALL_FIGURE",
    "TIGHTEST_AT_WINDOWS",
    "AcceptanceWindow",
    "BreakEvenGate",
    "GateResult",
    "GuardResult",
    "Histogram",
    "Load",
    "MixDrift",
    "PerTokenWindow",
    "Verdict",
    "acceptance_gate",
    "acceptance_guard",
    "acceptance_interval",
    "autocovariances",
    "binomial_variance",
    "break_even_gate",
    "cdf",
    "centred",
    "comparable_load",
    "confidence_radius",
    "decide_at_deadline",
    "decide_speedup_at_deadline",
    "drift_from_history",
    "drift_spread",
    "fallback_drift",
    "fixed_sample_acceptance_gate",
    "guard_spread",
    "guard_threshold",
    "histogram_quantile",
    "history_design_effect",
    "judged_windows",
    "latency_gate",
    "long_run_variance",
    "mean_variance",
    "measure_mix_drift",
    "mix_drift_variance",
    "per_step",
    "plug_in_spread",
    "prewhitened_long_run_variance",
    "residual_variance",
    "span_seconds",
    "spec_acceptance_gate",
    "speedup_gate",
    "sprt_bounds",
    "sprt_log_lr",
    "sprt_step_sd",
    "stall_samples",
    "step_stall_gate",
    "student_t_quantile",
    "variance_upper_bound",
    "wald_bounds",
    "worst",
]
