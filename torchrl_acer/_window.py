"""Running the policy and the critic once over a window of transitions.

Retrace and ACER need the networks at every ``s_t`` of a ``[*B, T]`` batch and at
every real next observation ``s'_t``. Inside an episode ``s'_t == s_{t+1}``, so the
``T + 1`` observations ``s_0 .. s_{T-1}, s'_{T-1}`` of a row cover both. The only
``s'_t`` they miss are the mid-row truncations (``done`` and not ``terminated``
before the last step): those are bootstrapped from ``V(s'_t)`` and ``s'_t`` is not
the next row entry (a reset observation is). They are appended as extra inputs, so
the networks see ``B (T + 1) + K`` observations in one call, ``K`` the number of
mid-row truncations, instead of ``2 B T``. Mid-row terminations need no extra
input: their next value is multiplied by zero.
"""

from __future__ import annotations

import contextlib
import math

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    ProbabilisticTensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from tensordict.utils import NestedKey

from torchrl_acer._checks import get_entry


class ObservationWindow:
    """The observations of a ``[*B, T]`` batch (time last), flattened for one call.

    Attributes:
        inputs: a flat ``[B (T + 1) + K]`` TensorDict holding only ``in_keys``.
        num_extra: ``K``, the number of mid-row truncations.
    """

    def __init__(
        self,
        tensordict: TensorDictBase,
        in_keys: list[NestedKey],
        *,
        done: torch.Tensor,
        terminated: torch.Tensor,
        owner: str,
    ):
        self.batch_shape = tensordict.batch_size[:-1]
        self.T = tensordict.batch_size[-1]
        for key in in_keys:
            get_entry(tensordict, key, owner, "an input of the policy or critic")
            get_entry(
                tensordict,
                _next(key),
                owner,
                "the next observation of each step, read at the last step and at "
                "mid-row truncations",
            )
        current = tensordict.select(*in_keys)
        last_next = tensordict.get("next")[..., -1:].select(*in_keys)
        window = torch.cat([current, last_next], dim=-1).reshape(-1)
        mid_truncation = (done & ~terminated).clone()
        mid_truncation[..., -1] = False
        self.mid_truncation = mid_truncation
        extra = tensordict.get("next")[mid_truncation].select(*in_keys)
        self.num_extra = extra.batch_size[0]
        self.inputs = torch.cat([window, extra], 0) if self.num_extra else window

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Splits ``[B (T + 1) + K, *F]`` outputs into ``(at s_t, at s'_t)``, each ``[*B, T, *F]``."""
        n = math.prod(self.batch_shape) * (self.T + 1)
        feature_shape = values.shape[1:]
        window = values[:n].reshape(*self.batch_shape, self.T + 1, *feature_shape)
        time = len(self.batch_shape)
        current = window.narrow(time, 0, self.T)
        nxt = window.narrow(time, 1, self.T)
        if self.num_extra:
            mask = self.mid_truncation.reshape(
                *self.mid_truncation.shape, *(1,) * len(feature_shape)
            ).expand_as(nxt)
            nxt = nxt.masked_scatter(mask, values[n:])
        return current, nxt


def _next(key: NestedKey) -> tuple[str, ...]:
    return ("next", *key) if isinstance(key, tuple) else ("next", key)


def _probabilistic_module(actor: TensorDictModuleBase) -> ProbabilisticTensorDictModule:
    modules = [actor, *getattr(actor, "_module_iter", lambda: [])()]
    for module in reversed(modules):
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
    """

    def __init__(self, actor_network, critic_network, dist_param: str):
        self.actor_network = actor_network
        self.critic_network = critic_network
        prob_module = _probabilistic_module(actor_network)
        dist_keys = list(prob_module.dist_keys)
        if dist_param not in dist_keys:
            raise ValueError(
                f"the actor's distribution must be parameterised by {dist_param!r}, "
                f"but its probabilistic module takes {dist_keys}"
            )
        self.dist_param_key = prob_module.in_keys[dist_keys.index(dist_param)]
        self.distribution_class = prob_module.distribution_class
        actor_modules = {id(m) for m in actor_network.modules()}
        shared = []
        critic_tail = critic_network
        if isinstance(critic_network, TensorDictSequential):
            modules = list(critic_network.module)
            while modules and id(modules[0]) in actor_modules:
                shared.append(modules.pop(0))
            if shared:
                if not modules:
                    raise ValueError(
                        "critic_network is made only of modules of the actor network"
                    )
                critic_tail = (
                    modules[0] if len(modules) == 1 else TensorDictSequential(*modules)
                )
        self.critic_tail = critic_tail
        self.shared_out_keys = [key for m in shared for key in m.out_keys]
        self.in_keys = list(
            dict.fromkeys([*actor_network.in_keys, *critic_network.in_keys])
        )

    def __call__(
        self,
        inputs: TensorDictBase,
        *,
        action_value_key: NestedKey,
        actor_params: TensorDictBase | None = None,
        critic_params: TensorDictBase | None = None,
        detach_shared: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(distribution parameter, action values)`` for ``inputs``."""
        data = inputs.copy()
        with _params_context(actor_params, self.actor_network):
            self.actor_network.get_dist_params(data)
        dist_param = data.get(self.dist_param_key)
        if detach_shared:
            for key in self.shared_out_keys:
                data.set(key, data.get(key).detach())
        with _params_context(critic_params, self.critic_network):
            q = self.critic_tail(data).get(action_value_key)
        return dist_param, q

    def dist_param_only(
        self, inputs: TensorDictBase, params: TensorDictBase | None = None
    ) -> torch.Tensor:
        data = inputs.copy()
        with _params_context(params, self.actor_network):
            self.actor_network.get_dist_params(data)
        return data.get(self.dist_param_key)


def _params_context(params, module):
    if params is None:
        return contextlib.nullcontext()
    return params.to_module(module, preserve_module_state=False)
