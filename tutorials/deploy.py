"""Compile on one machine, ship one file, load and run it in a fresh process.

Run it with ``python tutorials/deploy.py``. ``paragraph.build`` compiles a model and plans its
schedule (measuring kernels on this machine); ``export_library`` writes everything the run
needs as one file: the kernels, the kernel graph, the weights, the schedule, the memory plan
and a manifest (versions, target, machine, the rules applied with their hashes, the planner's
report, a checksum of every part). ``paragraph.load`` checks and loads it in any process with
the same paragraph and TVM, on a machine with the same CPU (or GPU): nothing is searched,
planned or unpickled. In a process that has not imported TVM yet it loads TVM's runtime
alone, without its compiler or PyTorch (``paragraph.lean``): the fresh process below peaks
at about 170 MiB less than one that imports TVM first. The command line does the same:
``paragraph compile squeezenet1_1 -o model.paragraph`` then ``paragraph run model.paragraph``.
The file holds native code (the kernels), which loading runs: load only files from a trusted
source, and sign them where they travel (``export_library(path, key=key)``, then
``paragraph.load(path, key=key)``, or ``--key-file`` on the command line): the checksums alone
catch accidents, not edits.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

import paragraph
from paragraph import models
from paragraph.tvm_interop.runtime.artifact import read_manifest


def main(full: bool = False) -> None:
    mod = models.get("inception_v3", reduced=not full)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "inception.paragraph"
        # Compile and plan here (critical-path: kernels timed once, cached), then export.
        with paragraph.build(mod, schedule="critical-path") as exe:
            x = exe.sample_inputs(seed=1)
            here = exe.run(*x)
            exe.export_library(path, info={"model": "inception_v3"})
            print(f"built: {exe!r}")
        manifest = read_manifest(path)
        print(f"wrote {path.name}: {path.stat().st_size / 2**20:.1f} MiB, paragraph "
              f"{manifest['paragraph']}, TVM {manifest['tvm']}, {manifest['kernels']} kernels, "
              f"schedule {manifest['schedule']['name']}, memory plan "
              f"{manifest['memory']['bytes'] / 2**10:.0f} KiB in {manifest['memory']['blocks']} "
              "blocks")

        # A fresh process: load, run, time. The inputs travel as .npy files (no pickle).
        np.save(Path(tmp) / "x.npy", x[0], allow_pickle=False)
        script = textwrap.dedent(f"""
            import json
            import numpy as np
            import paragraph
            exe = paragraph.load({str(path)!r})  # TVM's runtime alone: nothing imported it yet
            x = np.load({str(Path(tmp) / "x.npy")!r}, allow_pickle=False)
            np.save({str(Path(tmp) / "y.npy")!r}, exe.run(x)[0], allow_pickle=False)
            print(json.dumps({{"schedule": exe.schedule.describe(),
                               "median_ms": exe.time(x, repeat=20).median_ms,
                               "runtime_only": paragraph.lean.is_runtime_only()}}))
            exe.close()
        """)
        run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=600, check=True)
        there = json.loads(run.stdout.strip().splitlines()[-1])
        y = np.load(Path(tmp) / "y.npy", allow_pickle=False)
    np.testing.assert_allclose(y, here[0], rtol=1e-5, atol=1e-5)
    assert there["runtime_only"], "the fresh process imported TVM whole"
    print(f"fresh process (TVM's runtime alone): same outputs, {there['schedule']}, "
          f"median {there['median_ms']:.2f} ms")


if __name__ == "__main__":
    main(full="--full" in sys.argv)
