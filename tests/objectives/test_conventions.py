"""TorchRL's conventions for losses and value estimators, checked the way TorchRL checks
its own (``test/objectives/test_values.py``, ``test_ppo.py``/``test_a2c.py`` and
``test_loss_module.py`` in the pytorch/rl repository). Each test names the TorchRL
test it mirrors."""

import dataclasses
import gc
import io
import sys

import pytest
import torch
from builders import discrete_actor_critic, random_batch
from reference import retrace_backward_loop
from tensordict import TensorDict
from tensordict.nn import (
    ProbabilisticTensorDictSequential,
    TensorDictModule,
    TensorDictSequential,
)
from torch import distributions as D
from torch import nn
from torchrl.collectors import Collector
from torchrl.modules import ProbabilisticActor
from torchrl.testing.mocking_classes import ContinuousActionVecMockEnv

from torchrl_acer import ACERLoss, RetraceEstimator
from torchrl_acer.modules.models import gaussian_actor_sdn

MID_ROW = {"dones": [(0, 1), (1, 3)], "terminations": [(1, 1)]}


def estimator(**kwargs):
    actor, critic = discrete_actor_critic()
    return RetraceEstimator(
        gamma=0.9, actor_network=actor, value_network=critic, **kwargs
    )


def loss_and_batch(**kwargs):
    actor, critic = discrete_actor_critic()
    loss = ACERLoss(actor, critic, **kwargs)
    loss.make_value_estimator(gamma=0.9)
    return loss, random_batch(3, 5, **MID_ROW)


class TestEstimator:
    def test_value_network_keyword(self):
        # every TorchRL estimator takes the critic as value_network=
        actor, critic = discrete_actor_critic()
        est = RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
        assert est.value_network is critic
        with pytest.raises(TypeError, match="critic_network"):
            RetraceEstimator(gamma=0.9, actor_network=actor, critic_network=critic)
        with pytest.raises(TypeError, match="value_network"):
            RetraceEstimator(gamma=0.9, actor_network=actor)

    def test_diff_reward(self):
        # test_values.py::test_diff_reward: gradients reach the reward, never the
        # networks' parameters
        actor, critic = discrete_actor_critic()
        est = RetraceEstimator(
            gamma=0.9, actor_network=actor, value_network=critic, differentiable=True
        )
        data = random_batch(1, 10)
        data["next", "reward"].requires_grad_()
        out = est(data.clone(False))
        out["advantage"].sum().backward()
        for p in (*critic.parameters(), *actor.parameters()):
            assert p.grad is None or (p.grad == 0).all()
        assert data["next", "reward"].grad.norm() > 0

    @pytest.mark.parametrize("shifted", [True, False])
    def test_non_differentiable(self, shifted):
        # test_values.py::test_non_differentiable
        data = random_batch(1, 10)
        data["next", "reward"].requires_grad_()
        out = estimator(shifted=shifted)(data.clone(False))
        assert not out["advantage"].requires_grad
        assert not out["value_target"].requires_grad

    def test_keyword_call_returns_advantage_and_value_target(self):
        # test_values.py: ``advantage, value_target = module(**kwargs)``
        est = estimator()
        data = random_batch(2, 6, **MID_ROW)
        kwargs = {
            "observation": data["observation"],
            "action": data["action"],
            "action_log_prob": data["action_log_prob"],
            "next_observation": data["next", "observation"],
            "next_reward": data["next", "reward"],
            "next_done": data["next", "done"],
            "next_terminated": data["next", "terminated"],
        }
        out = est(**kwargs)
        assert len(out) == 2
        advantage, value_target = out
        expected = est(data.clone())
        torch.testing.assert_close(advantage, expected["advantage"])
        torch.testing.assert_close(value_target, expected["value_target"])

    def test_shifted_true_and_false_agree_on_collector_layout(self):
        # test_values.py (shifted GAE == unshifted GAE): with s'_t == s_{t+1}
        # inside episodes the single shifted call gives the same targets
        data = random_batch(3, 7, **MID_ROW)
        shifted = estimator(shifted=True)(data.clone())
        plain = estimator(shifted=False)(data.clone())
        for key in ("value_target", "advantage", "state_value"):
            torch.testing.assert_close(shifted[key], plain[key])

    def test_unshifted_is_exact_when_next_observation_is_not_the_next_step(self):
        # shifted=False makes no assumption about ("next", obs): each s'_t is
        # evaluated where it is (multi-step data). Reference: the backward loop on
        # the networks evaluated at every observation and next observation.
        data = random_batch(2, 5, seed=3)
        data["next", "observation"] = torch.randn_like(data["next", "observation"])
        est = estimator(shifted=False)
        actor, critic = est.actor_network, est.value_network
        with torch.no_grad():

            def policy_and_q(obs):
                td = TensorDict({"observation": obs}, obs.shape[:-1])
                logits = actor.get_dist_params(td.clone())["logits"]
                return logits.log_softmax(-1), critic(td.clone())["action_value"]

            log_pi, q = policy_and_q(data["observation"])
            next_log_pi, next_q = policy_and_q(data["next", "observation"])
            a = data["action"][..., None]
            expected = retrace_backward_loop(
                0.9,
                1.0,
                log_pi.gather(-1, a),
                data["action_log_prob"][..., None],
                q.gather(-1, a),
                (next_log_pi.exp() * next_q).sum(-1, keepdim=True),
                data["next", "reward"],
                data["next", "done"],
                data["next", "terminated"],
            )
        torch.testing.assert_close(est(data.clone())["value_target"], expected)
        shifted = estimator(shifted=True)(data.clone())["value_target"]
        assert not torch.allclose(shifted, expected)

    @pytest.mark.parametrize("skip_existing", [True, False, None])
    def test_skip_existing(self, skip_existing):
        # test_values.py::test_skip_existing: a critic writing zeros, the data
        # already holding ones; V(s) = sum_a pi(a|s) Q(s, a)
        actor, _ = discrete_actor_critic()
        critic = TensorDictModule(
            lambda x: torch.zeros(*x.shape[:-1], 4, dtype=x.dtype),
            ["observation"],
            ["action_value"],
        )
        est = RetraceEstimator(
            gamma=0.9,
            actor_network=actor,
            value_network=critic,
            skip_existing=skip_existing,
        )
        data = random_batch(1, 10)
        data["action_value"] = torch.ones(1, 10, 4, dtype=torch.float64)
        data["next", "action_value"] = torch.ones(1, 10, 4, dtype=torch.float64)
        out = est(data)
        expected = 1.0 if skip_existing else 0.0
        torch.testing.assert_close(
            out["state_value"], torch.full_like(out["state_value"], expected)
        )

    def test_skip_existing_never_reuses_the_behaviour_logits(self):
        # the stored logits are the behaviour policy's: the policy always runs
        data = random_batch(2, 5)
        reference = estimator()(data.clone())["value_target"]
        skipping = estimator(skip_existing=True)(data.clone())["value_target"]
        torch.testing.assert_close(skipping, reference)


class TestLoss:
    def test_reduction_none_is_mean(self):
        # test_ppo.py / test_a2c.py: reduction=None is the default, a mean
        loss, batch = loss_and_batch(reduction=None)
        mean_loss, _ = loss_and_batch(reduction="mean")
        out, expected = loss(batch.clone()), mean_loss(batch.clone())
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(out[key], expected[key])

    @pytest.mark.parametrize("name", ["entropy_coeff", "critic_coeff", "ratio_clip"])
    def test_coefficients_are_schedulable(self, name):
        # test_loss_module.py: _schedulable_buffers take a float in place
        loss, batch = loss_and_batch()
        buffer = getattr(loss, name)
        setattr(loss, name, 0.02)
        assert getattr(loss, name) is buffer and float(buffer) == 0.02
        assert name in dict(loss.named_buffers())

    def test_entropy_coeff_schedule_changes_the_loss(self):
        loss, batch = loss_and_batch()
        first = loss(batch.clone())
        loss.entropy_coeff = 2 * float(loss.entropy_coeff)
        second = loss(batch.clone())
        torch.testing.assert_close(second["loss_entropy"], 2 * first["loss_entropy"])

    @pytest.mark.parametrize("kind", ["l2", "l1", "smooth_l1"])
    def test_loss_critic_type_is_torchrls_distance_loss(self, kind):
        # l2 is F.mse_loss (no 1/2), as distance_loss everywhere in TorchRL
        loss, batch = loss_and_batch(loss_critic_type=kind, critic_coeff=0.7)
        out = loss(batch.clone())
        with torch.no_grad():
            est = loss.value_estimator(batch.clone())
            q = loss.critic_network(batch.clone())["action_value"]
            q_taken = q.gather(-1, batch["action"][..., None])
            error = est["value_target"] - q_taken
            distance = {
                "l2": error.pow(2),
                "l1": error.abs(),
                "smooth_l1": torch.where(
                    error.abs() < 1, 0.5 * error.pow(2), error.abs() - 0.5
                ),
            }[kind]
        torch.testing.assert_close(out["loss_critic"], 0.7 * distance.mean())

    def test_critic_coeff_none_drops_the_critic_term(self):
        # test_a2c.py: critic_coeff=None leaves no loss_critic
        loss, batch = loss_and_batch(critic_coeff=None)
        assert "loss_critic" not in loss.out_keys
        out = loss(batch)
        assert "loss_critic" not in out.keys()
        total = out["loss_objective"] + out["loss_entropy"]
        total.backward()
        for p in loss.critic_network_params.values(True, True):
            assert p.grad is None or (p.grad == 0).all()

    def test_loss_pickles_after_a_forward(self):
        # torch.save(loss) works for TorchRL's losses at any time, also after a
        # forward (the evaluator's caches hold weak references)
        loss, batch = loss_and_batch()
        expected = loss(batch.clone())
        buffer = io.BytesIO()
        torch.save(loss, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        out = loaded(batch.clone())
        for key in ("loss_objective", "loss_critic", "loss_entropy", "kl_avg"):
            torch.testing.assert_close(out[key], expected[key])

    def test_critic_writing_another_key(self):
        # the loss builds its estimator in __init__: a critic whose values are not
        # under "action_value" must be accepted (and set_keys can name another)
        actor, critic = discrete_actor_critic()
        renamed = TensorDictModule(critic.module, ["observation"], [("q", "values")])
        batch = random_batch(3, 5, **MID_ROW)
        expected = ACERLoss(actor, critic)(batch.clone())
        loss = ACERLoss(actor, renamed)
        assert loss.tensor_keys.action_value == ("q", "values")
        out = loss(batch.clone())
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(out[key], expected[key])
        with pytest.raises(KeyError, match="not an output of the critic"):
            loss.set_keys(action_value="action_value")

    def test_skip_existing_estimator_still_trains_the_critic(self):
        # the estimator may reuse stored critic outputs; the loss's critic term
        # needs them in its graph (TorchRL's losses always run their critic)
        loss, batch = loss_and_batch()
        expected = loss(batch.clone())
        loss.make_value_estimator(gamma=0.9, skip_existing=True)
        stale = batch.clone()
        stale["action_value"] = torch.zeros(3, 5, 4, dtype=torch.float64)
        stale["next", "action_value"] = torch.zeros(3, 5, 4, dtype=torch.float64)
        out = loss(stale)
        for key in ("loss_objective", "loss_critic", "loss_entropy"):
            torch.testing.assert_close(out[key], expected[key])
        out["loss_critic"].backward()
        for p in loss.critic_network_params.values(True, True):
            assert p.grad is not None and p.grad.abs().sum() > 0

    def test_accepted_keys_docstring_documents_every_key(self):
        # test_loss_module.py style: every _AcceptedKeys field is documented
        for cls in (ACERLoss, RetraceEstimator):
            doc = cls._AcceptedKeys.__doc__
            for field in dataclasses.fields(cls._AcceptedKeys):
                assert f"{field.name} (NestedKey)" in doc, (cls.__name__, field.name)


class TestRefused:
    def test_a_bare_torch_rnn_critic_is_refused(self):
        # TorchRL's LSTMModule / GRUModule are accepted (tests/objectives/test_recurrent.py);
        # a bare nn.LSTM would be run on independent steps
        actor, _ = discrete_actor_critic(dtype=torch.float32)
        core = TensorDictModule(nn.LSTM(3, 8), ["observation"], ["h"])
        name = "LSTM"
        critic = TensorDictSequential(
            core, TensorDictModule(nn.Linear(8, 4), ["h"], ["action_value"])
        )
        with pytest.raises(TypeError, match=name):
            ACERLoss(actor, critic)


def test_normal_policy_with_several_dimensions_from_a_collector():
    # torch.distributions.Normal gives collectors one log-probability per action
    # dimension; the loss sums them as IndependentNormal does
    torch.manual_seed(0)
    independent, critic = gaussian_actor_sdn(7, 7, num_cells=[16], fixed_scale=0.3)
    normal = ProbabilisticActor(
        independent.module[0],
        in_keys=["loc", "scale"],
        distribution_class=D.Normal,
        return_log_prob=True,
    )
    assert isinstance(normal, ProbabilisticTensorDictSequential)
    collector = Collector(
        ContinuousActionVecMockEnv(),
        normal,
        frames_per_batch=12,
        total_frames=12,
        auto_register_policy_transforms=False,
    )
    batch = next(iter(collector)).unsqueeze(0)
    collector.shutdown()
    assert batch["action_log_prob"].shape == (1, 12, 7)
    summed = batch.clone()
    summed["action_log_prob"] = batch["action_log_prob"].sum(-1)
    outputs = []
    for actor, data in ((normal, batch), (independent, summed)):
        loss = ACERLoss(actor, critic)
        loss.make_value_estimator(gamma=0.9)
        torch.manual_seed(1)  # the same action draws for the bias correction
        outputs.append(loss(data))
    for key in ("loss_objective", "loss_critic", "loss_entropy", "rho_mean"):
        torch.testing.assert_close(outputs[0][key], outputs[1][key])


def test_continuous_loss_critic_is_a_sum_of_squared_errors():
    # the V term is a regression to the paper's V_target, not a surrogate that
    # can be negative. A surrogate -sg(min(1, rho) (G - Q~)) V is negative where V
    # and G - Q~ share a sign and V is large: V near 50, rewards of 10.
    for seed in range(3):
        torch.manual_seed(seed)
        actor, critic = gaussian_actor_sdn(7, 7, num_cells=[16], fixed_scale=0.3)
        with torch.no_grad():
            list(critic.value_network.parameters())[-1].add_(50.0)
        collector = Collector(
            ContinuousActionVecMockEnv(),
            actor,
            frames_per_batch=16,
            total_frames=16,
            auto_register_policy_transforms=False,
        )
        batch = next(iter(collector)).unsqueeze(0)
        collector.shutdown()
        batch["next", "reward"] = torch.full_like(batch["next", "reward"], 10.0)
        loss = ACERLoss(actor, critic, reduction="none")
        loss.make_value_estimator(gamma=0.9)
        assert (loss(batch)["loss_critic"] >= 0).all()


def test_short_lived_losses_leave_no_module_state_behind():
    # no module-level cache may grow with the number of losses made
    def sizes():
        out = {}
        for name, module in list(sys.modules.items()):
            if name.startswith("torchrl_acer"):
                for attr, value in vars(module).items():
                    if isinstance(value, (dict, list, set)):
                        out[name, attr] = len(value)
        return out

    def one_loss():
        loss, batch = loss_and_batch()
        loss(batch)

    one_loss()
    gc.collect()
    before = sizes()
    for _ in range(30):
        one_loss()
    gc.collect()
    after = sizes()
    grown = {k: (before.get(k), v) for k, v in after.items() if v > before.get(k, 0)}
    assert not grown, grown
