"""retrace_lambda_return_estimate beyond tests/upstream/test_retrace_upstream.py
(which checks it against the references, TD(lambda) and TD(0), through autograd
and on its arguments): leading dimensions, float64 precision end to end, and the
scans it is built on.
"""

import pytest
import torch
from builders import retrace, retrace_inputs
from reference import retrace_backward_loop

from torchrl_acer.objectives.value.functional import _reverse_discounted_scan


def test_leading_batch_and_feature_dims():
    x = retrace_inputs(2, 3, 8, 4, seed=7)
    got = retrace(0.9, 1.0, x)
    assert got.shape == (2, 3, 8, 4)
    for i in range(2):
        for j in range(3):
            for f in range(4):
                xi = {k: v[i, j, :, f : f + 1] for k, v in x.items()}
                torch.testing.assert_close(
                    got[i, j, :, f : f + 1],
                    retrace_backward_loop(0.9, 1.0, **xi),
                    rtol=1e-12,
                    atol=1e-12,
                )


@pytest.mark.parametrize("B, T", [(2, 50), (300, 500)])
def test_float64_end_to_end_precision(B, T):
    # float32 anywhere in the chain would leave an error around 1e-7
    x = retrace_inputs(B, T, 1, seed=10)
    expected = retrace_backward_loop(0.99, 1.0, **x)
    assert (retrace(0.99, 1.0, x) - expected).abs().max() < 1e-13


def test_reverse_scan_handles_zero_decay_exactly():
    delta = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    decay = torch.tensor([0.5, 0.0, 2.0, 0.5, 7.0], dtype=torch.float64)
    # A_4 = 5, A_3 = 4 + .5 * 5, A_2 = 3 + 2 A_3, A_1 = 2, A_0 = 1 + .5 * 2
    expected = torch.tensor([2.0, 2.0, 16.0, 6.5, 5.0], dtype=torch.float64)
    torch.testing.assert_close(_reverse_discounted_scan(delta, decay), expected)
