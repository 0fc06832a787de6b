"""The selector task's config: the (B, z) -> A wind tunnel's options and their checks."""

from __future__ import annotations

import math
from dataclasses import dataclass

from plateauscope.errors import ConfigError
from plateauscope.model.config import JsonConfig

DIRECTIONS: tuple[str, ...] = ("backward", "forward")
TARGET_UNIQUENESS: tuple[str, ...] = ("global", "group")
TAILS: tuple[str, ...] = ("random", "by_first_char")
ORDERS: tuple[str, ...] = ("bz", "zb")
SELECTORS: tuple[str, ...] = ("shared", "private")


@dataclass(frozen=True)
class TaskConfig(JsonConfig):
    """The (B, z) -> A wind tunnel."""

    n_b: int = 1000
    """Number of base strings B (groups)."""
    K: int = 10
    """Targets per base string; the selector z picks one of them. H(A | B) = log K."""
    b_len: int = 6
    """Characters in a base string B."""
    z_len: int = 2
    """Characters in a selector z (the K selectors are shared by all groups unless ``selectors`` says
    ``private``)."""
    a_len: int = 4
    """Characters in a target string A (1 or more)."""
    alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789"
    """The characters B, z and A are drawn from."""
    direction: str = "backward"
    """``backward``: (B, z) -> A, the paper's task. ``forward``: A -> B."""
    distinct_first_char: bool = True
    """The K targets of a group start with K different characters (as in the paper's code)."""
    seed: int = 0
    """Seed of the data set (strings and their pairing); independent of the training seed."""
    target_uniqueness: str = "global"
    """``global``: all D targets differ, so A -> B is a function (the paper). ``group``: only the K
    targets of a group differ (short A cannot be globally unique); the forward task refuses it."""
    tails: str = "random"
    """``random``: A[1:] drawn per target. ``by_first_char``: A[1:] is one fixed global function of A[0],
    so the tails cost 36 facts instead of D (needs ``distinct_first_char``)."""
    order: str = "bz"
    """``bz``: the prompt is B then z (the paper). ``zb``: z then B."""
    selectors: str = "shared"
    """``shared``: one set of K selectors for every group (the paper). ``private``: each group draws its
    own K selectors."""
    no_z: bool = False
    """The (B) -> A control: same groups and targets, no selector in the prompt. Its candidate loss
    cannot go below log K; the time its set loss takes to reach ~0 is the price of the marginal alone."""
    target_pool: int = 0
    """0: off. M > 0: every group draws its K targets (uniformly, distinct within the group) from one
    shared pool of M strings, so the global marginal of A is uniform over M strings: cheap to learn
    and worth log(V^a_len / M) nats of set loss. Needs ``target_uniqueness=group`` and
    ``distinct_first_char`` off (a group's draws may share a first character)."""
    first_char_zipf: float = 0.0
    """0: a target's first character is uniform over the alphabet. s > 0: it follows a Zipf law of
    exponent s over the alphabet in its own order (weight 1 / rank^s, the first character most
    frequent); a group's K first characters are a weighted draw without replacement. Needs
    ``distinct_first_char``."""

    @property
    def D(self) -> int:
        """Number of examples, n_b * K."""
        return self.n_b * self.K

    @property
    def log_k(self) -> float:
        """Plateau height per example: log K nats."""
        return math.log(self.K)

    @property
    def has_selector(self) -> bool:
        """Whether the prompt holds a selector z (the backward task without ``no_z``)."""
        return self.direction == "backward" and not self.no_z

    def run_label(self) -> str:
        """The task's part of a default run directory name: ``backward_K10_nb1000``."""
        return f"{self.direction}_K{self.K}_nb{self.n_b}"

    def variant_label(self) -> str:
        """The task variant options that differ from the paper's, e.g. ``a_len=1,order=zb`` (``default``)."""
        fields_ = ("a_len", "target_uniqueness", "tails", "order", "selectors", "no_z", "distinct_first_char",
                   "target_pool", "first_char_zipf")
        base = TaskConfig()
        diff = [f"{k}={getattr(self, k)}" for k in fields_ if getattr(self, k) != getattr(base, k)]
        return ",".join(diff) or "default"

    @property
    def target_space(self) -> int:
        """How many distinct target strings the options allow (36 with ``by_first_char``, M with a pool)."""
        n_chars = len(self.alphabet)
        if self.target_pool:
            return self.target_pool
        return n_chars if self.tails == "by_first_char" else n_chars**self.a_len

    def validate(self) -> None:
        """Fail with one line when the request is impossible."""
        n_chars = len(self.alphabet)
        if len(set(self.alphabet)) != n_chars:
            raise ConfigError(f"alphabet {self.alphabet!r} repeats a character")
        if self.direction not in DIRECTIONS:
            raise ConfigError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        for name, choices in (("target_uniqueness", TARGET_UNIQUENESS), ("tails", TAILS), ("order", ORDERS),
                              ("selectors", SELECTORS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name} must be one of {choices}, got {getattr(self, name)!r}")
        if not isinstance(self.no_z, bool):
            raise ConfigError(f"no_z must be true or false, got {self.no_z!r}")
        if self.direction == "forward":
            if self.target_uniqueness != "global":
                raise ConfigError("the forward task needs target_uniqueness=global: with targets unique only "
                                  "within a group, A -> B is not a function")
            for name, default in (("order", "bz"), ("selectors", "shared"), ("no_z", False)):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name}={getattr(self, name)} has no meaning for the forward task "
                                      "(A -> B has no selector)")
        if self.no_z:
            for name, default in (("order", "bz"), ("selectors", "shared")):
                if getattr(self, name) != default:
                    raise ConfigError(f"{name}={getattr(self, name)} has no meaning with no_z (no selector)")
        if self.tails == "by_first_char" and not self.distinct_first_char:
            raise ConfigError("tails=by_first_char needs distinct_first_char: the K targets of a group "
                              "then differ only in their first character")
        for name in ("n_b", "K", "b_len", "z_len", "a_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        self._validate_marginal_options(n_chars)
        if self.K > n_chars**self.z_len:
            raise ConfigError(
                f"K={self.K} is larger than the {n_chars ** self.z_len} distinct selectors "
                f"of {self.z_len} characters"
            )
        if self.n_b > n_chars**self.b_len:
            raise ConfigError(
                f"n_b={self.n_b} is larger than the {n_chars ** self.b_len} distinct base strings "
                f"of {self.b_len} characters"
            )
        if self.distinct_first_char and self.K > n_chars:
            raise ConfigError(
                f"K={self.K} targets cannot start with distinct characters: the alphabet has {n_chars}"
            )
        space = self.target_space
        what = "targets allowed by tails=by_first_char" if self.tails == "by_first_char" else \
            f"strings of {self.a_len} characters"
        if self.target_uniqueness == "global" and self.D > space // 2:
            raise ConfigError(
                f"D={self.D} unique targets need more than half of the {space} {what}; "
                f"lower n_b or K, raise a_len, or use target_uniqueness=group"
            )
        if self.K > space:
            raise ConfigError(f"K={self.K} distinct targets per group: there are only {space} {what}")

    def _validate_marginal_options(self, n_chars: int) -> None:
        """The cheap-marginal variants: a target pool and Zipf first characters."""
        if isinstance(self.target_pool, bool) or not isinstance(self.target_pool, int) or self.target_pool < 0:
            raise ConfigError(f"target_pool must be 0 (off) or a number of strings M >= K, got {self.target_pool!r}")
        if self.target_pool:
            if self.target_pool < self.K:
                raise ConfigError(f"target_pool={self.target_pool} cannot give each group K={self.K} distinct targets")
            if self.target_pool > n_chars**self.a_len:
                raise ConfigError(f"target_pool={self.target_pool} is more than the {n_chars ** self.a_len} strings "
                                  f"of {self.a_len} characters")
            for name, want in (("target_uniqueness", "group"), ("distinct_first_char", False), ("tails", "random"),
                               ("first_char_zipf", 0.0)):
                if getattr(self, name) != want:
                    raise ConfigError(f"target_pool needs {name}={want} (the groups share the pool's strings, "
                                      f"drawn uniformly), got {getattr(self, name)}")
        if not isinstance(self.first_char_zipf, (int, float)) or isinstance(self.first_char_zipf, bool) \
                or not math.isfinite(self.first_char_zipf) or self.first_char_zipf < 0:
            raise ConfigError(f"first_char_zipf must be 0 (uniform) or a positive exponent, got {self.first_char_zipf!r}")
        if self.first_char_zipf and not self.distinct_first_char:
            raise ConfigError("first_char_zipf needs distinct_first_char: a group's K first characters are a "
                              "weighted draw without replacement")
