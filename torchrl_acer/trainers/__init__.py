"""ACER's trainer and the hooks it is made of, laid out as TorchRL's ``torchrl/trainers``.

The hooks (non-finite guard, policy versions, graceful stop, failure checkpoint,
run-directory ownership) are :class:`~torchrl.trainers.TrainerHookBase` s that any
TorchRL :class:`~torchrl.trainers.Trainer` can register.
"""
