"""XGBoost cost model over schedule features, optionally pretrained on the analytical model.

It takes any space with ``features()``, ``cache_key`` and ``work`` (FLOPs per run): pipetune's
schedule spaces, and without the analytical prior also foreign recorded spaces.

The `xgb` strategy (TVM's XGBTuner, the knob-only baseline) uses it without the prior. The
`analytical+xgb` strategy no longer does: it searches with a Gaussian process whose prior mean
is the analytical model (tuner/bo.py), which also gives the uncertainty this model lacks.
The model-assisted pretraining below stays for offline studies (`pretrain` on a corpus).

Target: log throughput (log TFLOP/s). It is comparable across workloads, so one model can be
pretrained on a corpus of workloads for a GPU and start warm on a new shape.

Model-assisted refit (ALCOP Sec. 4.3): the pretrained booster predicts the analytical model's
log throughput; each refit boosts extra trees *on top of it* using measurements only. Those
trees learn the residual between reality and the prior, so near measured schedules the
measurements win, and elsewhere the prior still ranks. Without a prior (`xgb`, as TVM's
XGBTuner) the booster is fit from scratch on measurements.

Failed trials (compile error, wrong result, ...) are learned as very slow: their target is
the worst log throughput seen minus FAIL_PENALTY (e^-2, about 7x slower).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xgboost as xgb

from pipetune.model.analytical import evaluate
from pipetune.model.space import Space

FAIL_PENALTY = 2.0
ANALYTICAL_FEATURES: tuple[str, ...] = (
    "log_T_kernel",
    "log_T_main_loop",
    "log_T_smem_load",
    "log_T_smem_use",
    "log_T_compute",
    "log_T_reg_load",
    "smem_load_bound",
    "reg_load_bound",
    "util",
)


def analytical_features(space: Space) -> np.ndarray:
    p = evaluate(space)
    return np.column_stack(
        [
            np.log(p.T_kernel),
            np.log(p.T_main_loop),
            np.log(p.T_smem_load),
            np.log(p.T_smem_use),
            np.log(p.T_compute),
            np.log(p.T_reg_load),
            p.smem_load_bound.astype(np.float64),
            p.reg_load_bound.astype(np.float64),
            p.Util,
        ]
    )


def predicted_log_tflops(space: Space) -> np.ndarray:
    return np.log(space.work / evaluate(space).T_kernel / 1e12)


def measured_log_tflops(space: Space, latency_s: np.ndarray, failed: np.ndarray) -> np.ndarray:
    """Targets for measured schedules; failures become the worst seen minus FAIL_PENALTY."""
    latency_s = np.asarray(latency_s, dtype=np.float64)
    failed = np.asarray(failed, dtype=bool)
    y = np.empty(len(latency_s))
    ok = ~failed
    y[ok] = np.log(space.work / latency_s[ok] / 1e12)
    floor = y[ok].min() if ok.any() else 0.0
    y[failed] = floor - FAIL_PENALTY
    return y


@dataclass
class CostModel:
    """Predicts log TFLOP/s of schedules. ``use_analytical`` adds the model's terms as features."""

    seed: int = 0
    use_analytical: bool = True
    pretrain_rounds: int = 150
    refit_rounds: int = 40
    params: dict = field(default_factory=dict)
    _prior: xgb.Booster | None = None
    _booster: xgb.Booster | None = None
    _feature_cache: dict = field(default_factory=dict)

    def _params(self) -> dict:
        base = {
            "max_depth": 6,
            "eta": 0.15,
            "subsample": 1.0,
            "min_child_weight": 1,
            "objective": "reg:squarederror",
            "tree_method": "hist",
            "seed": self.seed,
            # One thread: bit-for-bit reproducible fits (the service rebuilds sessions).
            "nthread": 1,
            "verbosity": 0,
        }
        return {**base, **self.params}

    def features(self, space: Space) -> np.ndarray:
        key = space.cache_key
        cached = self._feature_cache.get(key)
        if cached is None:
            parts = [space.features()]
            if self.use_analytical:
                parts.append(analytical_features(space))
            cached = np.hstack(parts)
            self._feature_cache = {key: cached}  # one space at a time: keep memory flat
        return cached

    def feature_names(self, space: Space) -> list[str]:
        names = list(space.feature_names)
        return names + list(ANALYTICAL_FEATURES) if self.use_analytical else names

    @property
    def is_fitted(self) -> bool:
        return self._booster is not None

    def pretrain(self, spaces: list[Space]) -> None:
        """Fit the prior on the analytical model's predictions over one or many spaces."""
        if not self.use_analytical:
            raise ValueError("pretraining needs the analytical features (use_analytical=True)")
        X = np.vstack([self.features(s) for s in spaces])
        y = np.concatenate([predicted_log_tflops(s) for s in spaces])
        dtrain = xgb.DMatrix(X, label=y, feature_names=self.feature_names(spaces[0]))
        self._prior = xgb.train(self._params(), dtrain, num_boost_round=self.pretrain_rounds)
        self._booster = self._prior

    def fit(
        self, space: Space, index: np.ndarray, latency_s: np.ndarray, failed: np.ndarray
    ) -> None:
        """Refit on measurements of ``space[index]`` (on top of the prior when there is one)."""
        index = np.asarray(index, dtype=np.int64)
        if len(index) == 0:
            self._booster = self._prior
            return
        X = self.features(space)[index]
        y = measured_log_tflops(space, latency_s, failed)
        dtrain = xgb.DMatrix(X, label=y, feature_names=self.feature_names(space))
        rounds = self.refit_rounds if self._prior is not None else self.pretrain_rounds
        self._booster = xgb.train(
            self._params(), dtrain, num_boost_round=rounds, xgb_model=self._prior
        )

    def predict(self, space: Space) -> np.ndarray:
        """Predicted log TFLOP/s for every schedule of the space (higher is better)."""
        if self._booster is None:
            raise RuntimeError("the cost model is neither pretrained nor fitted")
        dmat = xgb.DMatrix(self.features(space), feature_names=self.feature_names(space))
        return self._booster.predict(dmat)

    def save(self, path: str | Path) -> None:
        """XGBoost JSON of the current booster plus a sidecar with the settings."""
        if self._booster is None:
            raise RuntimeError("nothing to save: the cost model is not fitted")
        path = Path(path)
        self._booster.save_model(path)
        meta = {"seed": self.seed, "use_analytical": self.use_analytical, "params": self.params}
        path.with_suffix(".meta.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """A model whose loaded booster acts as the prior for further refits."""
        path = Path(path)
        meta = json.loads(path.with_suffix(".meta.json").read_text())
        model = cls(seed=meta["seed"], use_analytical=meta["use_analytical"], params=meta["params"])
        booster = xgb.Booster()
        booster.load_model(path)
        model._prior = model._booster = booster
        return model
