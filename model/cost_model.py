"""XGBoost cost model over schedule features, optionally pretrained on the analytical model.

It takes any space with ``features()``, ``cache_key`` and ``work`` (what one run does, in its
family's work unit): every kernel family's schedule spaces (the family gives the analytical
model's terms as extra features, ``KernelFamily.model_features``), and without the
analytical prior also foreign recorded spaces. The feature columns differ between families,
so one model (one booster) serves one family: fitting or pretraining it on another family's
space is refused.

The `xgb` strategy (TVM's XGBTuner, the knob-only baseline) uses it without the prior. The
`analytical+xgb` strategy no longer does: it searches with a Gaussian process whose prior mean
is the analytical model (tuner/bo.py), which also gives the uncertainty this model lacks.
The model-assisted pretraining below stays for offline studies (`pretrain` on a corpus).

Target: log throughput (log TFLOP/s for the tensor-core GEMMs, log GB/s for the
memory-intensive operators: the family's unit). It is comparable across workloads of a
family, so one model can be pretrained on a corpus of workloads for a GPU and start warm on
a new shape.

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
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pipetune.model.analytical import evaluate
from pipetune.model.family import THROUGHPUT_UNITS, family_of
from pipetune.model.space import Space

if TYPE_CHECKING:
    import xgboost as xgb


def _xgb() -> Any:
    """xgboost, imported when a model is first trained or loaded: its import is a third of
    the service's start (about 1 s), which trains none until a task asks for one."""
    import xgboost

    return xgboost


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
    """The ALCOP model's terms: the tensor-core GEMM family's model features."""
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


def _unit_scale(space: Any) -> float:
    """Work per second -> the family's throughput unit (a foreign space, with no family and
    work 1: the TFLOP/s scale it always had, so its targets are what they were)."""
    workload = getattr(space, "workload", None)
    unit = "flop" if workload is None else family_of(workload).work_unit
    return THROUGHPUT_UNITS[unit][1]


def predicted_log_throughput(space: Any) -> np.ndarray:
    """The family's analytical model as log throughput in the family's unit."""
    prediction = family_of(space.workload).evaluate(space)
    return np.log(space.work / prediction.T_kernel / _unit_scale(space))


def measured_log_throughput(space: Any, latency_s: np.ndarray, failed: np.ndarray) -> np.ndarray:
    """Targets for measured schedules; failures become the worst seen minus FAIL_PENALTY."""
    latency_s = np.asarray(latency_s, dtype=np.float64)
    failed = np.asarray(failed, dtype=bool)
    y = np.empty(len(latency_s))
    ok = ~failed
    y[ok] = np.log(space.work / latency_s[ok] / _unit_scale(space))
    floor = y[ok].min() if ok.any() else 0.0
    y[failed] = floor - FAIL_PENALTY
    return y


def median_level(log_throughput: np.ndarray, failed: np.ndarray) -> float:
    """A measured space's level: the median log throughput of the schedules that ran."""
    ran = np.asarray(log_throughput)[~np.asarray(failed, dtype=bool)]
    return float(np.median(ran)) if ran.size else 0.0


# The names this module had when it knew one family (log TFLOP/s): the same functions.
predicted_log_tflops = predicted_log_throughput
measured_log_tflops = measured_log_throughput


_XGB_ESCAPES = re.compile(r"[\[\]<%]")


def _escaped(match: re.Match[str]) -> str:
    return f"%{ord(match.group()):02X}"


@dataclass
class CostModel:
    """Predicts log throughput of schedules (in their family's unit). ``use_analytical`` adds
    the family's analytical-model terms as features."""

    seed: int = 0
    use_analytical: bool = True
    pretrain_rounds: int = 150
    refit_rounds: int = 40
    params: dict = field(default_factory=dict)
    _prior: xgb.Booster | None = None
    _booster: xgb.Booster | None = None
    _feature_cache: dict = field(default_factory=dict)
    _columns: tuple[str, ...] | None = None  # the feature names the booster was fit on

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

    def _columns_of(self, space: Any) -> tuple[list[str], np.ndarray]:
        key = space.cache_key
        cached = self._feature_cache.get(key)
        if cached is None:
            names, parts = list(space.feature_names), [space.features()]
            if self.use_analytical:
                model_names, model_x = family_of(space.workload).model_features(space)
                names += list(model_names)
                parts.append(model_x)
            cached = (names, np.hstack(parts))
            self._feature_cache = {key: cached}  # one space at a time: keep memory flat
        return cached

    def features(self, space: Any) -> np.ndarray:
        return self._columns_of(space)[1]

    def feature_names(self, space: Any) -> list[str]:
        """The columns' names as XGBoost takes them: a recorded space's knob names are any
        string, and XGBoost refuses "[", "]" and "<" in a name (a Kernel Tuner cache's
        "tile[0]" ended `xgb` with a bare ValueError). Those, and "%", are percent-escaped:
        the names stay distinct, and those of pipetune's own families are unchanged."""
        return [_XGB_ESCAPES.sub(_escaped, name) for name in self._columns_of(space)[0]]

    def _same_columns(self, names: list[str]) -> None:
        """One booster per family: the columns it was fit on must be the space's."""
        if self._columns is not None and tuple(names) != self._columns:
            raise ValueError(
                "this cost model was fit on another kernel family's features; use one model "
                "per family"
            )
        self._columns = tuple(names)

    @property
    def is_fitted(self) -> bool:
        return self._booster is not None

    def pretrain(self, spaces: list[Any]) -> None:
        """Fit the prior on the analytical model's predictions over one or many spaces."""
        if not self.use_analytical:
            raise ValueError("pretraining needs the analytical features (use_analytical=True)")
        names = self.feature_names(spaces[0])
        parts = []
        for s in spaces:
            self._same_columns(self.feature_names(s))
            parts.append(self.features(s))
        X = np.vstack(parts)
        y = np.concatenate([predicted_log_throughput(s) for s in spaces])
        dtrain = _xgb().DMatrix(X, label=y, feature_names=names)
        self._prior = _xgb().train(self._params(), dtrain, num_boost_round=self.pretrain_rounds)
        self._booster = self._prior

    def fit(self, space: Any, index: np.ndarray, latency_s: np.ndarray, failed: np.ndarray) -> None:
        """Refit on measurements of ``space[index]`` (on top of the prior when there is one)."""
        index = np.asarray(index, dtype=np.int64)
        if len(index) == 0:
            self._booster = self._prior
            return
        names = self.feature_names(space)
        self._same_columns(names)
        X = self.features(space)[index]
        self._refit(X, measured_log_throughput(space, latency_s, failed), names)

    def fit_corpus(self, measured: Sequence[tuple[Any, np.ndarray, np.ndarray]]) -> None:
        """Fit on measurements of several spaces of one family at once, each given as (space,
        latency_s of every schedule, failed flags): another GPU's or other shapes' history
        (on top of the prior when there is one). Each space's log throughput is taken
        relative to its median over the schedules that ran: what carries from one shape to
        another is how its schedules rank, and fitted to the shapes' absolute levels the trees
        spent their splits on telling shapes apart (measured on the campaigns' 23 GEMM shapes,
        each left out in turn: the best of the model's 8 first-ranked schedules held 0.939 /
        0.946 of the optimum on the H100 / H200, 0.982 / 0.983 relative; benchmarks/RESULTS.md,
        "the learned prior ranks within a shape"). The model then predicts log throughput
        relative to a space's median (`median_level` gives the corpus's level)."""
        if not measured:
            raise ValueError("fit_corpus needs at least one measured space")
        names = self.feature_names(measured[0][0])
        xs, ys = [], []
        for space, latency_s, failed in measured:
            self._same_columns(self.feature_names(space))
            xs.append(self.features(space))
            y = measured_log_throughput(space, latency_s, failed)
            ys.append(y - median_level(y, failed))
        self._refit(np.vstack(xs), np.concatenate(ys), names)

    def _refit(self, X: np.ndarray, y: np.ndarray, names: list[str]) -> None:
        """Boost on measurements: on top of the prior (its residual) or from scratch."""
        dtrain = _xgb().DMatrix(X, label=y, feature_names=names)
        rounds = self.refit_rounds if self._prior is not None else self.pretrain_rounds
        self._booster = _xgb().train(
            self._params(), dtrain, num_boost_round=rounds, xgb_model=self._prior
        )

    def predict(self, space: Any) -> np.ndarray:
        """Predicted log throughput for every schedule of the space (higher is better)."""
        if self._booster is None:
            raise RuntimeError("the cost model is neither pretrained nor fitted")
        dmat = _xgb().DMatrix(self.features(space), feature_names=self.feature_names(space))
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
        booster = _xgb().Booster()
        booster.load_model(path)
        model._prior = model._booster = booster
        return model
