"""The compiled core (NOTE [ Compiled core ]): built from the same sources, it decides as the interpreted one.

The compiled core is built once per test session into a temporary cache folder (10-20 s on 2 cores); the tests
run child processes with ``TORCH_DTR_CORE=compiled`` (the default) and ``python`` and compare them. Skipped where
mypy or a C compiler is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGS = ROOT.parent / "shared" / "dtr-logs"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mypy") is None
                                or not (shutil.which("cc") or shutil.which("gcc")),
                                reason="the compiled core needs mypy and a C compiler")

# every (program, policy, ratio) replay's outcome, wall-clock fields dropped, as JSON (benchmarks/sim_digest.py's
# form): a linear chain, and the DTR authors' logs named on the command line
REPLAYS = """
import json, sys
from torch_dtr.core import COMPILED, POLICIES
from torch_dtr.sim import chains, log, replay
out = {"compiled": COMPILED}
logs = {"chain": chains.linear_chain(300)}
for p in sys.argv[1:]:
    logs[p] = log.read(p)
for name, lg in logs.items():
    peak = replay.no_eviction_peak(lg)
    for policy in sorted(POLICIES):
        for ratio in ((0.6, 0.9) if policy == "dtr" else (0.2, 0.4, 0.7)):
            o = replay.simulate(lg, policy, ratio=ratio, peak=peak).as_dict()
            o.pop("wall_seconds")
            o.pop("search_seconds")
            out[f"{name} {policy} {ratio}"] = o
print(json.dumps(out, sort_keys=True))
"""


@pytest.fixture(scope="module")
def compiled_env(tmp_path_factory):
    env = dict(os.environ, TORCH_DTR_CORE="compiled", TORCH_DTR_CACHE=str(tmp_path_factory.mktemp("core-cache")))
    r = subprocess.run([sys.executable, "-c", "import torch_dtr.core as c; assert c.COMPILED, 'not compiled'"],
                       env=env, capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return env


def _replays(env: dict) -> dict:
    logs = [str(LOGS / f"{n}.log") for n in ("lstm-seq128", "resnet32-bs56") if (LOGS / f"{n}.log").exists()]
    r = subprocess.run([sys.executable, "-c", REPLAYS, *logs], env=env, capture_output=True, text=True,
                       check=False, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_compiled_core_replays_every_policy_as_the_interpreted_one(compiled_env):
    interpreted = _replays(dict(os.environ, TORCH_DTR_CORE="python"))
    compiled = _replays(compiled_env)
    assert compiled.pop("compiled") is True and interpreted.pop("compiled") is False
    assert compiled == interpreted
    assert any(o["rematerializations"] > 0 for o in compiled.values())


def test_the_core_tests_pass_on_the_interpreted_core():
    """tests/core in a child on the interpreted core (``TORCH_DTR_CORE=python``): the suite runs on the compiled
    core, the default, where the tests that replace the runtime's methods skip themselves."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/core",
                        "--deselect", "tests/core/test_compiled_core.py"],
                       cwd=ROOT, env=dict(os.environ, TORCH_DTR_CORE="python"), capture_output=True, text=True,
                       check=False, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert " passed" in r.stdout


def test_the_default_is_the_compiled_core(compiled_env):
    env = {k: v for k, v in compiled_env.items() if k != "TORCH_DTR_CORE"}  # (its cache: built already)
    r = subprocess.run([sys.executable, "-c", "import torch_dtr.core as c; print(c.COMPILED)"], env=env,
                       capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-2000:]


def test_an_unknown_mode_warns_and_runs_the_interpreted_core():
    r = subprocess.run([sys.executable, "-c", "import torch_dtr.core as c; print(c.COMPILED)"],
                       env=dict(os.environ, TORCH_DTR_CORE="fast"), capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.strip() == "False"
    assert "TORCH_DTR_CORE='fast' is neither 'python' nor 'compiled'" in r.stderr
