"""parse_budget: the parsing table and every error path."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxremat import format_bytes, parse_budget
from solver import errors

KIB, MIB, GIB, TIB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    "budget, expected",
    [
        # numbers: bytes, floats rounded down
        (1, 1),
        (123_456_789, 123_456_789),
        (2.999, 2),
        (1.5e9, 1_500_000_000),
        (np.int64(7), 7),
        (np.float32(3.5), 3),
        (2**70, 2**70),  # exact, no float rounding
        # plain strings
        ("2e9", 2_000_000_000),
        ("1_000_000", 1_000_000),
        ("12345678901234567891", 12345678901234567891),  # exact beyond float precision
        (" 42 ", 42),
        ("+42", 42),
        ("5.", 5),
        (".5k", 512),
        ("10b", 10),
        ("10 B", 10),
        ("10 bytes", 10),
        ("1 byte", 1),
        # binary units, case-tolerant
        ("512 KiB", 512 * KIB),
        ("1.5GiB", GIB + GIB // 2),
        ("1.5gib", GIB + GIB // 2),
        ("1.5GIB", GIB + GIB // 2),
        ("3 MiB", 3 * MIB),
        ("2TiB", 2 * TIB),
        ("1.5 Mi", MIB + MIB // 2),
        ("4Gi", 4 * GIB),
        # bare K/M/G/T are binary (documented choice)
        ("4G", 4 * GIB),
        ("4g", 4 * GIB),
        ("8 M", 8 * MIB),
        ("1k", KIB),
        ("1T", TIB),
        # decimal units
        ("800MB", 800_000_000),
        ("800mb", 800_000_000),
        ("1.5 GB", 1_500_000_000),
        ("1.5 Gb", 1_500_000_000),  # 'b' is bytes, never bits
        ("3 KB", 3000),
        ("1TB", 10**12),
        ("2.5e3 KB", 2_500_000),
        ("1e-3 KB", 1),
        ("1.0000001 KiB", 1024),  # rounded down
    ],
)
def test_parse_table(budget, expected):
    result = parse_budget(budget)
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "budget, error, fragment",
    [
        (0, ValueError, "is zero"),
        (-1, ValueError, "is negative"),
        (0.0, ValueError, "is zero"),
        (-2.5, ValueError, "is negative"),
        (0.5, ValueError, "less than one byte"),
        (math.nan, ValueError, "not finite"),
        (math.inf, ValueError, "not finite"),
        (-math.inf, ValueError, "not finite"),
        (np.float64("nan"), ValueError, "not finite"),
        (True, TypeError, "is a bool"),
        (False, TypeError, "is a bool"),
        (np.bool_(True), TypeError, "is a bool"),
        (None, TypeError, "NoneType"),
        ([1], TypeError, "list"),
        (b"1GiB", TypeError, "bytes"),
        ("", ValueError, "Cannot parse"),
        ("abc", ValueError, "Cannot parse"),
        ("GiB", ValueError, "Cannot parse"),
        ("nan", ValueError, "Cannot parse"),
        ("inf", ValueError, "Cannot parse"),
        ("1e3.5", ValueError, "Cannot parse"),
        ("1__000", ValueError, "Cannot parse"),
        ("_1000", ValueError, "Cannot parse"),
        ("1,000", ValueError, "Cannot parse"),
        ("1 GiB 2", ValueError, "Cannot parse"),
        ("1 XB", ValueError, "Unknown unit 'XB'"),
        ("1 kbit", ValueError, "Unknown unit 'kbit'"),
        ("1 GiBs", ValueError, "Unknown unit"),
        ("0", ValueError, "is zero"),
        ("0 GiB", ValueError, "is zero"),
        ("-5GiB", ValueError, "is negative"),
        ("0.1", ValueError, "less than one byte"),
        ("1e-4 KB", ValueError, "less than one byte"),
        ("1e999999999", ValueError, "sensible range"),
        ("1e-999999999", ValueError, "sensible range"),
    ],
)
def test_errors_show_value_and_examples(budget, error, fragment):
    with pytest.raises(error) as info:
        parse_budget(budget)
    message = str(info.value)
    assert fragment in message
    assert repr(budget) in message  # the bad value is shown...
    assert "'1.5GiB'" in message and "'800MB'" in message  # ...with valid examples


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=10**15),
    st.sampled_from(
        [("", 1), ("KiB", KIB), ("MiB", MIB), ("GiB", GIB), ("KB", 1000), ("MB", 10**6), ("G", GIB)]
    ),
)
def test_integer_strings_are_exact(n, unit):
    suffix, factor = unit
    assert parse_budget(f"{n}{suffix}") == n * factor
    assert parse_budget(f"{n:_} {suffix.lower()}") == n * factor


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=1.0, max_value=2.0**52, allow_nan=False, allow_infinity=False))
def test_floats_round_down(x):
    assert parse_budget(x) == math.floor(x)
    # below 2**53 the shortest repr() of a float has the same integer part as the float
    assert parse_budget(repr(x)) == math.floor(x)
    assert parse_budget(x * 1e10) == math.floor(x * 1e10)


def test_format_bytes_is_the_solver_one():
    assert format_bytes is errors.format_bytes
    assert parse_budget(format_bytes(3 * GIB).replace(" ", "")) == 3 * GIB


def test_relative_budgets_resolve_against_the_no_remat_memory():
    from jaxremat.budget import check_budget, resolve_budget

    assert check_budget("40%") == "40%"
    assert check_budget("1KiB") == 1024
    assert resolve_budget("40%", 1000.0) == 400
    assert resolve_budget(" 150 %", 1000.0) == 1500
    assert resolve_budget("2KiB", 1000.0) == 2048
    for bad in ("0%", "-5%", "abc%", "nan%", "%"):
        with pytest.raises(ValueError, match="percentage"):
            check_budget(bad)
    with pytest.raises(ValueError, match="no budget"):
        check_budget(None)


def test_remat_sequence_takes_a_relative_budget():
    import jax
    import jax.numpy as jnp

    import jaxremat

    layers = [lambda w, x: jnp.tanh(x @ w)] * 6
    params = [jnp.eye(32) * 0.5] * 6
    x = jnp.ones((16, 32))
    full = jaxremat.remat_sequence(layers, "100%").plan(params, x)
    half = jaxremat.remat_sequence(layers, "50%").plan(params, x)
    assert full.budget == int(full.no_remat_peak)
    assert half.budget == int(0.5 * half.no_remat_peak)
    assert half.predicted_peak <= half.budget < full.predicted_peak
    seq = jaxremat.remat_sequence(layers, "50%")
    grads = jax.grad(lambda p: jnp.sum(seq(p, x)))(params)
    expected = jax.grad(lambda p: jnp.sum(_plain(layers, p, x)))(params)
    for g, e in zip(grads, expected):
        assert jnp.allclose(g, e, atol=1e-6)


def _plain(layers, params, x):
    for layer, p in zip(layers, params):
        x = layer(p, x)
    return x


def test_a_share_over_100_percent_means_no_remat_and_the_plan_says_so():
    import jax.numpy as jnp

    import jaxremat

    layers = [lambda w, x: jnp.tanh(x @ w)] * 4
    params = [jnp.eye(16) * 0.5] * 4
    x = jnp.ones((8, 16))
    roomy = jaxremat.remat_sequence(layers, "150%").plan(params, x)
    assert roomy.budget == int(1.5 * roomy.no_remat_peak)
    assert roomy.forward_counts == [1] * 4  # every tape stored
    assert roomy.exceeds_no_remat and "exceeds what the plain sequence needs" in str(roomy)
    exact = jaxremat.remat_sequence(layers, "100%").plan(params, x)
    assert not exact.exceeds_no_remat and "exceeds" not in str(exact)
    tight = jaxremat.remat_sequence(layers, "60%").plan(params, x)
    assert not tight.exceeds_no_remat and max(tight.forward_counts) > 1


@pytest.mark.parametrize("bad", ["0%", "-5%", "lots%", "0.0 %"])
def test_a_share_of_zero_or_not_a_number_names_the_fix(bad):
    import jax.numpy as jnp

    import jaxremat

    with pytest.raises(ValueError, match=r"positive percentage .* e\.g\. '40%'; or give bytes"):
        jaxremat.remat_sequence([lambda w, x: x @ w], bad)
    with pytest.raises(ValueError, match="positive percentage"):
        jaxremat.remat_graph(lambda w, x: jnp.tanh(x @ w), bad)


def test_remat_graph_takes_shares_and_notes_a_budget_over_the_plain_memory():
    import jax.numpy as jnp

    import jaxremat

    fn = lambda p, x: jnp.tanh(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1]) @ p[2])  # noqa: E731
    params = [jnp.eye(16) * 0.5] * 3
    x = jnp.ones((8, 16))
    plain = jaxremat.activation_memory(lambda p, x: jnp.sum(fn(p, x)), params, x)
    roomy = jaxremat.remat_graph(fn, "150%").plan(params, x)
    assert roomy.budget == int(1.5 * plain) and roomy.measured == plain
    assert "nothing is recomputed" in str(roomy)
    tight = jaxremat.remat_graph(fn, "85%").plan(params, x)
    assert tight.measured <= tight.budget == int(0.85 * plain)
    assert "nothing is recomputed" not in str(tight)
