"""The JAX benchmark scripts run, with their GPU-only code paths, on CPU at small sizes.

Their numbers are checked by reading them (benchmarks/RESULTS.md); these tests keep the
scripts working between GPU sessions (device time is scarce: a broken script wastes a call)
and check the properties every row must have.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # subprocess runs of the benchmark scripts
def test_jax_memory_with_device_columns():
    out = _run("benchmarks/jax_memory.py", "--model", "mlp", "--budgets", "0.5",
               "--methods", "rotor,every_layer", "--device-columns", "on", "--no-peak")
    rows = [line.split() for line in out.splitlines() if re.match(r"(rotor|every_layer) ", line)]
    assert len(rows) == 3  # two methods at 0.5, and rotor at every_layer's predicted peak
    for row in rows:
        meas_pred, meas_budget = float(row[8]), float(row[9])  # sizes are "1.2 MiB": two tokens
        assert 0.9 <= meas_pred <= 1.0 and meas_budget <= 1.0
        assert row[-2] == "n/a" and float(row[-1]) > 0  # no peak column; a step time
    assert "step time vs plain: every_layer" in out
    assert "cost analysis: lowered" in out  # XLA answers on CPU


@pytest.mark.slow
def test_device_profile_plans_with_both_cost_models():
    out = _run("benchmarks/device_profile.py", "--model", "mlp", "--scale", "1")
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if re.match(r"(static|measured) +\d", line)}
    assert set(rows) == {"static", "measured"}
    assert all(float(row[1]) > 1.0 for row in rows.values())  # predicted time overhead
    assert "reports no memory limit" in out  # budget_from_device on CPU says why


def test_gpu_checks_script_parses_and_names_its_parts():
    script = os.path.join(ROOT, "benchmarks", "gpu_checks.sh")
    assert subprocess.run(["bash", "-n", script]).returncode == 0
    text = open(script).read()
    for part in re.findall(r"gpu_checks\.sh (\w+) ", text):  # the usage lines at the top
        assert f"part_{part}()" in text, part


@pytest.mark.slow  # a subprocess run of a benchmark script (25 s)
def test_scan_depth_quick_runs():
    out = _run("benchmarks/scan_depth.py", "--quick")
    assert re.search(r"^32 +remat_scan .*cached", out, re.M)
    assert re.search(r"^8 +scan\+nothing_saveable", out, re.M)
    budgets = out[out.index("memory (meter)"):].splitlines()
    rows = [line for line in budgets if re.match(r"\d+ +remat_scan (25|50|75)%", line)]
    assert len(rows) == 9  # three depths, three budgets: a figure or the budget that works
    assert len([line for line in budgets if re.match(r"\d+ +remat_scan least", line)]) == 3


@pytest.mark.slow  # a subprocess run of a benchmark script (~25 s)
def test_policies_never_dearer_than_a_fitting_uniform_policy_it_predicts():
    """benchmarks/policies.py on the GPT of whole blocks: every row's jaxremat memory fits its
    budget, and wherever the budget covers the chain's prediction of the cheapest fitting
    uniform policy (the "predicted" and share rows), jaxremat's flops are no more."""
    out = _run("benchmarks/policies.py", "--models", "gpt_blocks", "--fractions", "0.6")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[2].strip().endswith("%")]
    assert len(rows) == 4 + 3 + 1  # four uniform memories, three predictions, one share
    for row in rows:
        budget, memory = float(row[1].rstrip("%")), float(row[4].rstrip("%"))
        assert memory <= budget
        if row[0].startswith("predicted") or row[0].endswith("of plain"):
            assert row[8] == "yes", row


@pytest.mark.slow  # a subprocess run of a benchmark script (~30 s)
def test_policies_oracle_on_the_missed_mlp_row():
    """``--oracle``: the mlp stack at 40% misses the half-overhead target (issue 17.6); the
    bound on every schedule of its chain meets the DP's plan and exceeds the target."""
    out = _run("benchmarks/policies.py", "--models", "mlp", "--fractions", "0.4", "--oracle")
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("| ") and line.split("|")[2].strip().endswith("%")]
    missed = [row for row in rows if row[9] == "NO"]
    assert [row[0] for row in missed] == ["40% of plain"]
    assert all(row[-1] == "-" for row in rows if row[9] != "NO")
    bound, plan, half = (float(v) for v in missed[0][-1].split(":")[0].split(" / "))
    assert bound == plan > half
    assert "DP optimal; target below the model's optimum" in missed[0][-1]


@pytest.mark.slow  # a subprocess run of the benchmark script
def test_scan_prediction_rows_are_upper_bounds():
    out = _run("benchmarks/scan_prediction.py", "--blocks", "mlp", "--depths", "4",
               "--members", "(),(1,),(2,)")
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| mlp ")]
    assert len(rows) == 6  # three members, two options (the whole tape, dots_saveable)
    for row in rows:
        measured, predicted = int(row[5]), float(row[6])
        assert measured <= predicted, row
        if row[3].strip() in ("plain", "1"):
            assert measured == predicted, row  # the loop terms by phase: exact


@pytest.mark.slow  # a subprocess run of the search benchmark
def test_search_time_finds_the_same_options_both_ways_and_no_better_local_union():
    out = _run("benchmarks/search_time.py", "--models", "conv", "--local")
    rows = [line.rstrip() for line in out.splitlines() if line.startswith("| conv |")]
    timed = [line for line in rows if line.endswith("x |")]
    local = [line for line in rows if line.endswith("% |")]
    assert timed and len(timed) % 3 == 0  # each distinct layer, each base
    assert all("| yes |" in line for line in timed)  # the same options traced and split
    assert local and all(line.endswith("| 0.0% |") for line in local)


@pytest.mark.slow  # a subprocess run of the random stacks benchmark
def test_random_stacks_rows_are_exact_predictions():
    out = _run("benchmarks/random_stacks.py", "--seeds", "7:8")  # 0.955 before x_own_read_size
    assert "OVER" not in out
    assert "checkpoint 1.0000 (5392/5392)" in out and "custom_vjp 1.0000 (5392/5392)" in out
