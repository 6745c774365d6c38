"""The polynomial timing model, against hand-computed values of the reference polynomials."""

import pytest

from dyn.plugins.mocker.timing import decode_ms, pass_ms, prefill_ms


def test_prefill_polynomial():
    assert prefill_ms(0) == 0.0
    # 4.209989e-07*1e6 + 1.518344e-02*1000 + 16.50142
    assert prefill_ms(1000) == pytest.approx(32.1058589)
    # 4.209989e-07*4096^2 + 1.518344e-02*4096 + 16.50142
    assert prefill_ms(4096) == pytest.approx(7.0632718 + 62.19137 + 16.50142, rel=1e-6)


def test_decode_polynomial():
    assert decode_ms(0.0) == pytest.approx(5.74)
    assert decode_ms(0.5) == pytest.approx(26.31)  # -6.435 + 27.005 + 5.74
    assert decode_ms(1.0) == pytest.approx(34.01)
    assert decode_ms(1.7) == decode_ms(1.0)
    assert decode_ms(-0.2) == decode_ms(0.0)


def test_pass_sums_and_scales():
    assert pass_ms(0, False, 0.9) == 0.0
    assert pass_ms(1000, False, 0.5) == pytest.approx(32.1058589)
    assert pass_ms(0, True, 0.5) == pytest.approx(26.31)
    assert pass_ms(1000, True, 0.5) == pytest.approx(32.1058589 + 26.31)
    # prefill / 2, decode / (2 * 4)
    assert pass_ms(1000, True, 0.5, 2.0, 4.0) == pytest.approx(16.05292945 + 3.28875)


def test_non_positive_ratio_means_no_scaling():
    assert pass_ms(1000, True, 0.5, 0.0, 0.0) == pytest.approx(32.1058589 + 26.31)
    assert pass_ms(1000, True, 0.5, -1.0, 2.0) == pytest.approx(32.1058589 + 26.31 / 2)
    assert pass_ms(1000, True, 0.5, 2.0, -3.0) == pytest.approx(32.1058589 / 2 + 26.31 / 2)
