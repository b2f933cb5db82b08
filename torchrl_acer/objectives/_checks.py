"""Input validation shared by the estimator and the loss.

Structural checks (keys, shapes) read metadata only and cost nothing on any device.
Value checks (finite log-probabilities, actions in range) reduce over the data and
synchronise with the device; callers run them only when their ``check_values`` flag
is on.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey


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
