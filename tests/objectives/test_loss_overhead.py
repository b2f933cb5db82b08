"""The loss's per-call shortcuts give the results of the general path.

ACERLoss evaluates the averaged policy on a persistent copy holding the target
parameters and solves short Retrace windows in matrix form;
under ``torch.compile`` it pads the mid-row truncations to a static bound. Each
shortcut is compared here with the path it replaces, and the compiled loss is
checked to be one graph.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
from builders import discrete_actor_critic, random_batch
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss
from torchrl_acer.objectives.value import retrace as _window
from torchrl_acer.objectives.value.functional import (
    _hillis_steele_scan,
    _matrix_scan,
)
from torchrl_acer.objectives.value.retrace import ObservationWindow

TERMS = ("loss_objective", "loss_critic", "loss_entropy")


def general(loss: ACERLoss) -> ACERLoss:
    """``loss`` with its averaged policy on a fresh copy at every call (no cache)."""

    def fresh_copy(params):
        actor = copy.deepcopy(evaluator.actor_network)
        params.to_module(actor)
        return actor

    for evaluator in evaluators(loss):
        evaluator._average_actor = fresh_copy
    return loss


def evaluators(loss: ACERLoss):
    # the estimator's: policy, critic and averaged policy
    return (loss.value_estimator.evaluator,)


def run(loss, data):
    for p in loss.parameters():
        p.grad = None
    out = loss(data)
    sum(out[t] for t in TERMS).backward()
    grads = [p.grad.clone() for p in loss.parameters()]
    return out.detach(), grads, loss.trust_region_stats


def perturb_average(loss, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in loss.target_actor_network_params.values(True, True):
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype))


def sequential_scan(delta, decay):
    out, acc = torch.zeros_like(delta), torch.zeros_like(delta[0])
    for t in reversed(range(delta.shape[0])):
        acc = delta[t] + decay[t] * acc
        out[t] = acc
    return out


def test_averaged_policy_follows_soft_update_device_moves_and_loading():
    """The averaged policy's persistent copy holds the target parameters: it sees
    SoftUpdate's in-place steps, a dtype move of the loss and a loaded state."""
    actor, critic = discrete_actor_critic()
    loss = ACERLoss(actor, critic)
    reference = general(copy.deepcopy(loss))
    updater, ref_updater = SoftUpdate(loss, eps=0.5), SoftUpdate(reference, eps=0.5)
    data = random_batch(2, 5)

    def step(module, upd):
        with torch.no_grad():
            for p in module.actor_network_params.values(True, True):
                p.add_(0.3)
        upd.step()

    assert loss(data)["kl_avg"] == 0  # the target starts as the actor's copy
    for _ in range(2):
        step(loss, updater)
        step(reference, ref_updater)
        kl = loss(data)["kl_avg"]
        assert kl > 0
        torch.testing.assert_close(kl, reference(data)["kl_avg"])
    state = copy.deepcopy(reference.state_dict())
    fresh = ACERLoss(*discrete_actor_critic(seed=5))
    fresh(data)  # the copy exists before loading
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(data)["kl_avg"], reference(data)["kl_avg"])
    loss.float()
    reference.float()
    data32 = data.apply(lambda x: x.float() if x.is_floating_point() else x)
    torch.testing.assert_close(loss(data32)["kl_avg"], reference(data32)["kl_avg"])
    # state dict keys are those of the general path
    assert list(loss.state_dict()) == list(reference.state_dict())


def test_averaged_policy_follows_train_and_eval():
    torch.manual_seed(0)
    actor, critic = discrete_actor_critic()
    actor.module[0].module.insert(1, torch.nn.Dropout(0.5))
    loss = ACERLoss(actor, critic)
    data = random_batch(2, 5)
    assert loss(data)["kl_avg"] > 0  # dropout on both passes
    # (a LossModule does not hold its networks as submodules: loss.eval() does
    # not reach them)
    actor.eval()
    assert loss(data)["kl_avg"] == 0
    actor.train()
    assert loss(data)["kl_avg"] > 0


@pytest.mark.parametrize("T", [1, 2, 5, 20, 32])
def test_matrix_scan_equals_sequential_loop(T):
    g = torch.Generator().manual_seed(T)
    delta = torch.randn(T, 3, 2, generator=g, dtype=torch.float64)
    decay = torch.rand(T, 3, 2, generator=g, dtype=torch.float64)
    decay = decay * (torch.rand(T, 3, 2, generator=g) > 0.2)  # episode ends
    expected = sequential_scan(delta, decay)
    torch.testing.assert_close(_matrix_scan(delta, decay), expected)
    torch.testing.assert_close(_hillis_steele_scan(delta, decay), expected)


def test_matrix_scan_keeps_non_finite_values_to_their_past():
    delta = torch.tensor([1.0, 2.0, float("inf"), 3.0], dtype=torch.float64)
    decay = torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64)
    out = _matrix_scan(delta, decay)
    torch.testing.assert_close(out, sequential_scan(delta, decay), equal_nan=True)
    # the steps after the infinity do not see it (their weight on it is a zero
    # of the mask, and 0 * inf would be NaN)
    assert out[:3].isinf().all() and out[3] == 3.0


def test_hyperparameters_changed_in_place_are_used():
    actor, critic = discrete_actor_critic()
    loss = ACERLoss(actor, critic)
    data = random_batch(2, 5)
    before = loss(data)["loss_critic"]
    with torch.no_grad():
        loss.value_estimator.gamma.fill_(0.5)
    after = loss(data)["loss_critic"]
    expected = ACERLoss(*discrete_actor_critic())
    expected.make_value_estimator(gamma=0.5)
    torch.testing.assert_close(after, expected(data)["loss_critic"])
    assert before != after


class TestFoldedChecks:
    """With several faults, the error is the one the first failing check raises
    alone, in the order action, behaviour logits, reward, behaviour
    log-probability."""

    def setup_method(self):
        self.loss = ACERLoss(*discrete_actor_critic())

    def test_every_fault_at_once_reports_the_action(self):
        data = random_batch(2, 4)
        data["action"][1, 2] = 7
        data["logits"][0, 0, 0] = float("nan")
        data["next", "reward"][0, 1] = float("inf")
        data["action_log_prob"][0, 3] = float("nan")
        with pytest.raises(ValueError, match="action 7 at index"):
            self.loss(data)

    @pytest.mark.parametrize(
        "fault, message",
        [
            (("logits", (0, 0, 0)), "'logits' holds 1 non-finite values"),
            (("next", "reward"), re.escape("'reward') holds 1 non-finite")),
            (("action_log_prob", (0, 3)), "'action_log_prob' holds 1 non-finite"),
        ],
    )
    def test_each_fault_names_its_entry(self, fault, message):
        data = random_batch(2, 4)
        if fault[0] == "next":
            data["next", "reward"][0, 1] = float("inf")
        else:
            data[fault[0]][fault[1]] = float("nan")
        with pytest.raises(ValueError, match=message):
            self.loss(data)

    @pytest.mark.parametrize(
        "row", [[0, 0, 0, 0], [1, 1, 0, 0], [2, 0, 0, 0], [0, -1, 0, 0]]
    )
    def test_not_one_hot_action(self, row):
        loss = ACERLoss(*discrete_actor_critic(one_hot=True))
        data = random_batch(2, 4, one_hot=True)
        data["action"][0, 1] = torch.tensor(row)
        with pytest.raises(ValueError, match="not one-hot"):
            loss(data)

    def test_finite_values_whose_sum_overflows_are_not_refused(self):
        # the finiteness check reads one sum back; an overflowing sum of finite
        # values is looked at entry by entry
        data = random_batch(2, 4)
        reward = data["next", "reward"]
        reward[:] = torch.finfo(reward.dtype).max / 2
        assert torch.isinf(data["next", "reward"].sum())
        self.loss.value_estimator(data)
        data["next", "reward"][1, 2] = float("nan")
        with pytest.raises(ValueError, match=re.escape("'reward') holds 1 non-finite")):
            self.loss.value_estimator(data)


def unchecked_loss(seed=0, **kwargs):
    actor, critic = discrete_actor_critic(seed=seed)
    loss = ACERLoss(actor, critic, trust_region_delta=0.01, **kwargs)
    loss.make_value_estimator(gamma=0.99, check_values=False)
    perturb_average(loss)
    return loss


@pytest.mark.parametrize("reduction", [None, "sum"])
def test_compiled_loss_is_one_graph(reduction):
    """With check_values=False the default path compiles with fullgraph=True:
    a graph break fails this test. Mid-row truncations (two, under a bound of
    three rows) take the padded static window."""
    torch._dynamo.reset()
    data = random_batch(3, 5, dones=[(0, 1), (2, 3)], terminations=[(1, 2)])
    loss = unchecked_loss(reduction=reduction)
    expected = run(loss, data)
    got = run(torch.compile(loss, backend="aot_eager", fullgraph=True), data)
    for key in expected[0].keys():
        torch.testing.assert_close(got[0][key], expected[0][key])
    torch.testing.assert_close(got[1], expected[1])
    assert expected[2]["active_fraction"] > 0
    torch.testing.assert_close(got[2], expected[2])


def test_compiled_window_refuses_more_truncations_than_its_bound():
    torch._dynamo.reset()
    data = random_batch(2, 5, dones=[(0, 1), (0, 2), (1, 3)])  # 3 > 2 rows
    loss = unchecked_loss()
    with pytest.raises(RuntimeError, match="at most 2 mid-row truncations"):
        torch.compile(loss, backend="aot_eager", fullgraph=True)(data)


def test_static_window_split_equals_exact_split(monkeypatch):
    data = random_batch(2, 5, dones=[(0, 1), (1, 3)], terminations=[(0, 3)])
    done = data["next", "done"].squeeze(-1)
    terminated = data["next", "terminated"].squeeze(-1)

    def window():
        return ObservationWindow(
            data,
            ["observation"],
            done=done,
            terminated=terminated,
        )

    exact = window()
    monkeypatch.setattr(_window, "is_compiling", lambda: True)
    static = window()
    assert (exact.num_extra, static.num_extra) == (2, 2)
    # s'_t of a termination is not needed (its value is multiplied by zero)
    kept = ~data["next", "terminated"]
    for w in (exact, static):
        values = w.inputs["observation"].sum(-1, keepdim=True)
        current, nxt = w.split(values)
        torch.testing.assert_close(current, data["observation"].sum(-1, True))
        expected = data["next", "observation"].sum(-1, True)
        torch.testing.assert_close(nxt[kept], expected[kept])
