"""What a run config calibrates an organisation's releases to: the builder's config, its releases, its noise bound.

The ClientApp builds under these; the ServerApp holds every artifact's noise
claims to the bound they imply (:mod:`synapse_flwr.core.noise_claims`).
"""

from __future__ import annotations

from dataclasses import replace

from synapse_flwr.core.builder import BuildConfig, calibrated
from synapse_flwr.core.noise_claims import NoiseBound
from synapse_flwr.core.votes import VOTE_SHARE, vote_sensitivity
from synapse_flwr.flower.config import RunConfig


def planned_releases(cfg: RunConfig) -> int:
    """Releases a record's budget covers: one per round with replay on (its replays count as it), else one."""
    return cfg.num_rounds if cfg.replay else 1


def build_config(cfg: RunConfig) -> BuildConfig:
    """The builder's config for this run: part of each record's budget kept for its fusion vote when the run votes."""
    return BuildConfig(vote_share=VOTE_SHARE if cfg.votes else 0.0)


def noise_bound(cfg: RunConfig) -> NoiseBound:
    """The noise an honest organisation's artifact may claim in this run.

    One window's ``sigma`` is taken both without and with the vote share kept
    (the larger): a resumed run may switch votes on or off, leaving windows of
    both in a cache. The windows are the run's ``max-windows``.

    Parameters
    ----------
    cfg : RunConfig
        The run config (``epsilon``, ``delta``, ``num-rounds`` with ``replay``,
        ``embedder``, ``max-windows``).

    Returns
    -------
    NoiseBound
        The bound :func:`~synapse_flwr.core.noise_claims.noise_claim_problem` checks.
    """
    calibrations = [calibrated(replace(build_config(cfg), vote_share=share), cfg.epsilon, cfg.delta,
                               planned_releases(cfg), cfg.embedder != "none") for share in (0.0, VOTE_SHARE)]
    (_, params, low), (_, _, high) = calibrations
    return NoiseBound((low.sigma, high.sigma), params.prototype_weight, high.vote_multiplier * vote_sensitivity(),
                      cfg.max_windows)
