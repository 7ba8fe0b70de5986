"""Generated kernels change only with a decision about their generator revision.

A measurement counts as describing today's kernels while its generator line's revision is the
newest (model.family.GeneratorRevision; the learned prior reads only those). That holds only
if every change of the generated code that moves kernel times bumps its line's revision. So
each line's generated source for a fixed sample of schedules (the first, middle and last
schedule of every op's first suite operator on an H100) is fingerprinted here, by the line's
current revision: a change of any generated source fails this test until someone decides.

If this test fails after a generator change:
- the change moves some schedules' times beyond a repeated sweep's spread (a few percent; a
  new loader, another pipeline order, other tile shapes): bump the line's revision in its
  family's `generator_revision` and add the new (line, revision) fingerprint below; the old
  line's measurements then stop teaching learned priors as soon as the new revision has
  measurements;
- it does not (a renamed local, a comment, a warning silenced): replace the fingerprint of the
  same (line, revision) and say why in the commit.
Run `python tests/test_generator_fingerprints.py` for the current fingerprints.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pipetune.model.family import family_of
from pipetune.model.hardware import get_gpu
from pipetune.model.operators import SUITES
from pipetune.workers.families import codegen_for

FINGERPRINTS = {
    ("hopper_gemm", 1): "e2edf8af93150d031eced83b6d175a1fd9c4c1dce6a8645776f6f6a93cbf7755",
    # The wgmma GEMMs with bias + GELU and with the SwiGLU in their epilogues (2026-12-05):
    # their first sources.
    (
        "hopper_gemm.bias_gelu",
        1,
    ): "2af4df63edaa19fcbd1023ea77d5fd607cf8e62df96b2795df488b0bbd1bc52e",
    (
        "hopper_gemm.swiglu",
        1,
    ): "3ab907247d4ba3904ea722556007077fb34ee2ca8a768d553e87252386f81813",
    # (2026-12-06: every memops kernel takes softmax's scale and mask length as arguments,
    # and the softmax multiplies by its scale, one FMUL an element of a kernel bound by
    # memory; ptxas gives the plain kernels the registers they had, within 2. The masked
    # softmax is a kind of its own, which no measurement of revision 1 describes.)
    ("memops", 1): "9467b7797a096247dbe408f3e517bfa11c0aa9da0ffc6caf820d3eabbc96d22b",
    # The GEMM with bias + GELU in its epilogue (2026-12-05): its first sources.
    (
        "tensor_gemm.bias_gelu",
        1,
    ): "cf64a9415840ab19056144de8e56c4cdb054fa7dc865cadec5fa5ac85653ce87",
    ("tensor_gemm.conv", 2): "a7f8aedf19f035d6a8243d814fdd01078253428c5b7ceb612a5f063d5e25782d",
    ("tensor_gemm.gemm", 1): "680ffc3b0218cc0c2605e83577561001c25061de2a22e18a225a6f72fd08c910",
    ("tensor_gemm.swiglu", 1): "e54ad426ac8eb5d5a4e623b40cd1fdaf9fb789d13685b6c6a0a068c8831078fb",
}


def fingerprints() -> dict[tuple[str, int], str]:
    """SHA-256 of each generator line's sources for the sample, by (line, revision)."""
    gpu = get_gpu("h100", calibrated=False)
    digests: dict[tuple[str, int], Any] = {}
    # Each op once, in its first suite (the swiglu suite's plain GEMM is the alcop suite's op).
    done: set[tuple[str, str]] = set()
    for operators in SUITES.values():
        for workload in operators.values():
            fam = family_of(workload)
            if (fam.name, workload.op) in done:
                continue
            done.add((fam.name, workload.op))
            space = fam.enumerate(workload, gpu)
            revision = fam.generator_revision(workload)
            digest = digests.setdefault((revision.line, revision.revision), hashlib.sha256())
            for i in (0, len(space) // 2, len(space) - 1):
                digest.update(codegen_for(fam).generate(workload, space[i]).code.encode())
    return {key: digest.hexdigest() for key, digest in sorted(digests.items())}


def test_every_generator_lines_sources_are_those_of_its_revision():
    now = fingerprints()
    assert set(now) == set(FINGERPRINTS), (
        f"generator lines and revisions are now {sorted(now)}: add or replace their "
        "fingerprints (see this module's docstring)"
    )
    changed = [key for key, digest in now.items() if FINGERPRINTS[key] != digest]
    assert not changed, (
        f"the generated sources of {changed} changed: decide whether the change is a new "
        "revision of the line (this module's docstring says how)"
    )


if __name__ == "__main__":
    for key, digest in fingerprints().items():
        print(f"    {key!r}: {digest!r},")
