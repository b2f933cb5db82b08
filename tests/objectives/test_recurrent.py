"""Recurrent ACER (issue #18): ACERLoss and RetraceEstimator with TorchRL's
LSTMModule / GRUModule, against a reference that unrolls the networks one step at a
time (tests/recurrent_reference.py), in float64.

The batches hold mid-row terminations and truncations, episode starts marked by
``is_init`` (with a stored state that must then be ignored) and stored hidden states
at every step (of which only the first step's may be used).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from builders import move_average, random_batch, replay_draws, with_gaussian_behaviour
from recurrent_reference import (
    RecurrentNet,
    gru_cell,
    lstm_cell,
    recurrent_acer_reference,
    recurrent_gaussian_reference,
)
from reference import plain_mlp
from tensordict import TensorDict
from tensordict.nn import TensorDictModule as Mod
from tensordict.nn import TensorDictSequential as Seq
from torch import distributions as D
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import (
    Compose,
    GymEnv,
    InitTracker,
    SerialEnv,
    StepCounter,
    TransformedEnv,
)
from torchrl.modules import (
    MLP,
    GRUModule,
    IndependentNormal,
    LSTMModule,
    ProbabilisticActor,
    set_recurrent_mode,
)
from torchrl.objectives import SoftUpdate

from torchrl_acer import ACERLoss, RetraceEstimator, StochasticDuelingNetwork
from torchrl_acer.modules.sdn import PlainQCritic
from torchrl_acer.objectives.value.retrace import (
    forward_in_pieces,
    module_rnn,
    recurrent_modules,
)

OBS, HIDDEN, A = 3, 5, 4
GAMMA, RATIO_CLIP, ENTROPY = 0.9, 1.5, 0.05
# truncations and terminations mid-row, in several rows, one at the last step
TRUNCATIONS = [(0, 1), (0, 4), (2, 2), (1, 6)]
TERMINATIONS = [(1, 3), (2, 5)]


def core(kind, prefix):
    """An LSTMModule / GRUModule reading ``observation`` with its own state keys."""
    if kind == "lstm":
        return LSTMModule(
            input_size=OBS,
            hidden_size=HIDDEN,
            in_keys=["observation", f"{prefix}_h", f"{prefix}_c"],
            out_keys=[f"{prefix}_y", ("next", f"{prefix}_h"), ("next", f"{prefix}_c")],
        )
    return GRUModule(
        input_size=OBS,
        hidden_size=HIDDEN,
        in_keys=["observation", f"{prefix}_h"],
        out_keys=[f"{prefix}_y", ("next", f"{prefix}_h")],
    )


def recurrent_actor_critic(kind, shared, seed=0):
    """A categorical actor and a Q critic on a recurrent core: one core shared by
    both (``shared``) or one core each."""
    torch.manual_seed(seed)
    actor_core = core(kind, "pi")
    critic_core = actor_core if shared else core(kind, "q")
    critic_prefix = "pi" if shared else "q"
    actor = ProbabilisticActor(
        Seq(actor_core, Mod(nn.Linear(HIDDEN, A), ["pi_y"], ["logits"])),
        in_keys=["logits"],
        distribution_class=D.Categorical,
        return_log_prob=True,
    ).double()
    critic = Seq(
        critic_core,
        Mod(nn.Linear(HIDDEN, A), [f"{critic_prefix}_y"], ["action_value"]),
    ).double()
    return actor, critic


def state_keys(kind, prefix):
    return [f"{prefix}_h", f"{prefix}_c"] if kind == "lstm" else [f"{prefix}_h"]


def segment_batch(kind, shared, B=3, T=7, seed=0, init_rows=(1,)):
    """A ``[B, T]`` batch with ``is_init`` (episode starts after each ``done``, and
    at step 0 of ``init_rows``) and a random hidden state stored at every step."""
    batch = random_batch(B, T, dones=TRUNCATIONS, terminations=TERMINATIONS, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 1:] = batch["next", "done"][:, :-1]
    is_init[list(init_rows), 0] = True
    batch["is_init"] = is_init
    for prefix in ["pi"] + ([] if shared else ["q"]):
        for key in state_keys(kind, prefix):
            batch[key] = torch.randn(B, T, 1, HIDDEN, generator=g, dtype=torch.float64)
    return batch


def reference_weights(module):
    """Leaf copies of a recurrent core's or a linear head's parameters, in the
    order the reference takes them."""
    if isinstance(module, (LSTMModule, GRUModule)):
        rnn = module_rnn(module)
        params = [rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0]
    else:
        params = [module.module.weight, module.module.bias]
    return [p.detach().clone().requires_grad_() for p in params]


def reference_net(kind, actor, critic, shared, actor_states=None):
    """The reference's copy of the actor and the critic, and the pairs
    ``(parameter, its reference copy)``."""
    cell = lstm_cell if kind == "lstm" else gru_cell
    actor_core, pi_head = actor.module[0].module
    critic_core, q_head = critic.module
    pairs = []

    def copies(module):
        ref = reference_weights(module)
        rnn = getattr(module, "lstm", None) or getattr(module, "gru", None)
        ours = (
            [rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0]
            if rnn is not None
            else [module.module.weight, module.module.bias]
        )
        pairs.extend(zip(ours, ref, strict=True))
        return ref

    actor_states = actor_states or state_keys(kind, "pi")
    cores = {"pi": (cell, copies(actor_core), actor_states)}
    if not shared:
        cores["q"] = (cell, copies(critic_core), state_keys(kind, "q"))
    pi_w, pi_b = copies(pi_head)
    q_w, q_b = copies(q_head)
    heads = {
        "logits": ("pi", pi_w, pi_b),
        "action_value": ("pi" if shared else "q", q_w, q_b),
    }
    return RecurrentNet(cores, heads), pairs


def average_reference_net(kind, loss, actor, actor_states=None):
    """The averaged policy (the loss's target actor parameters) for the reference."""
    average = copy.deepcopy(actor)
    loss.target_actor_network_params.to_module(average)
    cell = lstm_cell if kind == "lstm" else gru_cell
    average_core, head = average.module[0].module
    w, b = reference_weights(head)
    return RecurrentNet(
        {
            "pi": (
                cell,
                reference_weights(average_core),
                actor_states or state_keys(kind, "pi"),
            )
        },
        {"logits": ("pi", w, b)},
    )


def make_loss(actor, critic, **kwargs):
    loss = ACERLoss(
        actor,
        critic,
        ratio_clip=RATIO_CLIP,
        entropy_coeff=ENTROPY,
        trust_region_delta=kwargs.pop("delta", 0.05),
        **kwargs,
    )
    loss.make_value_estimator(gamma=GAMMA)
    SoftUpdate(loss, eps=0.99)
    return loss


def check_against_reference(
    kind,
    shared,
    *,
    burn_in=0,
    recurrent_state="stored",
    make_batch=segment_batch,
    trust_region="partly active",
):
    actor, critic = recurrent_actor_critic(kind, shared)
    loss = make_loss(actor, critic, burn_in=burn_in, recurrent_state=recurrent_state)
    move_average(loss, 0.5)
    batch = make_batch(kind, shared)
    out = loss(batch)
    (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()

    net, pairs = reference_net(kind, actor, critic, shared)
    values, _ = recurrent_acer_reference(
        net,
        average_reference_net(kind, loss, actor),
        batch,
        gamma=GAMMA,
        ratio_clip=RATIO_CLIP,
        entropy_coeff=ENTROPY,
        critic_coeff=float(loss.critic_coeff),
        delta=0.05,
        stored_state=recurrent_state == "stored",
        burn_in=burn_in,
    )
    for name, value in values.items():
        torch.testing.assert_close(
            out[name], torch.tensor(value, dtype=torch.float64), rtol=1e-10, atol=1e-12
        )
    for ours, ref in pairs:
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-8, atol=1e-11)
    if trust_region == "partly active":
        # active at some steps only: its projection was checked
        assert 0 < loss.trust_region_stats["active_fraction"] < 1
    return loss, batch


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_stored_state_loss_and_gradients_match_step_by_step_unroll(kind, shared):
    check_against_reference(kind, shared)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_burn_in_matches_reference_without_loss_or_gradient_on_burn_in(kind):
    # burn-in 3 holds a truncation (0, 1) and the reset after it, and ends right
    # after the truncation (2, 2): step 3 of row 2 starts an episode
    check_against_reference(kind, False, burn_in=3)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_zero_state_matches_reference(kind):
    check_against_reference(kind, True, recurrent_state="zero")


def test_zero_state_differs_from_stored_until_the_first_reset_only():
    batch = segment_batch("lstm", True)
    per_step = {}
    for mode in ("stored", "zero"):
        actor, critic = recurrent_actor_critic("lstm", True)
        loss = make_loss(actor, critic, reduction="none", recurrent_state=mode)
        per_step[mode] = loss(batch)["loss_critic"]
    differ = (per_step["stored"] - per_step["zero"]).abs() > 1e-6
    # rows 0 and 2 start mid-episode: the Retrace targets carry the difference
    # back from the next observations, so every step before the first reset
    # differs; row 1 starts an episode (is_init): nothing differs
    assert differ[0, :2].all() and differ[2, :3].all()
    assert not differ[1].any()
    # after the first reset (after done at (0, 1) and (2, 2)) the modes agree
    assert not differ[0, 2:].any() and not differ[2, 3:].any()


def test_burn_in_changes_gradients_not_values():
    # the state entering step k is the same with or without burn-in; only the
    # gradient through it (and the loss terms of steps < k) are gone
    batch = segment_batch("lstm", True)
    results = []
    for burn_in in (0, 2):
        actor, critic = recurrent_actor_critic("lstm", True)
        loss = make_loss(actor, critic, reduction="none", burn_in=burn_in, delta=None)
        out = loss(batch)
        steps = (
            out["loss_objective"][:, 2 - burn_in :]
            + out["loss_critic"][:, 2 - burn_in :]
        )
        steps.sum().backward()
        results.append(
            (steps.detach(), actor.module[0].module[0].lstm.weight_hh_l0.grad)
        )
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-12, atol=1e-14)
    assert (results[0][1] - results[1][1]).abs().max() > 1e-6


def test_retrace_estimator_targets_match_reference_and_burn_in_gets_nan():
    kind, shared, burn_in = "gru", False, 2
    actor, critic = recurrent_actor_critic(kind, shared)
    estimator = RetraceEstimator(
        gamma=GAMMA, actor_network=actor, value_network=critic, burn_in=burn_in
    )
    batch = segment_batch(kind, shared)
    out = estimator(batch.clone())
    net, _ = reference_net(kind, actor, critic, shared)
    _, G = recurrent_acer_reference(
        net,
        reference_net(kind, actor, critic, shared)[0],
        batch,
        gamma=GAMMA,
        ratio_clip=RATIO_CLIP,
        entropy_coeff=ENTROPY,
        critic_coeff=0.25,
        delta=None,
        burn_in=burn_in,
    )
    torch.testing.assert_close(
        out["value_target"][:, burn_in:], G, rtol=1e-10, atol=1e-12
    )
    assert out["value_target"][:, :burn_in].isnan().all()
    assert out["advantage"][:, :burn_in].isnan().all()
    assert set(estimator.in_keys) >= {"is_init", "pi_h", "q_h"}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_permuting_rows_permutes_the_per_step_losses(kind):
    actor, critic = recurrent_actor_critic(kind, True)
    loss = make_loss(actor, critic, reduction="none")
    batch = segment_batch(kind, True)
    out = loss(batch)
    perm = torch.tensor([2, 0, 1])
    permuted = loss(batch[perm])
    for name in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(permuted[name], out[name][perm], rtol=0, atol=0)


def test_batch_dims_and_time_major_layout_give_the_same_losses():
    actor, critic = recurrent_actor_critic("gru", False)
    batch = segment_batch("gru", False, B=4)
    loss = make_loss(actor, critic, reduction="none", burn_in=1)
    expected = loss(batch)["loss_objective"]
    nested = loss(batch.reshape(2, 2, 7))["loss_objective"]
    torch.testing.assert_close(nested.reshape(4, 6), expected, rtol=0, atol=0)
    time_major = batch.transpose(0, 1)
    time_major.names = ["time", None]
    out = loss(time_major)["loss_objective"]
    torch.testing.assert_close(out.transpose(0, 1), expected, rtol=0, atol=0)


def test_python_based_lstm_gives_the_same_loss():
    # the loss runs the module's own forward in recurrent mode: TorchRL's
    # python-based LSTM gives the per-step losses of the default one (checked
    # against the reference above). Its "scan" backend agrees too, but its first
    # call compiles for seconds
    actor, critic = recurrent_actor_critic("lstm", True)
    batch = segment_batch("lstm", True)
    expected = make_loss(actor, critic, reduction="none")(batch)
    lstm = LSTMModule(
        input_size=OBS,
        hidden_size=HIDDEN,
        in_keys=["observation", "pi_h", "pi_c"],
        out_keys=["pi_y", ("next", "pi_h"), ("next", "pi_c")],
        python_based=True,
    )
    lstm.lstm.load_state_dict(actor.module[0].module[0].lstm.state_dict())
    other_actor = ProbabilisticActor(
        Seq(lstm, actor.module[0].module[1]),
        in_keys=["logits"],
        distribution_class=D.Categorical,
        return_log_prob=True,
    ).double()
    other_critic = Seq(lstm, critic.module[1]).double()
    out = make_loss(other_actor, other_critic, reduction="none")(batch)
    for name in ("loss_objective", "loss_critic", "kl_avg"):
        torch.testing.assert_close(out[name], expected[name], rtol=1e-12, atol=1e-14)


def test_in_keys_hold_what_recurrence_needs_and_suffice():
    actor, critic = recurrent_actor_critic("lstm", False)
    batch = segment_batch("lstm", False)
    for mode, states in (("stored", {"pi_h", "pi_c", "q_h", "q_c"}), ("zero", set())):
        loss = make_loss(actor, critic, recurrent_state=mode)
        keys = set(loss.in_keys)
        assert "is_init" in keys
        assert keys & {"pi_h", "pi_c", "q_h", "q_c"} == states
        assert not any(isinstance(k, tuple) and k[-1] == "is_init" for k in keys)
        # the trainer's replay keeps only the loss's in_keys
        torch.testing.assert_close(
            loss(batch.select(*loss.in_keys))["loss_objective"],
            loss(batch)["loss_objective"],
        )


class TestBadInput:
    def setup_method(self):
        actor, critic = recurrent_actor_critic("lstm", True)
        self.loss = make_loss(actor, critic)
        self.batch = segment_batch("lstm", True)

    def test_missing_hidden_state_names_the_key(self):
        with pytest.raises(KeyError, match="'pi_c'.*hidden state of LSTMModule"):
            self.loss(self.batch.exclude("pi_c"))

    def test_wrong_hidden_state_shape_names_key_shape_and_expectation(self):
        self.batch["pi_h"] = torch.zeros(3, 7, 2, HIDDEN, dtype=torch.float64)
        with pytest.raises(
            ValueError,
            match=r"'pi_h' has shape \(3, 7, 2, 5\), expected \(3, 7, 1, 5\)",
        ):
            self.loss(self.batch)

    def test_missing_is_init_is_named(self):
        with pytest.raises(KeyError, match="'is_init'.*InitTracker"):
            self.loss(self.batch.exclude("is_init"))

    def test_burn_in_as_long_as_the_segment_is_refused(self):
        actor, critic = recurrent_actor_critic("lstm", True)
        loss = make_loss(actor, critic, burn_in=7)
        with pytest.raises(ValueError, match="burn_in=7 leaves no step"):
            loss(self.batch)

    def test_bad_options_are_refused(self):
        actor, critic = recurrent_actor_critic("gru", True)
        with pytest.raises(ValueError, match="recurrent_state must be one of"):
            ACERLoss(actor, critic, recurrent_state="fresh")
        with pytest.raises(ValueError, match="burn_in must be an integer"):
            ACERLoss(actor, critic, burn_in=-1)
        with pytest.raises(TypeError, match="option of ACERLoss"):
            ACERLoss(actor, critic).make_value_estimator(gamma=0.9, burn_in=2)

    def test_burn_in_without_recurrent_networks_is_refused(self):
        actor = ProbabilisticActor(
            Mod(nn.Linear(OBS, A), ["observation"], ["logits"]),
            in_keys=["logits"],
            distribution_class=D.Categorical,
        )
        critic = Mod(nn.Linear(OBS, A), ["observation"], ["action_value"])
        with pytest.raises(ValueError, match="neither the actor nor the critic"):
            ACERLoss(actor, critic, burn_in=2)

    def test_bare_torch_rnn_is_refused(self):
        actor, _ = recurrent_actor_critic("lstm", True)
        critic = Seq(
            Mod(nn.LSTM(OBS, HIDDEN, batch_first=True), ["observation"], ["y"]),
            Mod(nn.Linear(HIDDEN, A), ["y"], ["action_value"]),
        )
        with pytest.raises(TypeError, match="bare recurrent module.*LSTM"):
            ACERLoss(actor, critic)


def collected_batch():
    """The second ``[2, 8]`` batch of a Collector running an LSTM policy on
    CartPole with a 5-step time limit (InitTracker, the LSTM's primer): rows start
    mid-episode with a stored state, with truncations and resets mid-row."""
    torch.manual_seed(0)
    lstm = LSTMModule(
        input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="y"
    )
    actor = ProbabilisticActor(
        Seq(lstm, Mod(nn.Linear(HIDDEN, 2), ["y"], ["logits"])),
        in_keys=["logits"],
        distribution_class=D.Categorical,
        return_log_prob=True,
    )
    critic = Seq(lstm, Mod(nn.Linear(HIDDEN, 2), ["y"], ["action_value"]))

    def make_env():
        return TransformedEnv(
            GymEnv("CartPole-v1", categorical_action_encoding=True),
            Compose(
                StepCounter(max_steps=5), InitTracker(), lstm.make_tensordict_primer()
            ),
        )

    env = SerialEnv(2, make_env)
    env.set_seed(0)
    collector = Collector(
        env,
        actor,
        frames_per_batch=16,
        total_frames=32,
        auto_register_policy_transforms=False,
    )
    batch = list(collector)[-1]
    collector.shutdown()
    return actor, critic, batch


def test_collector_batch_through_the_loss():
    actor, critic, batch = collected_batch()
    assert batch.batch_size == (2, 8)
    assert not batch["is_init"][:, 0].any()  # rows start with a stored state
    assert batch["next", "truncated"][:, :-1].any()  # and truncate mid-row
    assert batch["is_init"][:, 1:].any()
    # on-policy: the loss recomputes the behaviour policy exactly (rho = 1) from
    # the stored state and the resets, and not from a zero state
    for mode, on_policy in (("stored", True), ("zero", False)):
        loss = make_loss(actor, critic, recurrent_state=mode)
        rho_mean = float(loss(batch.select(*loss.in_keys))["rho_mean"])
        assert (abs(rho_mean - 1) < 1e-5) is on_policy, (mode, rho_mean)

    # the loss and its gradients on the collected batch, in float64, against the
    # step-by-step reference
    actor, critic = actor.double(), critic.double()
    batch = batch.apply(lambda x: x.double() if x.is_floating_point() else x)
    loss = make_loss(actor, critic)
    move_average(loss, 0.5)
    out = loss(batch)
    (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
    states = ["recurrent_state_h", "recurrent_state_c"]
    net, pairs = reference_net("lstm", actor, critic, True, actor_states=states)
    average = average_reference_net("lstm", loss, actor, actor_states=states)
    values, _ = recurrent_acer_reference(
        net,
        average,
        batch,
        gamma=GAMMA,
        ratio_clip=RATIO_CLIP,
        entropy_coeff=ENTROPY,
        critic_coeff=float(loss.critic_coeff),
        delta=0.05,
    )
    for name, value in values.items():
        torch.testing.assert_close(
            out[name], torch.tensor(value, dtype=torch.float64), rtol=1e-10, atol=1e-12
        )
    for ours, ref in pairs:
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-8, atol=1e-11)


# -- many episode boundaries per row (issue #18) ----------------------------------
# The window and the averaged policy run each recurrent module's RNN over the pieces
# of the rows between resets, padded, in a few calls over spans of time
# (forward_in_pieces), where the module's own forward would pack them. Rows of 12
# steps cut into pieces of 1 to 13 entries (with the inserted next observations):
# row 0 episodes of 1 to 7 entries, row 1 none, row 2 one every 2 steps, row 3 an
# episode start at step 0 and a truncation at the last step.
MANY_TRUNCATIONS = [(0, 0), (0, 5), (2, 1), (2, 5), (2, 9), (3, 3), (3, 11)]
MANY_TERMINATIONS = [(0, 2), (0, 3), (2, 3), (2, 7), (3, 6), (3, 7)]


def many_resets_batch(kind, shared, seed=0):
    batch = random_batch(
        4, 12, dones=MANY_TRUNCATIONS, terminations=MANY_TERMINATIONS, seed=seed
    )
    g = torch.Generator().manual_seed(seed + 1)
    is_init = torch.zeros(4, 12, 1, dtype=torch.bool)
    is_init[:, 1:] = batch["next", "done"][:, :-1]
    is_init[3, 0] = True
    batch["is_init"] = is_init
    for prefix in ["pi"] + ([] if shared else ["q"]):
        for key in state_keys(kind, prefix):
            batch[key] = torch.randn(4, 12, 1, HIDDEN, generator=g, dtype=torch.float64)
    return batch


@pytest.mark.parametrize("burn_in", [0, 4])
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_many_resets_per_row_match_step_by_step_unroll(kind, shared, burn_in):
    # burn-in 4 holds resets in rows 0, 2 and 3: it runs the modules' own forward
    check_against_reference(
        kind, shared, burn_in=burn_in, make_batch=many_resets_batch, trust_region=None
    )


def rows_with_resets(module, seed=0):
    """``[6, 10]`` rows for ``module`` with episode starts at random steps (pieces
    of 1 to 10 entries) and a random state stored at every step."""
    g = torch.Generator().manual_seed(seed)
    is_init = torch.rand(6, 10, 1, generator=g) < 0.3
    is_init[1] = False  # one row of a single piece
    rnn = module_rnn(module)
    td = TensorDict(
        {
            "observation": torch.randn(6, 10, OBS, generator=g, dtype=torch.float64),
            "is_init": is_init,
        },
        [6, 10],
    )
    for key in module.in_keys[1:-1]:
        td[key] = torch.randn(
            6, 10, rnn.num_layers, HIDDEN, generator=g, dtype=torch.float64
        )
    return td


CORES = {
    "lstm": lambda: LSTMModule(
        OBS, HIDDEN, num_layers=2, in_key="observation", out_key="y"
    ),
    "python_lstm": lambda: LSTMModule(
        OBS, HIDDEN, in_key="observation", out_key="y", python_based=True
    ),
    "gru": lambda: GRUModule(
        OBS, HIDDEN, num_layers=2, in_key="observation", out_key="y"
    ),
}


@pytest.mark.parametrize("kind", list(CORES))
def test_forward_in_pieces_equals_the_modules_recurrent_forward(kind):
    torch.manual_seed(0)
    module = CORES[kind]().double()
    rnn = module_rnn(module)
    td = rows_with_resets(module)
    with set_recurrent_mode(True):
        expected = module(td.clone())["y"]
        calls = []
        hook = rnn.register_forward_hook(lambda *args: calls.append(args[1][0].shape))
        out = forward_in_pieces(module, td.clone())["y"]
        hook.remove()
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-14)
    # over several spans of time, on fewer pieces each
    assert len(calls) > 2 and calls[0][0] > calls[-1][0] == 1
    # and the same gradients
    grads = []
    for run in (module, functools.partial(forward_in_pieces, module)):
        module.zero_grad()
        with set_recurrent_mode(True):
            run(td.clone())["y"].square().sum().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-14)


def test_loss_runs_pieces_without_packing_and_leaves_the_modules_as_they_were(
    monkeypatch,
):
    actor, critic = recurrent_actor_critic("lstm", False)
    loss = make_loss(actor, critic)
    batch = many_resets_batch("lstm", False)
    expected = loss(batch)["loss_objective"]

    def no_packing(*args, **kwargs):
        raise AssertionError("TorchRL packed a sequence")

    monkeypatch.setattr(torch.nn.utils.rnn, "pack_padded_sequence", no_packing)
    torch.testing.assert_close(loss(batch)["loss_objective"], expected)
    for module in recurrent_modules(actor) + recurrent_modules(critic):
        assert "forward" not in vars(module)
    # outside the loss, the modules run their own forward (which packs)
    with set_recurrent_mode(True), pytest.raises(AssertionError, match="packed"):
        actor(batch.clone())


# -- Gaussian policies: a recurrent actor, a dueling critic on its features -------
# The recurrent core is in the actor (its trunk); the stochastic dueling network's
# feed-forward V and A read the core's output "pi_y" next to the observation. The
# reference unrolls the actor step by step and evaluates V, A, Q~ (with the loss's
# draws), Q_ret, Q_opc and the loss terms of tests/reference.py on each step.
D_ACT = 2
GAUSSIAN_DELTA = 0.02


class GaussianHead(nn.Module):
    """The policy's mean, linear in the trunk's features, and its scale: learned
    and state-independent (``exp(log_scale)``), or fixed."""

    def __init__(self, fixed_scale=None):
        super().__init__()
        self.loc = nn.Linear(HIDDEN, D_ACT)
        self.fixed_scale = fixed_scale
        if fixed_scale is None:
            self.log_scale = nn.Parameter(torch.full((D_ACT,), -0.5))

    def forward(self, features):
        loc = self.loc(features)
        if self.fixed_scale is not None:
            return loc, torch.full_like(loc, self.fixed_scale)
        return loc, self.log_scale.exp().expand_as(loc)


def tanh_mlp(in_features, cells):
    return MLP(
        in_features=in_features,
        out_features=1,
        num_cells=cells,
        activation_class=nn.Tanh,
    )


def recurrent_gaussian_actor_sdn(kind, fixed_scale=None, seed=0):
    """A Gaussian actor on a recurrent core, and a stochastic dueling network whose
    feed-forward V and A (tanh MLPs) read the core's features next to the
    observation."""
    torch.manual_seed(seed)
    actor = ProbabilisticActor(
        Seq(
            core(kind, "pi"),
            Mod(GaussianHead(fixed_scale), ["pi_y"], ["loc", "scale"]),
        ),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    ).double()
    critic = StochasticDuelingNetwork(
        Mod(tanh_mlp(HIDDEN + OBS, [4]), ["pi_y", "observation"], ["state_value"]),
        Mod(
            tanh_mlp(HIDDEN + OBS + D_ACT, [6]),
            ["pi_y", "observation", "action"],
            ["advantage"],
        ),
        num_samples=3,
    ).double()
    return actor, critic


def gaussian_segment_batch(kind, seed=0):
    """``segment_batch`` (truncations and terminations mid-row, ``is_init``, a
    stored state at every step) with Gaussian behaviour and actions."""
    batch = segment_batch(kind, True, seed=seed)
    return with_gaussian_behaviour(
        batch, D_ACT, torch.Generator().manual_seed(seed + 2)
    )


def gaussian_reference(kind, loss, actor, critic, baseline_noise=None):
    """The reference's copies of the actor, the averaged policy and the dueling
    network (or plain Q critic, whose V draws ``loc + scale * baseline_noise[i]``):
    ``(net, average_net, critic function, log_scale leaf or None, the averaged
    scale, pairs (parameter, its reference copy))``."""
    cell = lstm_cell if kind == "lstm" else gru_cell
    pairs = []

    def leaves(params):
        ref = [p.detach().clone().requires_grad_() for p in params]
        pairs.extend(zip(params, ref, strict=True))
        return ref

    actor_core, head = actor.module[0].module
    head = head.module
    rnn = module_rnn(actor_core)
    core_weights = leaves(
        [rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0, rnn.bias_hh_l0]
    )
    loc_w, loc_b = leaves([head.loc.weight, head.loc.bias])
    fixed = head.fixed_scale
    log_scale = None if fixed is not None else leaves([head.log_scale])[0]
    states = state_keys(kind, "pi")
    net = RecurrentNet(
        {"pi": (cell, core_weights, states)}, {"loc": ("pi", loc_w, loc_b)}
    )

    average = copy.deepcopy(actor)
    loss.target_actor_network_params.to_module(average)
    average_core, average_head = average.module[0].module
    average_head = average_head.module
    average_net = RecurrentNet(
        {"pi": (cell, reference_weights(average_core), states)},
        {
            "loc": (
                "pi",
                average_head.loc.weight.detach(),
                average_head.loc.bias.detach(),
            )
        },
    )
    avg_scale = (
        torch.full((D_ACT,), fixed, dtype=torch.float64)
        if fixed is not None
        else average_head.log_scale.detach().exp()
    )

    a_mlp = critic.advantage_network.module
    if isinstance(critic, PlainQCritic):
        q_weights = leaves(list(a_mlp.parameters()))
        sigma = (
            log_scale.detach().exp()
            if log_scale is not None
            else torch.full((D_ACT,), fixed, dtype=torch.float64)
        )

        def critic_fn(inputs, loc):
            # V(s) = mean_i Q(s, loc(s) + sigma c_i), Q on [features, observation]
            q = plain_mlp(a_mlp, q_weights, inputs)
            values = [
                sum(q(s, loc[s] + sigma * c) for c in baseline_noise)
                / len(baseline_noise)
                for s in range(len(inputs))
            ]
            return torch.stack(values), q

        return net, average_net, critic_fn, log_scale, avg_scale, pairs

    v_mlp = critic.value_network.module
    v_weights = leaves(list(v_mlp.parameters()))
    a_weights = leaves(list(a_mlp.parameters()))

    def critic_fn(inputs, loc):
        # V and A on the rows of the table [features, observation] (and the action)
        v = plain_mlp(v_mlp, v_weights, inputs)
        no_action = inputs.new_zeros(0)
        values = torch.stack([v(s, no_action) for s in range(len(inputs))])
        return values, plain_mlp(a_mlp, a_weights, inputs)

    return net, average_net, critic_fn, log_scale, avg_scale, pairs


def assert_matches_reference(out, values, pairs, loss):
    """The loss's outputs equal the reference's ``values`` and every parameter's
    gradient its reference copy's (``pairs``), to float64 precision."""
    for name in ("loss_objective", "loss_entropy", "loss_critic", "kl_avg"):
        torch.testing.assert_close(
            out[name],
            torch.tensor(values[name], dtype=torch.float64),
            rtol=1e-10,
            atol=1e-12,
        )
    assert len(pairs) == len(list(loss.parameters()))
    for ours, ref in pairs:
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-8, atol=1e-11)


def gaussian_reference_values(
    kind, loss, actor, critic, batch, noise, *, baseline_noise=None, **settings
):
    """``(values, pairs)``: :func:`recurrent_gaussian_reference` on copies of
    ``loss``'s networks (:func:`gaussian_reference`), with this file's
    hyperparameters unless ``settings`` say otherwise."""
    net, average_net, critic_fn, log_scale, avg_scale, pairs = gaussian_reference(
        kind, loss, actor, critic, baseline_noise=baseline_noise
    )
    settings = {
        "fixed_scale": None,
        "gamma": GAMMA,
        "ratio_clip": RATIO_CLIP,
        "entropy_coeff": ENTROPY,
        "critic_coeff": float(loss.critic_coeff),
        "delta": GAUSSIAN_DELTA,
        **settings,
    }
    values = recurrent_gaussian_reference(
        net,
        average_net,
        batch,
        critic_fn,
        noise,
        log_scale=log_scale,
        avg_scale=avg_scale,
        **settings,
    )
    return values, pairs


def replayed_noise(loss, batch, burn_in, seed=3):
    """Draws for a'_t and the u_i of the steps after the burn-in, replayed by the
    loss (its one documented torch.randn per forward) and returned for the
    reference."""
    B, T = batch.batch_size
    critic = loss.critic_network
    n = 1 + critic.num_samples * critic.dueling  # a' (and the u_i)
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, B, T - burn_in, D_ACT, generator=g, dtype=torch.float64)
    replay_draws(loss, noise)
    return noise


def run_gaussian_loss(kind, actor, critic, burn_in, **loss_kwargs):
    """``(loss, batch, noise, out)``: the loss (trust region on, the averaged
    policy moved away from the policy) on ``kind``'s segment batch with the
    reference's draws, its forward, and the backward of its three losses."""
    loss = make_loss(
        actor, critic, burn_in=burn_in, delta=GAUSSIAN_DELTA, **loss_kwargs
    )
    move_average(loss, 0.3)
    batch = gaussian_segment_batch(kind)
    noise = replayed_noise(loss, batch, burn_in)
    out = loss(batch)
    (out["loss_objective"] + out["loss_entropy"] + out["loss_critic"]).backward()
    return loss, batch, noise, out


def check_gaussian_against_reference(
    kind, *, burn_in=0, recurrent_state="stored", fixed_scale=None
):
    actor, critic = recurrent_gaussian_actor_sdn(kind, fixed_scale)
    loss, batch, noise, out = run_gaussian_loss(
        kind, actor, critic, burn_in, recurrent_state=recurrent_state
    )

    values, pairs = gaussian_reference_values(
        kind,
        loss,
        actor,
        critic,
        batch,
        noise,
        fixed_scale=fixed_scale,
        stored_state=recurrent_state == "stored",
        burn_in=burn_in,
    )
    assert_matches_reference(out, values, pairs, loss)
    # the truncations and the trust region act at some steps only: both were
    # checked
    assert 0 < float(out["rho_clip_fraction"]) < 1
    assert 0 < loss.trust_region_stats["active_fraction"] < 1
    return loss, batch, values


@pytest.mark.parametrize("burn_in", [0, 3])
@pytest.mark.parametrize("recurrent_state", ["stored", "zero"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gaussian_policy_on_recurrent_trunk_matches_step_by_step_unroll(
    kind, recurrent_state, burn_in
):
    # burn-in 3 holds a truncation (0, 1) and the reset after it, and ends right
    # after the truncation (2, 2)
    check_gaussian_against_reference(
        kind, burn_in=burn_in, recurrent_state=recurrent_state
    )


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gaussian_policy_with_fixed_scale_matches_step_by_step_unroll(kind):
    check_gaussian_against_reference(kind, burn_in=2, fixed_scale=0.4)


def test_plain_q_critic_on_recurrent_trunk_matches_step_by_step_unroll():
    """The paper's ablation without the dueling network: Q on the trunk's
    features, V(s) = mean_i Q(s, u_i) on the sequences (at s'_t too, from the
    policy there), no V term in the critic loss."""
    kind, burn_in = "gru", 2
    actor, _ = recurrent_gaussian_actor_sdn(kind)
    q = Mod(
        tanh_mlp(HIDDEN + OBS + D_ACT, [6]), ["pi_y", "observation", "action"], ["q"]
    )
    critic = PlainQCritic(q, num_samples=3).double()
    # V's draws u_i = loc + scale * c_i, the same c_i at every entry
    c = torch.randn(3, D_ACT, generator=torch.Generator().manual_seed(5)).double()
    critic.value_network.noise = lambda loc: c.view(
        3, *[1] * (loc.ndim - 1), D_ACT
    ).expand(3, *loc.shape)
    loss, batch, noise, out = run_gaussian_loss(kind, actor, critic, burn_in)
    values, pairs = gaussian_reference_values(
        kind,
        loss,
        actor,
        critic,
        batch,
        noise,
        baseline_noise=c,
        burn_in=burn_in,
        dueling=False,
    )
    assert_matches_reference(out, values, pairs, loss)


def test_gaussian_retrace_estimator_targets_match_reference_and_burn_in_gets_nan():
    kind, burn_in = "lstm", 2
    actor, critic = recurrent_gaussian_actor_sdn(kind)
    # the loss's targets, from the same draws, are checked above: the estimator
    # draws its baseline u_i itself; here it replays the reference's
    loss = make_loss(actor, critic, burn_in=burn_in)
    batch = gaussian_segment_batch(kind)
    noise = replayed_noise(loss, batch, burn_in)
    nb, B, T = noise.shape[0] - 1, *noise.shape[1:3]
    critic.sample_baseline_actions = lambda loc, scale: (
        loc.detach() + scale.detach() * noise[1:].reshape(nb, B * T, D_ACT)
    )
    estimator = RetraceEstimator(
        gamma=GAMMA, actor_network=actor, value_network=critic, burn_in=burn_in
    )
    out = estimator(batch.clone())
    values, _ = gaussian_reference_values(
        kind,
        loss,
        actor,
        critic,
        batch,
        noise,
        critic_coeff=0.25,
        delta=None,
        burn_in=burn_in,
    )
    for key in ("value_target", "value_target_opc"):
        torch.testing.assert_close(
            out[key][:, burn_in:], values[key], rtol=1e-10, atol=1e-12
        )
        assert out[key][:, :burn_in].isnan().all()
    assert out["advantage"][:, :burn_in].isnan().all()
    assert set(estimator.in_keys) >= {"is_init", "pi_h", "pi_c", "observation"}
    # the trunk's features come from the actor's pass, never from the data
    assert "pi_y" not in estimator.in_keys


def test_gaussian_separate_losses_keep_the_critic_loss_out_of_the_trunk():
    batch = gaussian_segment_batch("gru")
    losses = {}
    for separate in (False, True):
        actor, critic = recurrent_gaussian_actor_sdn("gru")
        loss = make_loss(actor, critic, separate_losses=separate)
        replayed_noise(loss, batch, 0)
        out = loss(batch)
        out["loss_critic"].backward()
        losses[separate] = out
        trunk = actor.module[0].module[0].parameters()
        assert all((p.grad is None) is separate for p in trunk)
        assert all(p.grad is not None for p in critic.parameters())
    for name in ("loss_objective", "loss_critic", "loss_entropy"):
        torch.testing.assert_close(losses[True][name], losses[False][name])


def test_gaussian_loss_runs_on_a_batch_holding_only_its_in_keys():
    actor, critic = recurrent_gaussian_actor_sdn("lstm")
    batch = gaussian_segment_batch("lstm")
    for mode, states in (("stored", {"pi_h", "pi_c"}), ("zero", set())):
        loss = make_loss(actor, critic, recurrent_state=mode, burn_in=1)
        keys = set(loss.in_keys)
        assert keys >= {"is_init", "observation", "loc", "scale"}
        assert keys & {"pi_h", "pi_c", "pi_y"} == states
        replayed_noise(loss, batch, 1)
        torch.testing.assert_close(
            loss(batch.select(*loss.in_keys))["loss_objective"],
            loss(batch)["loss_objective"],
        )


def test_dueling_network_holding_a_recurrent_module_is_refused():
    actor, _ = recurrent_gaussian_actor_sdn("lstm")
    critic = StochasticDuelingNetwork(
        Seq(core("gru", "v"), Mod(nn.Linear(HIDDEN, 1), ["v_y"], ["state_value"])),
        Mod(
            MLP(in_features=OBS + D_ACT, out_features=1, num_cells=[4]),
            ["observation", "action"],
            ["advantage"],
        ),
    ).double()
    with pytest.raises(
        TypeError,
        match=r"StochasticDuelingNetwork holds a recurrent module at "
        r"'value_network.module.0' \(GRUModule\).*must be in the actor network",
    ):
        ACERLoss(actor, critic)
    with pytest.raises(TypeError, match="must be in the actor network"):
        RetraceEstimator(gamma=0.9, actor_network=actor, value_network=critic)
