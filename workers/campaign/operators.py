"""Which operators a campaign sweeps, and in which order.

``--operators`` takes suite names and operator names, comma-separated
(``alcop``, ``MM_RN50_FC,BMM_GPT2_QK``, ``alcop,Conv3D_1``); the result keeps the first
mention of each operator. A suite sweeps in its priority order: the ALCOP suite in the order
of the paper's Figure 13 (its MatMuls, BMMs, Conv2Ds, then Conv3Ds), so that the operators
a short campaign reaches first are the ones the paper's headline result is about; the one
suite operator the figure does not name (MM_RN50_Conv1x1_3) closes the MatMul group.
"""

from __future__ import annotations

from pipetune.model.operators import SUITES
from pipetune.model.workloads import AnyWorkload, Bmm, Conv2d, Conv3d, Gemm

# The kernels, references and baselines a campaign has: the pipelined tensor-core GEMM
# family. Operators of other families in the suites are refused by name.
CAMPAIGN_WORKLOADS = (Gemm, Bmm, Conv2d, Conv3d)

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
SUITE_ORDER: dict[str, tuple[str, ...]] = {"alcop": FIGURE_13_ORDER}


def suite_in_order(name: str) -> dict[str, AnyWorkload]:
    operators = SUITES[name]
    order = SUITE_ORDER.get(name, tuple(operators))
    return {op: operators[op] for op in order if isinstance(operators[op], CAMPAIGN_WORKLOADS)}


def resolve_operators(text: str) -> dict[str, AnyWorkload]:
    """Operator name -> workload, in sweep order; ValueError naming what is unknown or of a
    family the campaign does not sweep."""
    every = {op: w for suite in SUITES.values() for op, w in suite.items()}
    by_lower = {op.lower(): op for op in every}
    chosen: dict[str, AnyWorkload] = {}
    unknown, other = [], []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.lower() in SUITES:
            operators = suite_in_order(token.lower())
            if not operators:
                other.append(token)
            for op, workload in operators.items():
                chosen.setdefault(op, workload)
        elif token.lower() in by_lower:
            op = by_lower[token.lower()]
            workload = every[op]
            if isinstance(workload, CAMPAIGN_WORKLOADS):
                chosen.setdefault(op, workload)
            else:
                other.append(token)
        else:
            unknown.append(token)
    if unknown:
        raise ValueError(
            f"unknown operator or suite {', '.join(map(repr, unknown))}; suites: "
            f"{', '.join(SUITES)}; operators: {', '.join(FIGURE_13_ORDER)}"
        )
    if other:
        raise ValueError(
            f"{', '.join(map(repr, other))}: the campaign sweeps the pipelined GEMM family "
            "(GEMM, BMM, Conv2D, Conv3D) only"
        )
    if not chosen:
        raise ValueError("no operator named")
    return chosen
