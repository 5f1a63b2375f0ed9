"""ATTN_NP_MAX_ROUNDS caps every timing loop (make nbval sets it to 1)."""

import pytest

from attn_np.instruments.measure import (
    alternating_times,
    capped_rounds,
    round_times,
)


def test_no_cap_without_the_variable(monkeypatch):
    monkeypatch.delenv("ATTN_NP_MAX_ROUNDS", raising=False)
    assert capped_rounds(7) == 7


def test_the_cap_holds_in_the_timing_loops(monkeypatch):
    monkeypatch.setenv("ATTN_NP_MAX_ROUNDS", "3")
    assert capped_rounds(7) == 3
    assert capped_rounds(2) == 2
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    assert all(len(t) == 3 for t in round_times(fns, rounds=9).values())
    assert all(
        len(t) == 3 for t in alternating_times(fns, rounds=9).values()
    )
    # one warm-up call each, then three rounds, in both functions
    assert calls.count("a") == 2 * (1 + 3)


@pytest.mark.parametrize("value", ["0", "-2", "three", "2.5"])
def test_a_bad_cap_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("ATTN_NP_MAX_ROUNDS", value)
    with pytest.raises(ValueError, match="ATTN_NP_MAX_ROUNDS"):
        capped_rounds(5)
