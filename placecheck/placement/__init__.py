"""Models placed across several devices by their own code (``--device keep``), and replicated ones.

The room for multi-device placement. Nothing here calls ``.to()`` on the
model: the model is built under simulated CUDA with as many GPUs as asked
(``--gpus N``; without it :data:`DEFAULT_GPUS`, and the devices the model
actually uses are read from its tensors afterwards, :func:`placecheck.placement.placed.devices_used`),
and audited as it placed itself (the expected devices and the flows live beside the forward's recorder
in :mod:`placecheck.checks`, which reads them, so that the package order holds):

- :mod:`placecheck.checks.expected`: the device each module is expected to
  compute on, decided from the state it holds (the walk and the forward judge
  every tensor against it);
- :func:`placecheck.placement.placed.input_device`: the device the forward's inputs go to, the device of
  the first tensor of the model the input data meets (a trial forward that
  stops there);
- :mod:`placecheck.checks.flows`: the module stack, each tensor's stage, and
  every copy between devices in one forward (the cross-device traffic, PC208);
- :func:`placecheck.placement.devicemap.device_map`: the report's device map (per stage, its devices
  and bytes) with those copies, as :class:`placecheck.findings.report.DeviceMap`.

:mod:`placecheck.placement.replicas` audits DataParallel, DDP and FSDP2 models
as each replica or rank sees them (``--wrap``): one ordinary audit per replica,
replica k against ``cuda:k``, merged.
"""

from __future__ import annotations

DEFAULT_GPUS = 8
"""GPUs simulated for ``--device keep`` without ``--gpus``: one common node. ``torch.cuda.device_count()``
answers it, so a model that spreads itself over every GPU spreads over 8; one that hard-codes its
devices uses what it names (listed in the device map)."""
