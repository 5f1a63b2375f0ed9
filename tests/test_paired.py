"""attn_np.instruments.paired: the verdicts of a paired timing, on
synthetic rounds (no timing is asserted), and the chapter instruments
built on it run end to end on tiny sizes."""

import numpy as np
import pytest

from attn_np.instruments.paired import (
    NOISY,
    Paired,
    compare,
    repeated,
    spread_text,
)


def _paired(base, twin, **others):
    times = {"base": np.asarray(base, float), **others}
    times["base (A/A)"] = np.asarray(twin, float)
    times = {k: np.asarray(v, float) for k, v in times.items()}
    return Paired(times, "base", "base (A/A)")


BASE = [1.00, 1.02, 0.99, 1.01, 1.00, 0.98, 1.01]
TWIN = [1.01, 1.00, 1.00, 1.02, 0.99, 0.99, 1.00]


def test_a_ratio_outside_the_floor_is_beyond_the_noise():
    p = _paired(BASE, TWIN, fast=np.multiply(BASE, 0.5))
    assert not p.noisy
    assert p.verdict("fast") == "faster beyond the noise"
    assert p.ratio("fast")[0] == pytest.approx(0.5)
    p = _paired(BASE, TWIN, slow=np.multiply(BASE, 1.5))
    assert p.verdict("slow") == "slower beyond the noise"


def test_a_ratio_inside_the_floor_is_within_the_noise():
    same = [1.00, 0.99, 1.01, 1.00, 1.01, 0.99, 1.00]
    p = _paired(BASE, TWIN, same=same)
    assert p.verdict("same") == "within the noise"


def test_expect_moves_the_reference_and_words_name_the_outcomes():
    p = _paired(BASE, TWIN, four=np.multiply(BASE, 4.0))
    assert p.verdict("four", expect=4.0) == "within the noise"
    words = ("below x4", "above x4")
    assert p.verdict("four", expect=3.0, words=words) == (
        "above x4 beyond the noise"
    )
    assert p.verdict("four", expect=5.0, words=words) == (
        "below x4 beyond the noise"
    )


def test_a_wide_floor_is_reported_with_its_width():
    twin = np.multiply(BASE, [1, 1.5, 0.6, 1.4, 0.7, 1, 1.3])
    p = _paired(BASE, twin, fast=np.multiply(BASE, 0.5))
    assert max(1 - p.floor[1], p.floor[2] - 1) > NOISY
    assert p.noisy
    # said once, on the floor's line, so that result lines stay short
    assert p.verdict("fast") == "faster beyond the noise"
    assert f"differences under {p.spread:.0%}" in p.floor_line()
    assert "noisy" not in (p.verdict("fast") + p.floor_line()).lower()


def test_ratio_over_another_contender():
    a = np.multiply(BASE, 2.0)
    p = _paired(BASE, TWIN, a=a, b=np.multiply(BASE, 4.0))
    assert p.ratio("b", "a")[0] == pytest.approx(2.0)
    assert "b / a" in p.line("b", "a")


def test_compare_times_every_contender_and_the_twin():
    calls = {"a": 0, "b": 0}

    def count(name):
        def fn():
            calls[name] += 1

        return fn

    p = compare({"a": count("a"), "b": count("b")}, baseline="a", rounds=3)
    assert set(p.times) == {"a", "b", "a (A/A)"}
    assert all(len(t) == 3 for t in p.times.values())
    # a: warm-up + 3 rounds, twice (itself and its twin); b: warm-up + 3
    assert calls == {"a": 8, "b": 4}


def test_repeated_calls_n_times_and_refuses_a_bad_count():
    n = []
    repeated(lambda: n.append(1), 5)()
    assert len(n) == 5
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="times"):
            repeated(lambda: None, bad)


def test_compare_names_a_bad_baseline():
    with pytest.raises(ValueError, match="baseline"):
        compare({"a": lambda: None}, baseline="b")


def test_spread_text():
    assert spread_text((0.891, 0.85, 0.934)) == "0.89 [0.85-0.93]"


def test_chapter_instruments_run_on_tiny_sizes():
    from attn_np.instruments.flash_parts import (
        layer_speed,
        layer_speed_report,
        speedup_parts,
        speedup_parts_report,
    )
    from attn_np.instruments.mha_timing import (
        layer_rates,
        layer_rates_report,
        naive_ratio,
    )

    p, f = speedup_parts(512, n_heads=2, d_k=8, rounds=1)
    lines = speedup_parts_report(p, f)
    assert lines[1].startswith("noise floor") and len(lines) == 13
    bq, bk = f["tile"]
    if bq == bk and 512 % bq == 0:  # n (n + 1) / 2 of n^2 square tiles
        n = 512 // bq
        assert f["skip FLOPs"] == pytest.approx((n + 1) / (2 * n))
    p, f = layer_speed(64, d_model=16, n_heads=2, rounds=1)
    assert "flash / dense" in layer_speed_report(p, f)[1]
    rates = layer_rates([32], d_model=16, n_heads=2, rounds=1)
    assert len(layer_rates_report(rates)) == 2
    assert set(naive_ratio(32, d_model=16, n_heads=2, rounds=1).times) == {
        "layer",
        "naive",
        "layer (A/A)",
    }
