"""prepare: build every game once and store it (games.pt + meta.json).

chain[m]: the derived two-player gadget (games.chain_game) and chain_int[m] = 2m·chain[m] (integer
payoffs: fictitious play, which only compares cumulative utilities, runs on them so that its ties are
exact — float sums of 1/(2m)-multiples round differently and would break ties arbitrarily), staircase[m]: the card's pre-check staircase, random[seed][m]:
i.i.d. uniform identical-interest games of the chain's size 2m+2, box[N]: the N-player snake-in-the-box
game (integer payoffs) with its path, gray[N]: the N-player reflected-Gray-code snake (the previous,
shortcut construction) as an integer tensor with its path.
"""
from __future__ import annotations

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from stages.common.config import Seeds, StageConfig, unique_items
from stages.common.paths import write_json
from stages.common.runner import StageContext
from stages.ftrl_potential.exact_fp import integer_payoffs
from stages.ftrl_potential.games import (box_snake_game, chain_game, load_snakes, multi_chain_game, pure_nash,
                                         random_game, snake_path, staircase_game)


class Config(StageConfig):
    ms: list[int] = Field(default=[2, 3, 4, 5, 6], min_length=3, description="chain sizes m (>= 2, increasing)")
    fixed_eps_ms: list[int] = Field(default=[2, 3, 4, 5, 6, 7, 8], min_length=3,
                                    description="sizes for the fixed-ε (upper bound) experiment")
    eps_sweep_ms: list[int] = Field(default=[2, 3, 4, 5, 6, 7, 8], min_length=3,
                                    description="sizes maximised over in the ε sweep")
    fp_exact_ms: list[int] = Field(default=[2, 3, 4, 5, 6, 7, 8], min_length=3,
                                   description="chain sizes for exact (event-driven) fictitious play")
    pad: int | None = Field(None, ge=0, le=64, description="padding actions per player (None: m + 2)")
    random_game_seeds: Seeds = Field(default=[0, 1, 2], description="one random game per seed and size")
    multi_players: list[int] = Field(default=[3, 4, 5, 6], min_length=3, description="player counts N")

    @field_validator("ms", "fixed_eps_ms", "eps_sweep_ms", "fp_exact_ms", "multi_players")
    @classmethod
    def _sizes(cls, v, info):
        unique_items(v, info.field_name)
        lo = 2
        if any(m < lo or m > 24 for m in v):
            raise ValueError(f"{info.field_name}: every game size must be >= 2 and <= 24, i.e. in [2, 24]")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"{info.field_name}: sizes must be strictly increasing")
        return v

    @field_validator("random_game_seeds")
    @classmethod
    def _seeds(cls, v):
        return unique_items(v, "random_game_seeds")

    @model_validator(mode="after")
    def _multi_size(self):
        have = sorted(load_snakes())
        missing = [n for n in self.multi_players if n not in have]
        if missing:
            raise ValueError(f"multi_players: no stored snake-in-the-box for N = {missing[0]} "
                             f"(stages/ftrl_potential/snakes.json has N in {have})")
        return self


def run(cfg: Config, ctx: StageContext) -> None:
    sizes = sorted(set(cfg.ms) | set(cfg.fixed_eps_ms) | set(cfg.eps_sweep_ms) | set(cfg.fp_exact_ms))
    chain = {m: chain_game(m, cfg.pad) for m in sizes}
    for m, A in chain.items():  # the construction's defining property, checked on every game
        ne = pure_nash(A)
        if ne != [(m - 1, m - 1)]:
            raise RuntimeError(f"prepare@ftrl_potential: chain_game({m}) has pure NE {ne}, expected [({m-1}, {m-1})]")
    snakes = load_snakes()
    games = {
        "chain": chain,
        "chain_int": {m: torch.from_numpy(integer_payoffs(chain[m].numpy(), 2 * m)) for m in sizes},
        "staircase": {m: staircase_game(m) for m in cfg.ms},
        "random": {s: {m: random_game(chain[m].shape[0], np.random.default_rng([s, m])) for m in sizes}
                   for s in cfg.random_game_seeds},
        "box": {N: {"T": torch.from_numpy(box_snake_game(N, snakes[N])), "path": snakes[N]} for N in cfg.multi_players},
        "gray": {N: {"T": torch.from_numpy(integer_payoffs(multi_chain_game(N, 2).numpy(), 2 ** N)),
                     "path": snake_path(N, 2)} for N in cfg.multi_players},
    }
    torch.save(games, ctx.out / "games.pt")
    write_json(ctx.out / "meta.json", {"ms": cfg.ms, "fixed_eps_ms": cfg.fixed_eps_ms, "eps_sweep_ms": cfg.eps_sweep_ms,
                                       "fp_exact_ms": cfg.fp_exact_ms, "sizes": sizes, "pad": cfg.pad,
                                       "random_game_seeds": cfg.random_game_seeds,
                                       "multi_players": cfg.multi_players,
                                       "box_path_lengths": {str(N): len(snakes[N]) for N in cfg.multi_players},
                                       "n_actions": {str(m): int(chain[m].shape[0]) for m in sizes}})
