"""Running the policy and the critic once over a window of transitions.

Retrace and ACER need the networks at every ``s_t`` of a ``[*B, T]`` batch and at
every real next observation ``s'_t``. Inside an episode ``s'_t == s_{t+1}``, so the
``T + 1`` observations ``s_0 .. s_{T-1}, s'_{T-1}`` of a row cover both. The only
``s'_t`` they miss are the mid-row truncations (``done`` and not ``terminated``
before the last step): those are bootstrapped from ``V(s'_t)`` and ``s'_t`` is not
the next row entry (a reset observation is). They are appended as extra inputs, so
the networks see ``B (T + 1) + K`` observations in one call, ``K`` the number of
mid-row truncations, instead of ``2 B T``. Mid-row terminations need no extra
input: their next value is multiplied by zero. This is TorchRL's ``shifted=True``
(one call over the shifted observations), exact for any number of resets in a row.

With ``shifted=False`` (TorchRL's default meaning) the window makes no assumption
about ``s'_t``: the networks see the ``B T`` observations and the ``B T`` next
observations, still in one call.

Networks holding TorchRL's recurrent modules cannot take independent observations;
the estimator runs them over sequences instead (``_recurrent.py``).

The input checks the estimator and the loss share (keys, shapes, finite values)
are here too.
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections.abc import Mapping

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
    set_skip_existing,
    skip_existing,
)
from tensordict.utils import NestedKey
from torchrl._utils import is_compiling
from torchrl.modules import GRUModule, LSTMModule

# -- input validation, shared by the estimator and the loss: structural checks
# (keys, shapes) read metadata only; value checks (finite values, actions in
# range) reduce over the data and run only with check_values


class MissingKeyError(KeyError):
    """A ``KeyError`` whose message prints as written (no repr quoting)."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_entry(
    tensordict: TensorDictBase, key: NestedKey, owner: str, what: str
) -> torch.Tensor:
    """Reads ``key``, raising a ``KeyError`` that names it and says what it should hold."""
    value = tensordict.get(key, None)
    if value is None:
        raise MissingKeyError(
            f"{owner}: the input tensordict has no entry {key!r}, expected {what}. "
            f"Its keys are {sorted(map(str, tensordict.keys(True, True)))}; "
            f"use set_keys(...) if the entry has another name."
        )
    return value


def as_step_tensor(
    value: torch.Tensor, batch_shape: torch.Size, name: str, owner: str
) -> torch.Tensor:
    """Returns a per-step entry as ``[*batch_shape, 1]``.

    Accepts ``[*batch_shape]`` (TorchRL's log-probabilities) and
    ``[*batch_shape, 1]`` (rewards and done flags).
    """
    shape = tuple(value.shape)
    batch = tuple(batch_shape)
    if shape == batch:
        return value.unsqueeze(-1)
    if shape == (*batch, 1):
        return value
    raise ValueError(
        f"{owner}: {name} has shape {shape}, expected {batch} or {(*batch, 1)} "
        f"(one value per step of the [*B, T] batch)"
    )


def check_finite(value: torch.Tensor, name: str, owner: str, what: str) -> None:
    """Raises ``ValueError`` naming ``name`` if ``value`` holds NaN or infinities."""
    bad = ~torch.isfinite(value)
    if bad.any():
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{owner}: {name} holds {bad.sum().item()} non-finite values (first at "
            f"index {index}: {value[index].item()}); {what}"
        )


def check_not_empty(tensordict: TensorDictBase, owner: str) -> None:
    """Raises ``ValueError`` for a batch with no row or no step."""
    if 0 in tensordict.batch_size:  # TensorDict.numel() is at least 1
        raise ValueError(
            f"{owner}: got an empty batch (batch_size "
            f"{tuple(tensordict.batch_size)}); a [*B, T] batch needs at least one row "
            f"and one step"
        )


def explain_dtype_error(
    error: RuntimeError, inputs: TensorDictBase, networks, owner: str
) -> None:
    """Re-raises torch's dtype clash between the data and a network, naming both.

    Called only after a network call failed, so the check costs nothing on the
    normal path.
    """
    param_dtypes = {
        p.dtype for net in networks for p in net.parameters() if p.is_floating_point()
    }
    clashes = {
        key: value.dtype
        for key, value in inputs.items(True, True)
        if value.is_floating_point() and value.dtype not in param_dtypes
    }
    if param_dtypes and clashes:
        raise ValueError(
            f"{owner}: the inputs {clashes} do not have the networks' parameter dtype "
            f"{sorted(map(str, param_dtypes))}; cast the data (e.g. TorchRL's "
            f"DoubleToFloat transform) or the networks (.to(dtype))"
        ) from error


def check_action_range(action_index: torch.Tensor, num_actions: int, owner: str):
    """Raises ``ValueError`` naming the first action index outside the policy's."""
    bad = (action_index < 0) | (action_index >= num_actions)
    if bad.any():
        index = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{owner}: action {action_index[index].item()} at index {index} is out "
            f"of range for the {num_actions} actions of the policy"
        )


def action_index(
    action: torch.Tensor,
    batch_shape: torch.Size,
    num_actions: int,
    *,
    one_hot: bool,
    owner: str,
    check_values: bool,
) -> torch.Tensor:
    """Returns the stored discrete actions as ``[*batch_shape]`` indices.

    ``one_hot`` actions are ``[*batch_shape, num_actions]``; index actions are
    ``[*batch_shape]`` or ``[*batch_shape, 1]``.
    """
    batch = tuple(batch_shape)
    if one_hot:
        if tuple(action.shape) != (*batch, num_actions):
            raise ValueError(
                f"{owner}: one-hot action has shape {tuple(action.shape)}, expected "
                f"{(*batch, num_actions)} for a batch {batch} and {num_actions} actions"
            )
        if check_values:
            ones = (action == 1).sum(-1)
            zeros = (action == 0).sum(-1)
            if not ((ones == 1) & (zeros == num_actions - 1)).all():
                raise ValueError(
                    f"{owner}: one-hot action holds rows that are not one-hot "
                    f"(exactly one 1 and {num_actions - 1} zeros)"
                )
        return action.argmax(-1)
    if tuple(action.shape) == (*batch, 1):
        action = action.squeeze(-1)
    if tuple(action.shape) != batch:
        raise ValueError(
            f"{owner}: action has shape {tuple(action.shape)}, expected {batch} or "
            f"{(*batch, 1)} (action indices for a Categorical policy)"
        )
    if action.is_floating_point():
        raise ValueError(
            f"{owner}: action has dtype {action.dtype}, expected integer indices"
        )
    if check_values:
        check_action_range(action, num_actions, owner)
    return action.long()


class ObservationWindow:
    """The observations of a ``[*B, T]`` batch (time last), flattened for one call.

    Attributes:
        tensors: ``{key: [B (T + 1) + K, ...]}``, the networks' inputs as plain
            tensors.
        current_tensors: ``{key: [B T, ...]}``, the observations ``s_t`` alone.
        inputs: ``tensors`` as a flat TensorDict (built when first read).
        current: ``current_tensors`` as a flat TensorDict (built when first read).
        num_extra: ``K``, the number of mid-row truncations; under
            ``torch.compile``, a bound on it (see ``extra_bound``).
        shifted: whether ``inputs`` is the shifted window above (``True``) or the
            ``B T`` observations followed by the ``B T`` next observations
            (``False``).

    Under ``torch.compile`` the number of mid-row truncations is data: a shape
    depending on it would break the graph. There the extra inputs are the next
    observations of the first ``extra_bound(rows)`` mid-row truncations (one per
    row by default, enough whenever episodes are longer than the window), padded
    with other real next observations whose outputs are not used, so every shape
    is static; more truncations than the bound fail with an error rather than
    giving wrong values.
    """

    #: the bound on mid-row truncations under ``torch.compile``, from the number
    #: of rows; assign a function to change it
    extra_bound = staticmethod(lambda rows: rows)

    def __init__(
        self,
        tensordict: TensorDictBase,
        in_keys: list[NestedKey],
        *,
        done: torch.Tensor,
        terminated: torch.Tensor,
        owner: str,
        shifted: bool = True,
    ):
        self.batch_shape = tensordict.batch_size[:-1]
        self.T = tensordict.batch_size[-1]
        self.shifted = shifted
        self._static_extra = False
        time = len(self.batch_shape)
        rows = math.prod(self.batch_shape)
        if not shifted:
            current, both = {}, {}
            for key in in_keys:
                obs = get_entry(tensordict, key, owner, "an input of the networks")
                next_obs = get_entry(
                    tensordict, _next(key), owner, "the next observation of each step"
                )
                current[key] = obs.flatten(0, time)
                both[key] = torch.cat([current[key], next_obs.flatten(0, time)], 0)
            self.num_extra = 0
            self._set(both, current, 2 * rows * self.T)
            return
        mid_truncation = done & ~terminated
        mid_truncation[..., -1] = False
        self.mid_truncation = mid_truncation
        if is_compiling():
            bound = min(self.extra_bound(rows), rows * (self.T - 1))
            self._static_extra = True
            self.num_extra = bound
            if bound:
                flat = mid_truncation.flatten()
                torch._assert_async(
                    flat.sum() <= bound,
                    f"{owner}: under torch.compile the window holds at most {bound} "
                    f"mid-row truncations (ObservationWindow.extra_bound); this batch "
                    f"has more",
                )
                # the truncations first, in order, then any other steps
                self._extra_index = torch.argsort(
                    flat.to(torch.uint8), descending=True, stable=True
                )[:bound]
            any_extra = bound > 0
        else:
            # plain tensor operations per key: TensorDict-level select/cat/reshape
            # cost tens of microseconds each, which adds up in small-network updates
            any_extra = bool(mid_truncation.any())
        window, current, extra = {}, {}, {}
        for key in in_keys:
            obs = get_entry(tensordict, key, owner, "an input of the policy or critic")
            next_obs = get_entry(
                tensordict,
                _next(key),
                owner,
                "the next observation of each step, read at the last step and at "
                "mid-row truncations",
            )
            window[key] = torch.cat([obs, next_obs.narrow(time, self.T - 1, 1)], time)
            window[key] = window[key].flatten(0, time)
            current[key] = obs.flatten(0, time)
            if any_extra:
                if self._static_extra:
                    extra[key] = next_obs.flatten(0, time)[self._extra_index]
                else:
                    extra[key] = next_obs[mid_truncation]
        if not self._static_extra:
            self.num_extra = next(iter(extra.values())).shape[0] if any_extra else 0
        if any_extra:
            window = {k: torch.cat([v, extra[k]], 0) for k, v in window.items()}
        self._set(window, current, rows * (self.T + 1) + self.num_extra)

    def _set(self, window, current, size):
        self.tensors = window
        self.current_tensors = current
        self._size = size
        self._inputs = self._current = None

    @property
    def inputs(self) -> TensorDictBase:
        if self._inputs is None:
            self._inputs = TensorDict(self.tensors, [self._size])
        return self._inputs

    @property
    def current(self) -> TensorDictBase:
        if self._current is None:
            rows = math.prod(self.batch_shape)
            self._current = TensorDict(self.current_tensors, [rows * self.T])
        return self._current

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Splits the outputs on ``inputs`` into ``(at s_t, at s'_t)``.

        Each is ``[*B, T, *F]``.
        """
        feature_shape = values.shape[1:]
        if not self.shifted:
            current, nxt = values.reshape(2, *self.batch_shape, self.T, *feature_shape)
            return current, nxt
        n = math.prod(self.batch_shape) * (self.T + 1)
        window = values[:n].reshape(*self.batch_shape, self.T + 1, *feature_shape)
        time = len(self.batch_shape)
        current = window.narrow(time, 0, self.T)
        nxt = window.narrow(time, 1, self.T)
        if self.num_extra:
            mask = self.mid_truncation.reshape(
                *self.mid_truncation.shape, *(1,) * len(feature_shape)
            )
            if self._static_extra:
                # the padding's outputs land on steps that are not truncations
                # and are masked out; every shape is static
                extra = values.new_zeros(
                    n - math.prod(self.batch_shape), *feature_shape
                )
                extra = extra.index_copy(0, self._extra_index, values[n:])
                nxt = torch.where(mask, extra.view_as(nxt), nxt)
            else:
                nxt = nxt.masked_scatter(mask.expand_as(nxt), values[n:])
        return current, nxt


def _next(key: NestedKey) -> tuple[str, ...]:
    return ("next", *key) if isinstance(key, tuple) else ("next", key)


def transition_in_keys(obs_keys, keys) -> list:
    """The entries a ``[*B, T]`` batch must hold for Retrace.

    The networks' observations now and next, the action, its behaviour log-probability,
    and the reward and end flags under ``"next"``.
    """
    return [
        *obs_keys,
        *map(_next, obs_keys),
        keys.action,
        keys.sample_log_prob,
        _next(keys.reward),
        _next(keys.done),
        _next(keys.terminated),
    ]


def _probabilistic_module(actor: TensorDictModuleBase) -> ProbabilisticTensorDictModule:
    for module in reversed(list(actor.modules())):
        if isinstance(module, ProbabilisticTensorDictModule):
            return module
    raise TypeError(
        f"actor_network must be a ProbabilisticActor (or a "
        f"ProbabilisticTensorDictSequential) ending in a probabilistic module, got "
        f"{type(actor).__name__}"
    )


class PolicyCriticEvaluator:
    """Calls the policy (up to its distribution parameters) and the critic once.

    When the critic is a :class:`~tensordict.nn.TensorDictSequential` whose leading
    modules are also modules of the actor (TorchRL's ``ActorValueOperator`` gives
    ``get_policy_operator()`` and ``get_value_operator()`` that share their first
    module), those shared modules run once, in the actor's pass, and the critic only
    runs its own head on their outputs.

    Args:
        actor_network: the policy.
        critic_network: the critic (whose parameters are passed at call time).
        dist_params: the distribution's parameters the actor must produce, e.g.
            ``("logits",)`` or ``("loc", "scale")``.
        critic_head: the part of the critic to run on the window, if not the whole
            critic (the value head of a stochastic dueling network).
    """

    def __init__(
        self,
        actor_network,
        critic_network,
        dist_params: tuple[str, ...],
        critic_head=None,
    ):
        self.actor_network = actor_network
        self.critic_network = critic_network
        #: whether a network holds TorchRL recurrent modules: then the estimator
        #: runs them over sequences (see ``_recurrent.py``), not on this window
        self.recurrent = False
        for name, network in (
            ("actor_network", actor_network),
            ("critic", critic_network),
        ):
            self.recurrent |= is_recurrent(network, name)
        # (id(params), id(module)) -> (weak refs to both, whether params are the
        # module's own); lives and dies with this evaluator
        self._own_params = {}
        prob_module = _probabilistic_module(actor_network)
        dist_keys = list(prob_module.dist_keys)
        missing = [p for p in dist_params if p not in dist_keys]
        if missing:
            raise ValueError(
                f"the actor's distribution must be parameterised by {list(dist_params)}"
                f", but its probabilistic module takes {dist_keys}"
            )
        self.dist_param_keys = {
            p: prob_module.in_keys[dist_keys.index(p)] for p in dist_params
        }
        self.distribution_class = prob_module.distribution_class
        critic_head = critic_network if critic_head is None else critic_head
        actor_modules = {id(m) for m in actor_network.modules()}
        shared = []
        # the critic's modules that run after the actor's pass (all of them,
        # unless it starts with the actor's own trunk)
        self.critic_modules = [critic_head]
        if isinstance(critic_head, TensorDictSequential):
            modules = list(critic_head.module)
            while modules and id(modules[0]) in actor_modules:
                shared.append(modules.pop(0))
            if shared:
                if not modules:
                    raise ValueError(
                        "critic_network is made only of modules of the actor network"
                    )
                self.critic_modules = modules
        self.shared_out_keys = [key for m in shared for key in m.out_keys]
        self.in_keys = list(
            dict.fromkeys([*actor_network.in_keys, *critic_head.in_keys])
        )
        # the averaged policy: a copy of the actor holding the target parameters,
        # see _average_actor
        self._average = None

    def __call__(
        self,
        inputs: TensorDictBase | Mapping[NestedKey, torch.Tensor],
        *,
        output_key: NestedKey,
        actor_params: TensorDictBase | None = None,
        critic_params: TensorDictBase | None = None,
        detach_shared: bool = False,
        skip_existing: bool = False,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Returns ``(distribution parameters, the critic's output_key)``.

        ``inputs`` is a flat TensorDict or a dict of flat tensors. With
        ``skip_existing`` the critic's modules whose outputs ``inputs`` already
        holds are skipped (the policy always runs: the behaviour logits stored
        with the data must never stand in for the current policy's).
        """
        data = _as_tensordict(inputs)
        with (
            self.params_context(actor_params, self.actor_network),
            _skip_existing_set_to(False),
        ):
            run_modules(policy_modules(self.actor_network), data)
        params = {name: data.get(key) for name, key in self.dist_param_keys.items()}
        if detach_shared:
            for key in self.shared_out_keys:
                data.set(key, data.get(key).detach())
        with (
            self.params_context(critic_params, self.critic_network),
            _skip_existing_set_to(skip_existing),
        ):
            run_modules(self.critic_modules, data)
        out = data.get(output_key)
        return params, out

    def dist_params_only(
        self,
        inputs: TensorDictBase | Mapping[NestedKey, torch.Tensor],
        params: TensorDictBase | None = None,
    ) -> dict[str, torch.Tensor]:
        """The policy's distribution parameters alone (the averaged policy's pass)."""
        data = _as_tensordict(inputs)
        if is_compiling():  # a traced swap, TorchRL's way
            with (
                self.params_context(params, self.actor_network),
                _skip_existing_set_to(False),
            ):
                run_modules(policy_modules(self.actor_network), data)
        else:
            with _skip_existing_set_to(False):
                run_modules(policy_modules(self._average_actor(params)), data)
        return {name: data.get(key) for name, key in self.dist_param_keys.items()}

    def _average_actor(self, params):
        """The actor, or a copy of it holding ``params`` (the averaged policy's).

        Swapping parameters in and out of the actor at every call costs more than
        a small network's forward. The copy, made once per ``params`` container,
        holds its very tensors (as buffers): ``SoftUpdate``, ``load_state_dict``
        and moves of the loss (``.to``, ``.float()``, which keep the tensors'
        identity) change them in place, so the copy follows. It is not a
        submodule of anything: state dicts do not change.
        """
        if self._is_own(params, self.actor_network):
            return self.actor_network
        cached = self._average
        if cached is None or cached[0]() is not params:
            actor = copy.deepcopy(self.actor_network)
            for key, value in params.items(True, True):
                *path, name = key if isinstance(key, tuple) else (key,)
                owner = actor.get_submodule(".".join(path))
                delattr(owner, name)
                owner.register_buffer(name, value)
            cached = self._average = (weakref.ref(params), actor)
        actor = cached[1]
        if actor.training is not self.actor_network.training:
            actor.train(self.actor_network.training)
        return actor

    def _is_own(self, params, module) -> bool:
        """Whether ``params`` are ``module``'s own tensors (or ``None``)."""
        if params is None:
            return True
        cache = self._own_params
        key = (id(params), id(module))
        cached = cache.get(key)
        if cached is None or cached[0]() is not params or cached[1]() is not module:
            for stale in [
                k for k, v in cache.items() if v[0]() is None or v[1]() is None
            ]:
                del cache[stale]
            mine = {id(t) for t in (*module.parameters(), *module.buffers())}
            given = [id(t) for t in params.values(True, True)]
            own = len(given) == len(mine) and mine.issuperset(given)
            cached = cache[key] = (weakref.ref(params), weakref.ref(module), own)
        return cached[2]

    def params_context(self, params, module):
        """Puts ``params`` in ``module`` for the call, unless they are its own.

        A loss's functional parameters are the module's own ``Parameter`` objects
        (``convert_to_functional`` keeps them), and swapping them in and out costs
        more than a small network's forward, so the swap is skipped for them; the
        averaged policy's parameters are swapped in. The identity check runs once
        per parameter container and module; entries whose container or module has
        died are dropped when a new one is added, so the cache holds only live
        pairs.
        """
        if self._is_own(params, module):
            return contextlib.nullcontext()
        return params.to_module(module, preserve_module_state=False)


def policy_modules(actor) -> list:
    """The modules of ``actor`` before its distribution (its ``det_part``'s)."""
    return submodules(actor.det_part)


def submodules(sequence: TensorDictSequential) -> list:
    """The modules a ``TensorDictSequential`` runs, in order."""
    modules = sequence.module
    return list(
        modules.values() if isinstance(modules, torch.nn.ModuleDict) else modules
    )


def run_modules(modules, tensordict: TensorDictBase) -> None:
    """Calls each of ``modules`` on ``tensordict`` in turn, as a sequence would.

    One by one rather than as the actor's ``det_part`` (a ``TensorDictSequential``
    the actor made), whose own call costs about as much as a small network's
    forward.
    """
    for module in modules:
        module(tensordict)


def _as_tensordict(inputs) -> TensorDictBase:
    if isinstance(inputs, TensorDictBase):
        return inputs.copy()
    size = next(iter(inputs.values())).shape[0]
    return TensorDict(dict(inputs), [size])


def _skip_existing_set_to(mode: bool):
    """``set_skip_existing(mode)``, or nothing when that is already the mode.

    The context manager costs more than a small network's forward.
    """
    if skip_existing() == mode:
        return contextlib.nullcontext()
    return set_skip_existing(mode)


def is_recurrent(network, name: str) -> bool:
    """Whether ``network`` holds TorchRL recurrent modules.

    ``LSTMModule`` or ``GRUModule``; raises for a bare ``torch.nn`` RNN.

    The window flattens ``[*B, T]`` into independent observations, so recurrent
    networks are run over sequences instead, with their stored hidden states and
    ``is_init`` resets; that needs the hidden-state keys TorchRL's modules
    declare. A bare ``nn.LSTM`` / ``nn.GRU`` (in a plain ``TensorDictModule``) has
    none: it would see neither its sequence nor its stored state, silently wrong.
    """
    wrapped = set()
    recurrent = False
    for module in network.modules():
        if isinstance(module, (LSTMModule, GRUModule)):
            recurrent = True
            wrapped.update(id(m) for m in module.modules())
    for sub_name, module in network.named_modules():
        if isinstance(module, torch.nn.RNNBase) and id(module) not in wrapped:
            where = f" at {sub_name!r}" if sub_name else ""
            raise TypeError(
                f"{name} contains a bare recurrent module{where} "
                f"({type(module).__name__}); ACER's loss and Retrace estimator run "
                f"recurrent networks over sequences from their stored hidden state, "
                f"which needs TorchRL's LSTMModule or GRUModule (they declare the "
                f"hidden-state keys and reset at is_init). Wrap it in one of them, "
                f"or use a feed-forward network."
            )
    return recurrent
