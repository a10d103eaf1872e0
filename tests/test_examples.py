"""The examples run in their small configuration and their losses go down.

resnet_nnx, gpt_nnx, vit_nnx, llama_nnx, mlp_linen and inception_graph run in-process through their ``main(argv)``;
data_parallel runs in a subprocess because it sets XLA_FLAGS (8 host devices) before JAX
starts.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
pytestmark = pytest.mark.slow  # end to end, in the slow tier (-m slow)


@functools.cache
def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (Linen modules) look their module up
    spec.loader.exec_module(module)
    return module


def check_training(result: dict, drop: float) -> None:
    losses = result["losses"]
    assert all(map(lambda v: v == v, losses)), "NaN loss"
    # Down overall, and the end clearly below the start (different batches: use means).
    head, tail = sum(losses[:2]) / 2, sum(losses[-2:]) / 2
    assert tail < drop * head, (head, tail)
    plan = result["plan"]
    assert plan.predicted_peak <= plan.budget
    assert result["budget"] < result["no_remat_peak"], "the example should need remat"
    # recomputed: a whole layer's forward, or what a checkpoint policy did not save
    # (an option other than the whole tape recomputes inside the layer's backward)
    recomputes = max(plan.forward_counts) > 1 or any(o != "everything" for o in plan.options)
    assert recomputes, "the example should recompute something"


def test_resnet_nnx(capsys):
    result = load("resnet_nnx").main(["--steps", "8"])
    check_training(result, 0.8)
    out = capsys.readouterr().out
    assert "jaxremat plan" in out and "loss" in out


def test_gpt_nnx(capsys):
    result = load("gpt_nnx").main(["--steps", "10"])
    check_training(result, 0.9)
    assert "jaxremat plan" in capsys.readouterr().out


def test_vit_nnx(capsys):
    result = load("vit_nnx").main(["--steps", "24"])
    check_training(result, 0.9)
    assert "jaxremat plan" in capsys.readouterr().out


def test_llama_nnx(capsys):
    # a model written without jaxremat in mind (RMSNorm, grouped-query attention with rotary
    # embeddings, SwiGLU); main asserts the measured step within the budget, gradients equal
    # to the plain model's and the same loss at every training step
    result = load("llama_nnx").main(["--steps", "12", "--budget", "30%"])
    check_training(result, 0.9)
    assert result["losses"] == pytest.approx(result["plain_losses"], rel=1e-4)
    assert result["measured"] <= result["scope"].budget
    assert "jaxremat plan" in capsys.readouterr().out


def test_mlp_linen(capsys):
    result = load("mlp_linen").main(["--steps", "15"])
    check_training(result, 0.5)
    assert "jaxremat plan" in capsys.readouterr().out


def test_resnet_budget_argument():
    module = load("resnet_nnx")
    with pytest.raises(Exception, match="smallest budget"):
        module.main(["--steps", "1", "--budget", "1KiB"])


def test_data_parallel_sharded_equals_unsharded():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the example sets the 8 host devices itself
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / "data_parallel.py"), "--steps", "10"],
        capture_output=True, text=True, timeout=600, env=env,
        cwd=EXAMPLES.parent,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    out = completed.stdout
    assert "8 devices" in out
    line = next(line for line in out.splitlines() if line.startswith("loss unsharded"))
    parts = line.split()
    unsharded, sharded = float(parts[2]), float(parts[4])
    assert abs(unsharded - sharded) <= 1e-5 * abs(unsharded) + 1e-6
    last = out.strip().splitlines()[-1]
    assert last.startswith("result: ")
    result = json.loads(last[len("result: "):])
    assert result["final_loss"] < 0.5 * result["initial_loss"]
    assert result["grad_gap"] < 1e-4


def test_inception_graph(capsys):
    result = load("inception_graph").main(["--steps", "20"])
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < 0.5 * sum(losses[:2]) / 2, losses
    assert result["remat_memory"] < 0.7 * result["plain_memory"]
    plan = result["graph_plan"]
    assert plan.recompute > 0 and len(plan.regions) > 1
    assert "jaxremat plan: GraphPlan" in capsys.readouterr().out


def test_inception_graph_budget():
    result = load("inception_graph").main(["--steps", "8", "--budget", "60%"])
    plan = result["graph_plan"]
    assert plan.measured <= plan.budget
    assert result["remat_memory"] < 0.75 * result["plain_memory"]
    assert result["losses"][-1] < result["losses"][0]
