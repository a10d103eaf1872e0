"""Automatic garbage collection is paused while a sequence is profiled, and restored after
(jaxremat.collector): on, or off where the user had it off; nested and failing profiles too."""

from __future__ import annotations

import gc
import threading

import jax.numpy as jnp
import pytest

from jaxremat.collector import paused
from jaxremat.sequence.profile import profile_cache, profile_sequence


def _layer(p, x):
    return jnp.tanh(x @ p)


def test_paused_inside_a_profile_and_restored_after():
    seen = []

    def layer(p, x):
        seen.append(gc.isenabled())
        return _layer(p, x)

    profile_cache().clear()
    assert gc.isenabled()
    profile_sequence([layer], [jnp.ones((4, 4))], jnp.ones((2, 4)), policies=())
    assert seen and not any(seen)
    assert gc.isenabled()


def test_a_user_who_turned_it_off_keeps_it_off():
    gc.disable()
    try:
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_and_failing_blocks_restore_it():
    with pytest.raises(ValueError):
        with paused():
            with paused():
                assert not gc.isenabled()
            assert not gc.isenabled()  # the outer block still holds the pause
            raise ValueError("a profile that fails")
    assert gc.isenabled()


def test_concurrent_blocks_share_one_pause():
    inside, release = threading.Barrier(3), threading.Event()

    def hold():
        with paused():
            inside.wait()
            release.wait()

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    inside.wait()
    assert not gc.isenabled()
    release.set()
    for t in threads:
        t.join()
    assert gc.isenabled()
