"""CategoricalActor samples as the ProbabilisticActor it replaces, bit for bit."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import (
    InteractionType,
    ProbabilisticTensorDictModule,
    TensorDictModule,
    TensorDictSequential,
    set_interaction_type,
)
from torch import distributions as D
from torchrl.collectors import Collector
from torchrl.envs import GymEnv
from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor

from torchrl_acer.modules.actors import CategoricalActor
from torchrl_acer.modules.models import mlp_actor_critic


def actors(distribution_class, num_actions=3, obs_dim=4):
    """A CategoricalActor and a ProbabilisticActor sharing one network."""
    net = MLP(in_features=obs_dim, out_features=num_actions, num_cells=[16])
    kwargs = dict(
        in_keys=["logits"], distribution_class=distribution_class, return_log_prob=True
    )
    lean = CategoricalActor(
        TensorDictModule(net, ["observation"], ["logits"]), **kwargs
    )
    reference = ProbabilisticActor(
        TensorDictModule(net, ["observation"], ["logits"]), **kwargs
    )
    return lean, reference


def run_both(lean, reference, td, mode=InteractionType.RANDOM, seed=3):
    """Both actors on copies of ``td`` from the same random state; also returns a
    draw made after each, to compare the random state they leave."""
    outs = []
    for actor in (lean, reference):
        torch.manual_seed(seed)
        with set_interaction_type(mode), torch.no_grad():
            out = actor(td.clone())
        outs.append((out, torch.rand(4)))
    return outs


def assert_same(a, b):
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in b.keys(True, True):
        assert a[key].dtype == b[key].dtype, key
        assert torch.equal(a[key], b[key]), key


@pytest.fixture
def built_distributions(monkeypatch):
    """The probabilistic modules that build a distribution, in call order."""
    called = []
    original = ProbabilisticTensorDictModule.get_dist

    def spy(self, *args, **kwargs):
        called.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProbabilisticTensorDictModule, "get_dist", spy)
    return called


@pytest.mark.parametrize("distribution_class", [OneHotCategorical, D.Categorical])
@pytest.mark.parametrize("batch", [[8], [3, 5], []])
def test_samples_as_the_probabilistic_actor(
    distribution_class, batch, built_distributions
):
    lean, reference = actors(distribution_class)
    # logits far apart and close, so that draws land on every action
    td = TensorDict({"observation": 3 * torch.randn(*batch, 4)}, batch)
    (out, after), (ref, ref_after) = run_both(lean, reference, td)
    # the lean path ran (the reference alone built a distribution) ...
    assert built_distributions == [reference.module[-1]]
    # ... with the reference's actions, log-probabilities and random state
    assert_same(out, ref)
    assert torch.equal(after, ref_after)
    expected = torch.log_softmax(ref["logits"], -1)
    index = (
        ref["action"].argmax(-1)
        if distribution_class is OneHotCategorical
        else ref["action"]
    )
    assert torch.allclose(
        out["action_log_prob"], expected.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    )


def test_the_draws_follow_the_policy():
    """Many draws: the action frequencies match softmax(logits)."""
    lean, _ = actors(OneHotCategorical)
    obs = torch.randn(1, 4).expand(20000, 4)
    with set_interaction_type(InteractionType.RANDOM), torch.no_grad():
        out = lean(TensorDict({"observation": obs}, [20000]))
    frequencies = out["action"].float().mean(0)
    probs = torch.softmax(out["logits"][0], -1)
    assert torch.allclose(frequencies, probs, atol=0.015)


@pytest.mark.filterwarnings("ignore:deterministic_sample wasn't found")
@pytest.mark.parametrize("mode", [InteractionType.DETERMINISTIC, InteractionType.MODE])
@pytest.mark.parametrize("distribution_class", [OneHotCategorical, D.Categorical])
@pytest.mark.parametrize("tied", [False, True])
def test_greedy_actions_as_the_probabilistic_actor(
    mode, distribution_class, tied, built_distributions
):
    """The greedy (evaluation) call takes the distribution's mode without building
    it: the reference's actions and log-probabilities, ties included (equal
    logits: every action for OneHotCategorical's mode, the first for
    Categorical's)."""
    lean, reference = actors(distribution_class)
    if tied:
        with torch.no_grad():
            for p in lean.parameters():
                p.zero_()
    td = TensorDict({"observation": 3 * torch.randn(6, 4)}, [6])
    (out, after), (ref, ref_after) = run_both(lean, reference, td, mode=mode)
    assert built_distributions == [reference.module[-1]]  # the lean path ran
    assert_same(out, ref)
    assert torch.equal(after, ref_after)  # and drew nothing
    if tied and distribution_class is OneHotCategorical:
        assert (out["action"] == 1).all()


def test_hooks_on_the_actor_run_on_the_lean_path():
    lean, _ = actors(OneHotCategorical)
    seen = []
    lean.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    with set_interaction_type(InteractionType.RANDOM):
        lean(TensorDict({"observation": torch.randn(5, 4)}, [5]))
    assert seen == [torch.Size([5])]


def test_a_hook_on_an_inner_module_is_not_skipped():
    lean, reference = actors(OneHotCategorical)
    seen = []
    lean.module[0].register_forward_hook(lambda *args: seen.append(1))
    td = TensorDict({"observation": torch.randn(5, 4)}, [5])
    (out, _), (ref, _) = run_both(lean, reference, td)
    assert seen == [1]
    assert_same(out, ref)


def test_a_sampling_generator_is_used_as_the_probabilistic_actor_uses_it():
    net = MLP(in_features=4, out_features=3, num_cells=[16])
    samples = []
    # other global seeds: the same actions only if generator=7 drives the draws
    for seed, cls in ((0, CategoricalActor), (1, ProbabilisticActor)):
        actor = cls(
            TensorDictModule(net, ["observation"], ["logits"]),
            in_keys=["logits"],
            distribution_class=OneHotCategorical,
            return_log_prob=True,
            generator=7,
        )
        torch.manual_seed(seed)
        with set_interaction_type(InteractionType.RANDOM), torch.no_grad():
            out = actor(TensorDict({"observation": torch.ones(64, 4)}, [64]))
        samples.append(out)
    assert_same(*samples)


def test_nan_logits_fail_as_the_distribution_does():
    lean, reference = actors(OneHotCategorical)
    td = TensorDict({"observation": torch.full((3, 4), float("nan"))}, [3])
    errors = []
    for actor in (lean, reference):
        with (
            pytest.raises(Exception) as info,
            set_interaction_type(InteractionType.RANDOM),
        ):
            actor(td.clone())
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_other_structures_fall_back():
    """Two networks before the head, a distribution with kwargs: the
    ProbabilisticActor path."""
    net = TensorDictModule(torch.nn.Linear(4, 8), ["observation"], ["hidden"])
    head = TensorDictModule(torch.nn.Linear(8, 3), ["hidden"], ["logits"])
    actor = CategoricalActor(
        TensorDictSequential(net, head),
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    assert actor._lean is None
    td = TensorDict({"observation": torch.randn(2, 4)}, [2])
    with set_interaction_type(InteractionType.RANDOM):
        assert actor(td)["action"].shape == (2, 3)


def test_a_collector_gathers_the_same_batches():
    """A TorchRL Collector with the model builder's actor and one with a plain
    ProbabilisticActor on the same network, env seed and torch seed: equal
    batches, every key."""
    lean, _ = mlp_actor_critic(4, 2, num_cells=[16])
    assert isinstance(lean, CategoricalActor) and lean._lean is not None
    reference = ProbabilisticActor(
        lean.module[0],
        in_keys=["logits"],
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    )
    batches = []
    for policy in (lean, reference):
        torch.manual_seed(0)
        env = GymEnv("CartPole-v1")
        env.set_seed(0)
        collector = Collector(env, policy, frames_per_batch=64, total_frames=128)
        batches.append([b.clone() for b in collector])
        collector.shutdown()
    for a, b in zip(*batches, strict=True):
        assert_same(a, b)
    # the episodes ended at least once, so resets went through the same draws
    assert batches[0][0]["next", "done"].any() or batches[0][1]["next", "done"].any()
