r"""Running recurrent policies and critics over replayed ``[*B, T]`` segments.

A network holding TorchRL's :class:`~torchrl.modules.LSTMModule` or
:class:`~torchrl.modules.GRUModule` cannot see a segment as independent
observations (the feed-forward window of :mod:`._window`): it must run over each row
in order, from a hidden state, resetting at episode starts. Here each row is one
sequence, run in TorchRL's recurrent mode (:class:`~torchrl.modules.set_recurrent_mode`)
in one call per network:

- the state entering step ``0`` is the state stored with the segment's first step
  (``recurrent_state="stored"``, the state the behaviour policy had there) or zero
  (``"zero"``, OpenAI baselines' replay); either is zeroed if the step starts an
  episode;
- the state is reset to zero at every step ``t`` that starts an episode:
  ``is_init_t`` (TorchRL's :class:`~torchrl.envs.InitTracker`) or ``done_{t-1}``;
- the next observation :math:`s'_t` of a mid-row truncation (``done`` and not
  ``terminated`` before the last step) is inserted in the row right after
  :math:`s_t`, so it is evaluated with the state after step ``t``; the reset at
  :math:`s_{t+1}` then discards whatever it did to the state. The last next
  observation :math:`s'_{T-1}` follows :math:`s_{T-1}`. Rows get ``T + 1 + K_b``
  entries (``K_b`` mid-row truncations of row ``b``), padded to the longest after
  their end, where padding cannot reach any output that is read;
- with a burn-in of ``k`` steps (R2D2, Kapturowski et al., ICLR 2019) the networks
  first run without gradient over steps ``0 .. k-1`` from the state above; the
  states after step ``k-1`` start the window over steps ``k .. T-1``.

Every recurrent module of the actor and of the critic is run this way (a trunk they
share runs once); the averaged policy runs over the whole segment, burn-in
included, from the same stored states with its own parameters.

A critic may also read the actor's features by key rather than share its modules:
a Gaussian policy's :class:`~torchrl_acer.modules.sdn.StochasticDuelingNetwork`,
whose feed-forward value and advantage networks read the output of the actor's
recurrent trunk (an ``LSTMModule``'s ``out_key``), possibly with observations. Those
entries (:attr:`RecurrentEvaluator.features`) are not read from the data: they are
the actor's outputs on the sequences, at each ``s_t`` and ``s'_t``, and the value
network runs on them like a shared trunk's head; the advantage network, called on
several actions per step, runs on the steps' entries, flattened
(:meth:`SequenceWindow.flat_current`).

Where only the networks' outputs are read (the window and the averaged policy; the
burn-in reads the states after its last step), the recurrent modules do not run
their own forward but :func:`forward_in_pieces`: their RNN (``module.lstm`` /
``module.gru``, on their parameters) over the same pieces of the rows between
resets, padded, in a few calls, with the same outputs; the rest of the network runs
on the rows as they are. TorchRL's recurrent mode packs the pieces, and
``torch.nn.LSTM`` / ``GRU`` run a ``PackedSequence`` step by step in small
operations (no oneDNN kernel takes one on a CPU: a ``[32, 21]`` LSTM's forward and
backward are 3 235 ATen operations packed, 77 padded), which made the loss's
forward and backward 1.2 to 1.7 times slower on a CPU once rows held resets
(issue #18).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictSequential
from tensordict.utils import NestedKey, unravel_key
from torchrl.modules import GRUModule, LSTMModule, set_recurrent_mode

from torchrl_acer.objectives._window import (
    PolicyCriticEvaluator,
    _next,
    _probabilistic_module,
    _skip_existing_set_to,
    as_step_tensor,
    get_entry,
    policy_modules,
    submodules,
    transition_in_keys,
)

#: the replay modes of the initial recurrent state
RECURRENT_STATES = ("stored", "zero")
#: the episode-start flag TorchRL's recurrent modules read (a fixed name there)
IS_INIT = "is_init"


def recurrent_modules(network) -> list[LSTMModule | GRUModule]:
    """The recurrent modules inside ``network``, in order.

    TorchRL's :class:`~torchrl.modules.LSTMModule` and
    :class:`~torchrl.modules.GRUModule`.
    """
    return [m for m in network.modules() if isinstance(m, (LSTMModule, GRUModule))]


def actor_features(actor_network) -> set[NestedKey]:
    """The entries the actor writes on its way to its distribution.

    Its trunk's features and the distribution parameters, not the sample or its
    log-prob, nor what it reads from the data (an entry it rewrites in place).
    """
    sampled = {unravel_key(k) for k in _probabilistic_module(actor_network).out_keys}
    read = {unravel_key(k) for k in actor_network.in_keys}
    return {unravel_key(k) for k in actor_network.out_keys} - sampled - read


def module_rnn(module: LSTMModule | GRUModule) -> torch.nn.Module:
    """The ``torch.nn`` (or TorchRL python-based) RNN inside ``module``."""
    return module.lstm if isinstance(module, LSTMModule) else module.gru


def state_shapes(module: LSTMModule | GRUModule) -> dict[NestedKey, tuple[int, ...]]:
    """The per-step shapes of a recurrent module's hidden state, by key.

    ``{state key: per-step shape}`` as its ``make_tensordict_primer`` declares it:
    ``(num_layers * directions, size)``.
    """
    rnn = module_rnn(module)
    layers = rnn.num_layers * (2 if rnn.bidirectional else 1)
    keys = [unravel_key(k) for k in module.in_keys[1:-1]]
    if isinstance(module, LSTMModule):
        h_size = rnn.proj_size if rnn.proj_size > 0 else rnn.hidden_size
        return {keys[0]: (layers, h_size), keys[1]: (layers, rnn.hidden_size)}
    return {keys[0]: (layers, rnn.hidden_size)}


class RecurrentEvaluator:
    """Runs a policy and a critic holding recurrent modules over ``[*B, T]`` segments.

    Args:
        evaluator (PolicyCriticEvaluator): the feed-forward evaluator of the same
            networks (it finds the distribution keys and a trunk shared by the actor
            and the critic).

    Keyword Args:
        recurrent_state (str): ``"stored"`` or ``"zero"``, the state entering a
            segment (see the module docstring).
        burn_in (int): steps at the start of each segment that only warm the state.
        critic_keys (list of NestedKey): entries read by heads of the critic that
            run on the flattened steps rather than on the sequences (a stochastic
            dueling network's advantage network, without the action).

    Attributes:
        features: the entries the critic reads that the actor writes (the actor's
            trunk features): taken from the actor's pass, never from the data.
        obs_keys: the entries read from the data, at ``s_t`` and ``s'_t``.
    """

    def __init__(
        self,
        evaluator: PolicyCriticEvaluator,
        *,
        recurrent_state: str = "stored",
        burn_in: int = 0,
        critic_keys: Sequence[NestedKey] = (),
    ):
        self.evaluator = evaluator
        self.recurrent_state = recurrent_state
        self.burn_in = burn_in
        modules = {}
        for network in (evaluator.actor_network, evaluator.critic_network):
            for module in recurrent_modules(network):
                modules[id(module)] = module
        self.modules = list(modules.values())
        self.actor_modules = recurrent_modules(evaluator.actor_network)
        # {state key: (module, per-step shape)}; the output key carrying the state
        # after each step is the module's matching out_key
        self.states = {}
        self._state_out = {}
        for module in self.modules:
            shapes = state_shapes(module)
            for key, out_key in zip(shapes, module.out_keys[1:], strict=True):
                if key in self.states and self.states[key][0] is not module:
                    raise ValueError(
                        f"two recurrent modules read the hidden state {key!r}; give "
                        f"each LSTMModule / GRUModule its own in_keys"
                    )
                self.states[key] = (module, shapes[key])
                self._state_out[key] = unravel_key(out_key)
        hidden = {*self.states, IS_INIT}
        written = actor_features(evaluator.actor_network)
        keys = [
            key
            for key in dict.fromkeys(
                map(unravel_key, (*evaluator.in_keys, *critic_keys))
            )
            if key not in hidden
        ]
        self.features = [key for key in keys if key in written]
        self.obs_keys = [key for key in keys if key not in written]

    def parameter(self) -> torch.Tensor:
        """A parameter of the recurrent modules: the dtype and device of states."""
        return next(p for m in self.modules for p in m.parameters())

    def in_keys(self, tensor_keys) -> list[NestedKey]:
        """What a segment must hold.

        The transitions, ``is_init`` and, with ``recurrent_state="stored"``, each
        module's hidden state.
        """
        stored = list(self.states) if self.recurrent_state == "stored" else []
        return [*transition_in_keys(self.obs_keys, tensor_keys), *stored, IS_INIT]

    def split_burn_in(
        self, data: TensorDictBase, owner: str
    ) -> tuple[TensorDictBase | None, TensorDictBase]:
        """Splits a ``[*B, T]`` segment (time last) at the burn-in.

        Returns ``(steps 0 .. k-1, steps k .. T-1)``, or ``(None, data)`` without
        burn-in.
        """
        k = self.burn_in
        if not k:
            return None, data
        T = data.batch_size[-1]
        if k >= T:
            raise ValueError(
                f"{owner}: burn_in={k} leaves no step to learn from in segments of "
                f"{T} steps; sample segments longer than the burn-in"
            )
        return data[..., :k], data[..., k:]

    def resets(
        self,
        data: TensorDictBase,
        done: torch.Tensor,
        owner: str,
        done_before: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The steps whose incoming state is zero, ``[*B, T]`` booleans.

        ``is_init_t`` or ``done_{t-1}``; ``done_before`` is the ``done`` of the step
        before the first.
        """
        is_init = get_entry(
            data,
            IS_INIT,
            owner,
            "the episode-start flag of each step (TorchRL's InitTracker writes it); "
            "recurrent networks reset their state there",
        )
        reset = as_step_tensor(is_init, data.batch_size, repr(IS_INIT), owner)
        reset = reset.squeeze(-1).bool()
        after_done = torch.cat(
            [
                done[..., :1] & False
                if done_before is None
                else done_before[..., None],
                done[..., :-1],
            ],
            -1,
        )
        return reset | after_done

    def initial_states(
        self, data: TensorDictBase, like: torch.Tensor, owner: str
    ) -> dict[NestedKey, torch.Tensor]:
        """The state entering the segment's first step, before any reset.

        ``{state key: [R, *shape]}`` for ``R`` rows, in ``like``'s dtype and device (a
        parameter of the networks).
        """
        batch = tuple(data.batch_size)
        rows = math.prod(batch[:-1])
        out = {}
        for key, (module, shape) in self.states.items():
            if self.recurrent_state == "zero":
                out[key] = like.new_zeros(rows, *shape)
                continue
            value = get_entry(
                data,
                key,
                owner,
                f"the hidden state of {type(module).__name__} stored with each step "
                f"(the collector stores it when the environment has the module's "
                f"make_tensordict_primer()); or use recurrent_state='zero'",
            )
            expected = (*batch, *shape)
            if tuple(value.shape) != expected:
                raise ValueError(
                    f"{owner}: hidden state {key!r} has shape {tuple(value.shape)}, "
                    f"expected {expected}: the [*B, T] batch, then "
                    f"(num_layers * directions, size) = {shape} of its "
                    f"{type(module).__name__}"
                )
            out[key] = value[..., 0, :, :].reshape(rows, *shape).to(like)
        return out

    def run(
        self,
        inputs: TensorDictBase,
        *,
        output_key: NestedKey,
        actor_params=None,
        critic_params=None,
        detach_shared: bool = False,
        states: bool = False,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Runs the actor and the critic over ``[R, L]`` sequences in recurrent mode.

        The actor runs to its distribution parameters; the outputs are written into
        ``inputs``. With ``states``, the recurrent modules' own forward also writes the
        states after each sequence, else they run in pieces (:func:`run_in_pieces`).
        """
        ev = self.evaluator
        pieces = () if states else self.modules
        with set_recurrent_mode(True), _skip_existing_set_to(False):
            with ev.params_context(actor_params, ev.actor_network):
                run_in_pieces(policy_modules(ev.actor_network), inputs, pieces)
            params = {name: inputs.get(key) for name, key in ev.dist_param_keys.items()}
            if detach_shared:
                for key in (*ev.shared_out_keys, *self.features):
                    inputs.set(key, inputs.get(key).detach())
            with ev.params_context(critic_params, ev.critic_network):
                run_in_pieces(ev.critic_modules, inputs, pieces)
        return params, inputs.get(output_key)

    def window(
        self,
        data: TensorDictBase,
        prefix: TensorDictBase | None,
        *,
        done: torch.Tensor,
        terminated: torch.Tensor,
        prefix_done: torch.Tensor | None = None,
        output_key: NestedKey,
        actor_params=None,
        critic_params=None,
        like: torch.Tensor,
        owner: str,
    ) -> SequenceWindow:
        """The sequences over ``data``, with the states entering them.

        ``data`` holds the steps after the burn-in ``prefix``, whose ``done`` flags are
        ``prefix_done``.
        """
        if prefix is None:
            states = self.initial_states(data, like, owner)
            done_before = None
        else:
            with torch.no_grad():
                warm = SequenceWindow(
                    prefix,
                    self.obs_keys,
                    self.initial_states(prefix, like, owner),
                    self.resets(prefix, prefix_done, owner),
                    owner=owner,
                )
                self.run(
                    warm.inputs,
                    states=True,
                    output_key=output_key,
                    actor_params=actor_params,
                    critic_params=critic_params,
                )
            states = {
                key: warm.inputs.get(out_key)[:, -1]
                for key, out_key in self._state_out.items()
            }
            done_before = prefix_done[..., -1]
        return SequenceWindow(
            data,
            self.obs_keys,
            states,
            self.resets(data, done, owner, done_before),
            done=done,
            terminated=terminated,
            owner=owner,
        )

    def average_dist_params(
        self,
        full: TensorDictBase,
        done: torch.Tensor,
        params,
        *,
        owner: str,
    ) -> dict[str, torch.Tensor]:
        """The averaged policy's distribution parameters after the burn-in.

        At steps ``burn_in .. T-1`` of ``full`` (the whole segment), ``[*B, T - burn_in,
        ...]``: the actor with ``params``, run over the whole segment from the same
        states.
        """
        ev = self.evaluator
        like = self.parameter()
        window = SequenceWindow(
            full,
            self.obs_keys,
            {
                k: v
                for k, v in self.initial_states(full, like, owner).items()
                if self.states[k][0] in self.actor_modules
            },
            self.resets(full, done, owner),
            owner=owner,
        )
        inputs = window.inputs
        with (
            torch.no_grad(),
            set_recurrent_mode(True),
            _skip_existing_set_to(False),
            ev.params_context(params, ev.actor_network),
        ):
            run_in_pieces(policy_modules(ev.actor_network), inputs, self.actor_modules)
        k = self.burn_in
        return {
            name: window.current(inputs.get(key))[..., k:, :]
            for name, key in ev.dist_param_keys.items()
        }


def run_in_pieces(modules, tensordict: TensorDictBase, pieces) -> None:
    """Calls each of ``modules`` on ``tensordict``, those in ``pieces`` in pieces.

    The recurrent modules in ``pieces`` run by :func:`forward_in_pieces`. A
    ``TensorDictSequential`` holding one of them is walked module by module
    (each module writes into ``tensordict``, which the next reads); any other
    module is called as it is. Left out of ``pieces``: a bidirectional RNN
    (padding would reach its outputs) and a module set to TorchRL's ``"scan"``
    or ``"triton"`` backend (the user's choice), which run their own forward.
    """
    for module in modules:
        if isinstance(module, (LSTMModule, GRUModule)) and any(
            module is m for m in pieces
        ):
            if not module_rnn(module).bidirectional and module.recurrent_backend in (
                "auto",
                "pad",
            ):
                forward_in_pieces(module, tensordict)
                continue
        elif isinstance(module, TensorDictSequential) and any(
            m is p for m in module.modules() for p in pieces
        ):
            run_in_pieces(submodules(module), tensordict, pieces)
            continue
        module(tensordict)


def forward_in_pieces(
    module: LSTMModule | GRUModule, tensordict: TensorDictBase
) -> TensorDictBase:
    """The output of ``module`` in recurrent mode on ``[R, L]`` rows.

    As its forward computes it (not the states after each step), written into
    ``tensordict`` under the module's first out_key.

    The rows are cut before each ``is_init`` into pieces that start from the state
    stored at their first entry, as TorchRL's forward cuts them. It then packs
    them, and a packed LSTM or GRU runs step by step in small operations; here the
    pieces, longest first and padded after their end, go through the module's RNN
    in a few calls over consecutive spans of time, each on the pieces still
    running and from the states the previous one left.
    """
    R, L = tensordict.batch_size
    x = tensordict.get(module.in_keys[0])
    entry = torch.arange(R * L, device=x.device)
    starts = tensordict.get(IS_INIT).reshape(R * L) | (entry % L == 0)
    first = entry[starts]  # each piece's first entry
    count = len(first)
    if count == R:  # no reset after a row's first entry: nothing to cut
        return module(tensordict)
    lengths, order = torch.diff(first, append=entry[-1:] + 1).sort(
        descending=True, stable=True
    )
    rank = torch.empty_like(order).index_put(
        (order,), torch.arange(count, device=order.device)
    )
    piece = starts.long().cumsum(0) - 1
    # entry e is at [rank of its piece, its index in the piece] of the pieces
    at = (rank[piece], entry - first[piece])
    lengths = lengths.tolist()
    index = entry.new_zeros(count, lengths[0]).index_put(at, entry)
    hidden = [
        tensordict.get(key).flatten(0, 1)[index[:, 0]].transpose(0, 1).contiguous()
        for key in module.in_keys[1:-1]
    ]
    state = tuple(hidden) if len(hidden) > 1 else hidden[0]
    x = x.flatten(0, 1)[index]
    rnn = module_rnn(module)
    outputs, t, running = [], 0, count
    while t < lengths[0]:
        # a span ends where half of its pieces have: padding at most doubles the work
        half = (running + 1) // 2
        end = lengths[half] if half < running else lengths[0]
        y, state = rnn(x[:running, t:end], state)
        outputs.append(torch.nn.functional.pad(y, (0, 0, 0, 0, 0, count - running)))
        t = end
        running = sum(n > t for n in lengths[:running])
        # cuDNN takes contiguous states only
        state = (
            tuple(s[:, :running].contiguous() for s in state)
            if isinstance(state, tuple)
            else state[:, :running].contiguous()
        )
    y = torch.cat(outputs, 1)[at]
    tensordict.set(module.out_keys[0], y.reshape(R, L, *y.shape[1:]))
    return tensordict


class SequenceWindow:
    """The observations of a ``[*B, T]`` segment (time last) as ``R`` sequences.

    Row ``b`` holds ``s_0 .. s_{T-1}`` in order with the real next observation of
    each mid-row truncation inserted after its step and ``s'_{T-1}`` after the last
    step (with ``done`` and ``terminated``), or the ``T`` observations alone
    (without them). ``inputs`` is the ``[R, L]`` TensorDict the networks run on:
    observations, ``is_init`` (the resets) and each hidden state, zero except at
    the first entry, where the state entering the row is.

    Attributes:
        inputs: the ``[R, L]`` TensorDict.
        positions: ``[R, T]``, where step ``t`` of each row is in ``inputs``; its
            next observation's output is at ``positions + 1``.
    """

    def __init__(
        self,
        data: TensorDictBase,
        obs_keys: list[NestedKey],
        states: dict[NestedKey, torch.Tensor],
        reset: torch.Tensor,
        *,
        done: torch.Tensor | None = None,
        terminated: torch.Tensor | None = None,
        owner: str,
    ):
        self.batch_shape = data.batch_size[:-1]
        T = self.T = data.batch_size[-1]
        R = self.rows = math.prod(self.batch_shape)
        device = reset.device
        steps = torch.arange(T, device=device).expand(R, T)
        self._row_index = torch.arange(R, device=device)[:, None].expand(R, T)
        with_next = done is not None
        if with_next:
            truncation = (done & ~terminated).reshape(R, T).clone()
            truncation[:, -1] = False
            extra = truncation.long()
            # step t moves right by the number of truncations before it
            self.positions = steps + extra.cumsum(1) - extra
            length = T + 1 + int(extra.sum(1).max())
            has_next = truncation
            has_next[:, -1] = True
            next_rows, next_steps = has_next.nonzero(as_tuple=True)
            next_positions = self.positions[next_rows, next_steps] + 1
        else:
            self.positions = steps
            length = T
        index = (self._row_index, self.positions)
        tensors = {}
        for key in obs_keys:
            obs = get_entry(data, key, owner, "an input of the policy or critic")
            obs = obs.reshape(R, T, *obs.shape[len(self.batch_shape) + 1 :])
            seq = obs.new_zeros(R, length, *obs.shape[2:]).index_put(index, obs)
            if with_next:
                next_obs = get_entry(
                    data,
                    _next(key),
                    owner,
                    "the next observation of each step, read at the last step and "
                    "at mid-row truncations",
                )
                next_obs = next_obs.reshape(obs.shape)
                seq = seq.index_put(
                    (next_rows, next_positions), next_obs[next_rows, next_steps]
                )
            tensors[key] = seq
        reset = reset.reshape(R, T)
        # padding after a row's end continues it: no split, no output read
        tensors[IS_INIT] = (
            torch.zeros(R, length, dtype=torch.bool, device=device)
            .index_put(index, reset)
            .unsqueeze(-1)
        )
        for key, state in states.items():
            first = torch.where(
                reset[:, 0].reshape(R, *(1,) * (state.ndim - 1)),
                torch.zeros_like(state),
                state,
            )
            seq = state.new_zeros(R, length, *state.shape[1:])
            tensors[key] = torch.cat([first.unsqueeze(1), seq[:, 1:]], 1)
        self.inputs = TensorDict(tensors, [R, length])

    def current(self, values: torch.Tensor) -> torch.Tensor:
        """Outputs on ``inputs`` (``[R, L, *F]``) at ``s_t``, ``[*B, T, *F]``."""
        out = values[self._row_index, self.positions]
        return out.reshape(*self.batch_shape, self.T, *values.shape[2:])

    def flat_current(self, keys: list[NestedKey]) -> TensorDictBase:
        """The entries ``keys`` of ``inputs`` at each ``s_t``, for heads run on steps.

        The observations, and the features the networks wrote there, ``[prod(B) T]``,
        steps in the order of ``[*B, T]`` flattened.
        """
        # current() is [*B, T, *F]: B's dims and T flattened into one
        last = len(self.batch_shape)
        return TensorDict(
            {key: self.current(self.inputs.get(key)).flatten(0, last) for key in keys},
            [self.rows * self.T],
        )

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs on ``inputs`` split into ``(at s_t, at s'_t)``, each ``[*B, T, *F]``."""
        nxt = values[self._row_index, self.positions + 1]
        nxt = nxt.reshape(*self.batch_shape, self.T, *values.shape[2:])
        return self.current(values), nxt
