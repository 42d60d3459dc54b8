"""The scheduler's knobs, in a module of their own so that the router's settings can import them without
the scheduler (numpy, the chain step, the planner thread)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SchedulerSettings(BaseModel):
    """Every knob of the scheduler; the defaults are the ones measured best on the demo pool."""

    windows: list[int] = Field(default_factory=lambda: list(range(1, 9)))  # draft windows considered
    # longer windows the lookup's chains also consider: its drafts cost nothing, and where the text repeats
    # itself its copies run long (within the workers' longest proposal, 16 tokens, at every level; 15 so
    # that the target's pass, 16 tokens, stays in the profiler's exact buckets)
    lookup_windows: list[int] = Field(default_factory=lambda: [12, 15])
    max_levels: int = 4                 # longest chain considered (the pool's permutations grow fast)
    growing_chains: bool = True         # only chains whose models grow in size towards the target (False:
                                        # the pool's models in every order)
    recompute_s: float = 0.25           # a batch composition's ranking is at most this old
    plan_max_age_s: float = Field(1.0, gt=0.0)   # ... when in use; one older, of a replaced snapshot, is not
    #                                     served: a composition asked for again after a while is replanned
    planner_thread: bool | None = None  # plan in a background thread (True) or on the cycle's thread as a
                                        # decision finds its plan stale (False); None: a thread where the
                                        # models run in worker processes, the cycle's thread where the
                                        # router holds them (a planning thread there slows every pass)
    inline_planning_share: float = Field(0.01, ge=0.0, le=1.0)   # without the planner thread: past this share
                                        # of the router's time spent making plans on the cycle's path (over
                                        # about the last second), a decision takes the nearest plan of its
                                        # batch's composition and a stale plan stands, until the share falls
                                        # back (0: plan inline only what has no plan of its composition)
    over_budget_reach: int = Field(2, ge=0)   # ... a plan at most this many shift steps away (of prompt and
                                        # record, in sum); a shift farther from every plan is planned anyway
    planner_nice: int = Field(10, ge=0, le=19)   # niceness of the planner thread (Linux): it plans in the
                                        # cores' idle time, not in the workers' (0: as the router)
    decision_cycles: int = Field(4, ge=1)   # a batch's decision stands for up to this many cycles while its
                                        # rows, their lookup matches and the chain they named stay the same
                                        # (1: decide every cycle)
    hysteresis: float = 0.03            # change window only when the best is predicted this much faster
    chain_hysteresis: float = 0.10      # change chain only when the best is predicted this much faster
    switch_horizon_cycles: int = 16     # catch-up cost of a switch is spread over this many cycles at most
    explore_after_s: float = 10.0       # a pair unmeasured this long gets an exploration cycle
    explore_every_cycles: int = 50      # at most one exploration cycle per this many cycles (all batches)
    explore_extra_window: int = 1       # exploration drafts this much deeper than the chain's best window
    explore_gap: float = 0.10           # a pair whose best chain is predicted g slower than the best waits
                                        # explore_after_s * g / explore_gap (0: every pair explore_after_s)
    explore_after_max_s: float = 120.0  # ... but never longer than this
    explore_patience: float = Field(2.0, ge=1.0)  # an overdue pair waits for a batch its chain runs without
                                        # catch-up (its models saw every row's tokens: at batch 1, a request's
                                        # first cycle) until it is this many times its wait overdue
    prior_weight: float = 16.0          # pseudo-checks of the similarity prior in a position's rate
    recent_cycles: float = 50.0         # a pair's measurements fade from its estimate over this many
                                        # reports of the pool run without it (acceptance.RecentReports)
    default_acceptance: float = 0.5     # prior of a pair with no similarity at all
    lookup_prior: float = Field(0.3, ge=0.0, le=1.0)   # prior of a model-free level's proposals (the lookup's:
                                        # no distribution, so no similarity to calibrate one from)
    overhead_alpha: float = 0.05        # EMA constant of the router's own per-call and per-cycle costs
    batch_odds_step: float = 0.25       # a batch's own acceptance shifts its plan in steps of this log-odds
    batch_odds_down: float = 1.5        # ... down by this much at most (0: never)
    batch_odds_up: float = 0.5          # ... up by this much at most (a lucky streak regresses to the mean)
    row_prior_checks: float = 16.0      # pseudo-checks per row at the predicted rate in a batch's own rate
    row_memory: float = 0.9             # weight a row's acceptance record keeps a cycle (~10 cycles)
    prompt_positions: int = Field(128, ge=0)   # last prompt positions whose argmax next tokens the models
                                        # compare at prefill (0: rows are planned without their prompt)
    prompt_slope: float = Field(1.0, ge=0.0)   # a row's acceptance moves by this times its prompt agreement's
                                        # log-odds over the pool's (0: never)
    prompt_prior_positions: float = Field(128.0, ge=0.0)  # pseudo-positions at the recent rows' agreement in a row's
    prompt_recent_alpha: float = Field(0.05, gt=0.0, le=1.0)  # EMA constant per check of the recent rows' agreement
    prompt_odds_cap: float = Field(1.5, ge=0.0)  # ... and by at most this much either way
    text_slope: float = Field(1.0, ge=0.0)   # a pair's measured rates move by this times the log-odds between
                                        # the prompt agreement of the rows the pool runs now and of those
                                        # the pair ran (within prompt_odds_cap; 0: never)
    tail_weight: float = Field(1.0, ge=0.0)   # weight of the overshoot and the rows' finishing spread (0: T_eff only)
    batch_max_window: int = Field(6, ge=1)    # longest window for a batch of two rows or more, unless named
    context_alpha: float = 0.1          # EMA constant of forward times over the latency table's, per context length
    context_min_cycles: int = 5         # ... used once this many cycles measured it
    context_scale_range: tuple[float, float] = (0.5, 2.5)   # ... and kept within this range
    context_fade_alpha: float = 0.05    # a model's ratio over the target's fades towards 1 by this per cycle
                                        # it sits out
