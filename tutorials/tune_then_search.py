"""Tune kernels with MetaSchedule, then search the graph: kernel-level and graph-level tuning
compose.

Run it with ``python tutorials/tune_then_search.py`` (a few kernels, a few trials: minutes).
MetaSchedule tunes the model's fused TVM kernels into a database directory, resumable after an
interruption; a tuned kernel is applied only where it measured faster than the untuned one
alone, and only if the model with it ran faster end to end than untuned (the model check).
Every paragraph entry point takes that directory (``tuning_db=``, ``--tuning-db``): the
substitution search then prices and times its candidates with the tuned kernels, so the graph
it picks is the best one *given* those kernels. The command line does both in one verb:
``paragraph tune squeezenet1_1 --search autograph --trials 64 --work-dir tuned/`` tunes the
kernels of the searched graph and of the original (for fair baselines).
"""

from __future__ import annotations

import sys
import tempfile

import numpy as np

import paragraph
from paragraph import models
from paragraph.planner import tune_and_check
from paragraph.tvm_interop.runtime.target import local_cpu_target
from paragraph.tvm_interop.tune.metaschedule import format_summary


def main(full: bool = False, trials: int = 4, max_tasks: int = 3, budget: float = 20.0) -> None:
    mod = models.get("squeezenet1_1", reduced=not full)
    target = local_cpu_target()
    with tempfile.TemporaryDirectory() as work:
        # 1. Tune the heaviest kernels (TVM's own code generation; vendor kernels need none).
        results = tune_and_check(mod, target, work, trials,
                                 max_tasks=None if full else max_tasks, log=print)
        print(format_summary(results))

        # 2. The same model untuned and tuned, both with TVM kernels, side by side.
        with paragraph.build(mod, target, kernels="tvm", schedule="sequential") as plain, \
                paragraph.build(mod, target, kernels="tvm", schedule="sequential",
                                tuning_db=work) as tuned:
            x = plain.sample_inputs()
            np.testing.assert_allclose(tuned.run(*x)[0], plain.run(*x)[0], rtol=1e-4,
                                       atol=1e-4)
            t_plain = plain.time(*x, repeat=10).median_ms
            t_tuned = tuned.time(*x, repeat=10).median_ms
        print(f"untuned {t_plain:.3f} ms, tuned {t_tuned:.3f} ms (only kernels that measured "
              "faster, alone and in the model under critical-path, are applied)")

        # 3. The graph search on top, measuring its candidates with the tuned kernels.
        search = paragraph.SearchOptions("autograph", budget=budget, top_k=2)
        with paragraph.build(mod, target, kernels="tvm", tuning_db=work,
                             search=search) as searched:
            np.testing.assert_allclose(searched.run(*x)[0], plain.run(*x)[0], rtol=1e-4,
                                       atol=1e-4)
            report = searched.report["search"]
            print(f"autograph search with tuned kernels: {len(report['rules'])} rewrites, "
                  f"measured {report['measured_before_ms']:.3f} -> "
                  f"{report['measured_after_ms']:.3f} ms, {searched.schedule.name} schedule")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
