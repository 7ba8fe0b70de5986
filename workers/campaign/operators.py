"""Which operators a campaign sweeps, and in which order.

``--operators`` takes suite names and operator names, comma-separated
(``alcop``, ``memops``, ``MM_RN50_FC,Softmax_BERT_b1_s128``, ``alcop,Conv3D_1``); the result
keeps the first mention of each operator. A suite sweeps in its priority order: the ALCOP
suite in the order of the paper's Figure 13 (its MatMuls, BMMs, Conv2Ds, then Conv3Ds), so
that the operators a short campaign reaches first are the ones the paper's headline result
is about; the one suite operator the figure does not name (MM_RN50_Conv1x1_3) closes the
MatMul group. The memops suite (softmax, layer norm and bias + GELU of BERT-base and GPT-2)
sweeps in model/operators.py's order, each shape's three operators together, smallest
batch and sequence first.

The default (``DEFAULT_OPERATORS``) is the ALCOP suite, then the memops suite: the sweeps
stop cleanly between operators at the deadline, so a short campaign still finishes the
headline suite first and the memory-intensive operators take the time that is left.
"""

from __future__ import annotations

import difflib
from typing import Any

from pipetune.model.family import family_of
from pipetune.model.memops.workloads import MEM_OPS
from pipetune.model.operators import HOPPER, HOPPER_PREFIX, SUITES

# The kernel families a campaign has kernels, references and vendor baselines for. Operators
# of another family (one registered later, before the campaign learns its baselines) are
# refused by name rather than swept without them.
CAMPAIGN_FAMILIES: tuple[str, ...] = ("tensor_gemm", "memops", "hopper_gemm")
DEFAULT_OPERATORS = "alcop,memops"

FIGURE_13_ORDER: tuple[str, ...] = (
    "MM_Square_1k",
    "MM_Square_2k",
    "MM_Square_4k",
    "MM_BERT_Proj",
    "MM_BERT_QKV",
    "MM_BERT_FC1",
    "MM_BERT_FC2",
    "MM_RN50_Conv1x1_1",
    "MM_RN50_Conv1x1_2",
    "MM_RN50_FC",
    "MM_RN50_Conv1x1_3",
    "BMM_BERT_QK",
    "BMM_BERT_SV",
    "BMM_GPT2_QK",
    "BMM_GPT2_SV",
    "Conv2D_RN50_1",
    "Conv2D_RN50_2",
    "Conv2D_RN50_3",
    "Conv2D_RN50_4",
    "Conv3D_1",
    "Conv3D_2",
    "Conv3D_3",
    "Conv3D_4",
)
SUITE_ORDER: dict[str, tuple[str, ...]] = {
    "alcop": FIGURE_13_ORDER,
    # The same order for the same GEMMs and BMMs on the Hopper family.
    "hopper": tuple(
        HOPPER_PREFIX + name for name in FIGURE_13_ORDER if HOPPER_PREFIX + name in HOPPER
    ),
}


def swept(workload: Any) -> bool:
    """Whether the campaign sweeps a workload's family."""
    return family_of(workload).name in CAMPAIGN_FAMILIES


def suite_in_order(name: str) -> dict[str, Any]:
    operators = SUITES[name]
    order = SUITE_ORDER.get(name, tuple(operators))
    return {op: operators[op] for op in order if swept(operators[op])}


def families_of(operators: dict[str, Any]) -> list[str]:
    """The kernel families of the operators, in the order they first appear."""
    return list(dict.fromkeys(family_of(w).name for w in operators.values()))


def operator_workload(name: str) -> Any | None:
    """The workload of the operator of that exact name (as a campaign names its sweep files),
    of any suite; None for a name that is none."""
    for operators in SUITES.values():
        if name in operators:
            return operators[name]
    return None


def resolve_operators(text: str) -> dict[str, Any]:
    """Operator name -> workload, in sweep order; ValueError naming what is unknown or of a
    family the campaign does not sweep."""
    every = {op: w for suite in SUITES.values() for op, w in suite.items()}
    by_lower = {op.lower(): op for op in every}
    chosen: dict[str, Any] = {}
    unknown, other = [], []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.lower() in SUITES:
            operators = suite_in_order(token.lower())
            if any(not swept(w) for w in SUITES[token.lower()].values()):
                # Refused whole: a suite of two families (attention's) swept in part would
                # measure half of what it is for without a word.
                other.append(token)
                continue
            for op, workload in operators.items():
                chosen.setdefault(op, workload)
        elif token.lower() in by_lower:
            op = by_lower[token.lower()]
            workload = every[op]
            if swept(workload):
                chosen.setdefault(op, workload)
            else:
                other.append(token)
        else:
            unknown.append(token)
    if unknown:
        # One line that says what would have been accepted: the closest names first (a
        # typo is the usual mistake), then every suite and operator.
        names = {name.lower(): name for name in [*SUITES, *every]}
        close = [
            names[m]
            for token in unknown
            for m in difflib.get_close_matches(token.lower(), names, n=2, cutoff=0.8)
        ]
        hint = f" (did you mean {', '.join(dict.fromkeys(close))}?)" if close else ""
        listing = "; ".join(f"{suite}: {', '.join(ops)}" for suite, ops in SUITES.items())
        raise ValueError(
            f"unknown operator or suite {', '.join(map(repr, unknown))}{hint}; suites: "
            f"{', '.join(SUITES)}; operators by suite: {listing}"
        )
    if other:
        raise ValueError(
            f"{', '.join(map(repr, other))}: the campaign sweeps the kernel families "
            f"{', '.join(CAMPAIGN_FAMILIES)} only (the pipelined GEMMs: GEMM, BMM, Conv2D, "
            f"Conv3D; the memory-intensive operators: {', '.join(MEM_OPS)}; "
            "the Hopper wgmma GEMMs: hopper_gemm, hopper_bmm)"
        )
    if not chosen:
        raise ValueError("no operator named")
    return chosen
