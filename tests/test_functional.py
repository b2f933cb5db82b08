import pytest
import torch
from reference import retrace_backward_loop, retrace_sum_definition
from torchrl.objectives.value.functional import td_lambda_return_estimate

from torchrl_acer import retrace_lambda_return_estimate
from torchrl_acer.objectives.value.functional import reverse_discounted_scan


def make_inputs(*shape, dtype=torch.float64, p_done=0.2, p_term=0.5, seed=0):
    """Random [*B, T, F] inputs with dones and terminations in the middle of rows."""
    g = torch.Generator().manual_seed(seed)

    def randn():
        return torch.randn(*shape, generator=g, dtype=dtype)

    done = torch.rand(*shape, generator=g) < p_done
    terminated = done & (torch.rand(*shape, generator=g) < p_term)
    return dict(
        # log-ratios spread around 0, so some traces are clipped and some are not
        log_pi=randn() * 0.7,
        log_mu=randn() * 0.7,
        q=randn(),
        next_v=randn(),
        reward=randn(),
        done=done,
        terminated=terminated,
    )


def ours(gamma, lmbda, x, **kwargs):
    return retrace_lambda_return_estimate(
        gamma,
        lmbda,
        x["log_pi"],
        x["log_mu"],
        x["q"],
        x["next_v"],
        x["reward"],
        x["done"],
        x["terminated"],
        **kwargs,
    )


def ref_args(x):
    keys = ("log_pi", "log_mu", "q", "next_v", "reward", "done", "terminated")
    return [x[k] for k in keys]


@pytest.mark.parametrize("c_thresh", [1.0, 0.5, 2.0])
@pytest.mark.parametrize("lmbda", [1.0, 0.8])
def test_retrace_matches_sum_definition(lmbda, c_thresh):
    x = make_inputs(3, 9, 2, seed=1)
    expected = retrace_sum_definition(0.9, lmbda, *ref_args(x), c_thresh=c_thresh)
    got = ours(0.9, lmbda, x, c_thresh=c_thresh)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 7, 64, 100, 1000])
@pytest.mark.parametrize("B", [5, 300])  # 300 x T >= 2**17 takes the blocked scan
def test_retrace_matches_backward_loop(T, B):
    x = make_inputs(B, T, 1, seed=T)
    expected = retrace_backward_loop(0.97, 1.0, *ref_args(x))
    torch.testing.assert_close(ours(0.97, 1.0, x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("with_dones", [False, True])
@pytest.mark.parametrize("lmbda", [1.0, 0.9])
def test_on_policy_retrace_equals_td_lambda(with_dones, lmbda):
    x = make_inputs(4, 30, 1, p_done=0.15 if with_dones else 0.0, seed=3)
    x["log_mu"] = x["log_pi"].clone()
    # Q(s_{t+1}, a_{t+1}) == V'_t inside an episode; what follows a done is unused
    not_done = ~x["done"][..., :-1, :]
    x["q"][..., 1:, :] = torch.where(
        not_done, x["next_v"][..., :-1, :], x["q"][..., 1:, :]
    )
    expected = td_lambda_return_estimate(
        0.95, lmbda, x["next_v"], x["reward"], x["done"], x["terminated"]
    )
    torch.testing.assert_close(ours(0.95, lmbda, x), expected, rtol=0, atol=1e-12)
    if with_dones:
        assert x["done"].any() and (x["done"] & ~x["terminated"]).any()


def test_lambda_zero_is_one_step_expected_sarsa():
    x = make_inputs(3, 12, 2, seed=4)
    expected = x["reward"] + 0.9 * (~x["terminated"]).double() * x["next_v"]
    torch.testing.assert_close(ours(0.9, 0.0, x), expected, rtol=0, atol=1e-12)


def test_ratios_above_c_thresh_saturate():
    x = make_inputs(2, 10, 1, p_done=0.0, seed=5)
    x["log_mu"] = x["log_pi"] - 3.0  # every ratio is e^3 > 1
    at_3 = ours(0.9, 1.0, x)
    x["log_mu"] = x["log_pi"] - 30.0  # every ratio is e^30
    at_30 = ours(0.9, 1.0, x)
    x["log_mu"] = x["log_pi"]  # every ratio is exactly 1 = c_thresh
    at_1 = ours(0.9, 1.0, x)
    torch.testing.assert_close(at_3, at_1, rtol=0, atol=1e-12)
    torch.testing.assert_close(at_30, at_1, rtol=0, atol=1e-12)
    # with a larger threshold the large ratios count, and the trace explodes
    x["log_mu"] = x["log_pi"] - 30.0
    assert (ours(0.9, 1.0, x, c_thresh=float("inf")) - at_1).abs().max() > 1e6


def test_truncation_bootstraps_and_termination_does_not():
    T = 6
    x = make_inputs(1, T, 1, p_done=0.0, seed=6)
    x["log_mu"] = x["log_pi"].clone()
    t = 2
    x["done"][0, t, 0] = True
    truncated = ours(0.9, 1.0, x)
    x["terminated"][0, t, 0] = True
    terminated = ours(0.9, 1.0, x)
    r, v = x["reward"][0, t, 0], x["next_v"][0, t, 0]
    torch.testing.assert_close(truncated[0, t, 0], r + 0.9 * v)
    torch.testing.assert_close(terminated[0, t, 0], r)
    # in both cases nothing after the done reaches the steps before it
    x2 = {k: v.clone() for k, v in x.items()}
    x2["reward"][0, t + 1 :] += 100.0
    x2["q"][0, t + 1 :] -= 50.0
    torch.testing.assert_close(ours(0.9, 1.0, x2)[0, : t + 1], terminated[0, : t + 1])


def test_leading_batch_and_feature_dims():
    x = make_inputs(2, 3, 8, 4, seed=7)
    got = ours(0.9, 1.0, x)
    assert got.shape == (2, 3, 8, 4)
    for i in range(2):
        for j in range(3):
            for f in range(4):
                xi = {k: v[i, j, :, f : f + 1] for k, v in x.items()}
                torch.testing.assert_close(
                    got[i, j, :, f : f + 1],
                    retrace_backward_loop(0.9, 1.0, *ref_args(xi)),
                    rtol=1e-12,
                    atol=1e-12,
                )


@pytest.mark.parametrize("time_dim", [0, 1, -3])
def test_time_dim_equivalence(time_dim):
    x = make_inputs(3, 11, 2, seed=8)  # time at -2
    expected = ours(0.9, 1.0, x)
    moved = {k: v.movedim(-2, time_dim) for k, v in x.items()}
    got = ours(0.9, 1.0, moved, time_dim=time_dim)
    torch.testing.assert_close(got, expected.movedim(-2, time_dim), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_is_preserved(dtype):
    x = make_inputs(2, 5, 1, dtype=dtype, seed=9)
    assert ours(0.9, 1.0, x).dtype == dtype
    # tensor hyper-parameters of another dtype do not promote the result
    gamma = torch.tensor(0.9, dtype=torch.float64)
    lmbda = torch.tensor(1.0, dtype=torch.float32)
    assert ours(gamma, lmbda, x).dtype == dtype


@pytest.mark.parametrize("B, T", [(2, 50), (300, 500)])
def test_float64_end_to_end_precision(B, T):
    # float32 anywhere in the chain would leave an error around 1e-7
    x = make_inputs(B, T, 1, seed=10)
    expected = retrace_backward_loop(0.99, 1.0, *ref_args(x))
    assert (ours(0.99, 1.0, x) - expected).abs().max() < 1e-13


def test_per_step_gamma_and_lambda():
    x = make_inputs(2, 7, 1, seed=11)
    gamma = torch.rand(2, 7, 1, dtype=torch.float64) * 0.5 + 0.5
    lmbda = torch.rand(2, 7, 1, dtype=torch.float64)
    # a plain per-step loop with gamma_t and c_t = lmbda_t min(1, rho_t)
    c = lmbda * torch.clamp((x["log_pi"] - x["log_mu"]).exp(), max=1.0)
    nt, nd = (~x["terminated"]).double(), (~x["done"]).double()
    expected = torch.empty_like(x["q"])
    g = x["reward"][:, -1] + gamma[:, -1] * nt[:, -1] * x["next_v"][:, -1]
    expected[:, -1] = g
    for t in range(5, -1, -1):
        g = x["reward"][:, t] + gamma[:, t] * nt[:, t] * (
            x["next_v"][:, t] + nd[:, t] * c[:, t + 1] * (g - x["q"][:, t + 1])
        )
        expected[:, t] = g
    torch.testing.assert_close(ours(gamma, lmbda, x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("B, T", [(2, 13), (700, 200)])  # both forms of the scan
def test_gradients_flow_like_the_loop(B, T):
    x = make_inputs(B, T, 1, seed=12)
    q1 = x["q"].clone().requires_grad_()
    v1 = x["next_v"].clone().requires_grad_()
    w = torch.randn_like(q1)
    (ours(0.9, 1.0, {**x, "q": q1, "next_v": v1}) * w).sum().backward()
    q2 = x["q"].clone().requires_grad_()
    v2 = x["next_v"].clone().requires_grad_()
    args = ref_args({**x, "q": q2, "next_v": v2})
    (retrace_backward_loop(0.9, 1.0, *args) * w).sum().backward()
    torch.testing.assert_close(q1.grad, q2.grad)
    torch.testing.assert_close(v1.grad, v2.grad)


def test_blocked_and_plain_scans_agree():
    from torchrl_acer.objectives.value.functional import (
        _blocked_scan,
        _hillis_steele_scan,
    )

    g = torch.Generator().manual_seed(0)
    for T in (64, 65, 99, 100, 257):
        delta = torch.randn(T, 3, generator=g, dtype=torch.float64)
        decay = torch.rand(T, 3, generator=g, dtype=torch.float64)
        decay[torch.rand(T, 3, generator=g) < 0.1] = 0.0
        torch.testing.assert_close(
            _blocked_scan(delta, decay), _hillis_steele_scan(delta, decay)
        )


def test_reverse_scan_handles_zero_decay_exactly():
    delta = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    decay = torch.tensor([0.5, 0.0, 2.0, 0.5, 7.0], dtype=torch.float64)
    # A_4 = 5, A_3 = 4 + .5 * 5, A_2 = 3 + 2 A_3, A_1 = 2, A_0 = 1 + .5 * 2
    expected = torch.tensor([2.0, 2.0, 16.0, 6.5, 5.0], dtype=torch.float64)
    torch.testing.assert_close(reverse_discounted_scan(delta, decay), expected)


def test_shape_mismatch_names_the_tensors():
    x = make_inputs(2, 5, 1, seed=13)
    x["reward"] = x["reward"][..., 0]
    with pytest.raises(ValueError, match=r"reward.*\(2, 5\)"):
        ours(0.9, 1.0, x)
    x = make_inputs(2, 5, 1, seed=13)
    with pytest.raises(ValueError, match="gamma, lmbda and c_thresh"):
        ours(torch.ones(3), 1.0, x)
