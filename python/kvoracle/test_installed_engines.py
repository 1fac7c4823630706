"""The engines installed in this environment, judged as a pytest run a user (or their CI) can add:

    pytest --pyargs kvoracle.test_installed_engines          # KVO_CASES, KVO_SEED as elsewhere

One test per engine kernel (kvoracle.engines.ENGINE_KERNELS), each over its configurations: skipped
where the engine is absent, the kernel unavailable in its version or no GPU is present
(KVO_ENGINES_DEVICE=cpu judges NumPy stand-ins with the engines' signatures); a failure's message
is kvoracle's report for each configuration that did not pass.
"""

import os

import pytest

from kvoracle import engines

_UNJUDGED = ("absent", "unavailable", "not judged")


@pytest.mark.parametrize("kernel", engines.ENGINE_KERNELS,
                         ids=lambda k: f"{k.engine}:{k.kernel.split(' ')[0]}")
def test_installed_engine_kernel(kernel):
    rows = engines.judge_installed(kernels=[kernel],
                                   cases=int(os.environ.get("KVO_CASES", "100")),
                                   device=os.environ.get("KVO_ENGINES_DEVICE") or None)
    print(engines.table(rows))
    if all(r.verdict in _UNJUDGED for r in rows):
        pytest.skip(f"{kernel.engine} {kernel.kernel}: "
                    + "; ".join(sorted({f'{r.verdict}: {r.detail}' for r in rows})))
    failed = [r for r in rows if r.verdict not in _UNJUDGED + ("pass",)]
    assert not failed, "\n\n".join(f"[{r.configuration}] {r.report}" for r in failed)
