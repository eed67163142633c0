"""Every finding code placecheck can emit: one module per rule family, as ruff keeps a rule per file.

Each :class:`Rule` holds the code, the stable ``kind`` slug, the default
severity, a one-line title and the explanation that ``placecheck explain``
prints; the family's module declares it beside the builders of its messages
and hints. The texts state PyTorch's real rules (docs/contract.md, "What
PyTorch does"), not the folklore of the seed articles.

| module | codes |
| --- | --- |
| :mod:`.walk` | PC1xx: what ``.to()`` leaves behind, found by the walk after it |
| :mod:`.forward` | PC2xx: the forward, the judge of its events, and the message parts all share |
| :mod:`.script` | PC209, and the messages of a whole script under ``placecheck run`` |
| :mod:`.training` | PC3xx: checkpoints and optimizers |
| :mod:`.ranks` | PC4xx: the ranks of a torchrun launch |
| :mod:`.incomplete` | PC9xx: an audit that did not finish |
| :mod:`.registry` | the rule table, the severity policy, lookups and code selectors |

The codes themselves are :class:`placecheck.basics.codes.Code` (re-exported
here); importing this package refuses a code without a rule. Callers import
from the package (``from placecheck.findings import rules``), not from a
family. This package must not import torch.
"""

from __future__ import annotations

from placecheck.basics.codes import Code, expand
from placecheck.findings.rules.forward import (
    ForwardFindings,
    came_from,
    created_in_forward,
    created_off_device,
    created_then_cached,
    device_mismatch,
    device_mismatch_untraced,
    dtensor_mixed,
    event_finding,
    forward_error,
    forward_findings,
    generator_off_device,
    gradient_off_device,
    host_argument_on_device,
    host_sync,
    implicit_transfer,
    in_library,
    landed_on,
    made_by_api,
    offloaded_weights,
    on_replicas,
    output_off_device,
    ping_pong,
    unsynchronized_read,
)
from placecheck.findings.rules.incomplete import audit_incomplete
from placecheck.findings.rules.ranks import (
    collective_on_host,
    rank_loaded_off_device,
    rank_off_device,
    ranks_share_gpu,
)
from placecheck.findings.rules.registry import (
    RAISED_BY_EVIDENCE,
    RULES,
    SEVERITY_CHANGES,
    Rule,
    SeverityChange,
    make_finding,
    rule,
    seal,
    selected,
    severity,
    severity_changes,
)
from placecheck.findings.rules.script import (
    cached_in_run,
    created_in_script,
    creation_in_run,
    index_in_run,
    layer_built_in_forward,
    loop_sync,
    parameter_built_in_forward,
    repeated_copy,
    script_device_mismatch,
    script_error,
    script_host_sync,
    sync_in_installed_forward,
)
from placecheck.findings.rules.training import (
    checkpoint_load_hint,
    checkpoint_on_absent_device,
    checkpoint_on_several_devices,
    dtype_mismatch,
    key_prefix,
    missing_key,
    missing_module,
    optimizer_state_off_device,
    shape_mismatch,
    stale_optimizer,
    unexpected_key,
    unexpected_module,
    unsafe_checkpoint,
    unsafe_globals_text,
)
from placecheck.findings.rules.walk import (
    buffer_off_device,
    left_out_of_sharding,
    library_state_hint,
    param_off_device,
    placed_stray,
    stray_handled_by_forward,
    stray_tensor,
    stray_verdict,
    unregistered_module,
    unregistered_parameter,
    walk_finding,
)

seal()  # every family above declared its rules: sort them, and refuse a Code without one

__all__ = [
    "RAISED_BY_EVIDENCE",
    "RULES",
    "SEVERITY_CHANGES",
    "Code",
    "ForwardFindings",
    "Rule",
    "SeverityChange",
    "audit_incomplete",
    "buffer_off_device",
    "cached_in_run",
    "came_from",
    "checkpoint_load_hint",
    "checkpoint_on_absent_device",
    "checkpoint_on_several_devices",
    "collective_on_host",
    "created_in_forward",
    "created_in_script",
    "created_off_device",
    "created_then_cached",
    "creation_in_run",
    "device_mismatch",
    "device_mismatch_untraced",
    "dtensor_mixed",
    "dtype_mismatch",
    "event_finding",
    "expand",
    "forward_error",
    "forward_findings",
    "generator_off_device",
    "gradient_off_device",
    "host_argument_on_device",
    "host_sync",
    "implicit_transfer",
    "in_library",
    "index_in_run",
    "key_prefix",
    "landed_on",
    "layer_built_in_forward",
    "left_out_of_sharding",
    "library_state_hint",
    "loop_sync",
    "made_by_api",
    "make_finding",
    "missing_key",
    "missing_module",
    "offloaded_weights",
    "on_replicas",
    "optimizer_state_off_device",
    "output_off_device",
    "param_off_device",
    "parameter_built_in_forward",
    "ping_pong",
    "placed_stray",
    "rank_loaded_off_device",
    "rank_off_device",
    "ranks_share_gpu",
    "repeated_copy",
    "rule",
    "script_device_mismatch",
    "script_error",
    "script_host_sync",
    "selected",
    "severity",
    "severity_changes",
    "shape_mismatch",
    "stale_optimizer",
    "stray_handled_by_forward",
    "stray_tensor",
    "stray_verdict",
    "sync_in_installed_forward",
    "unexpected_key",
    "unexpected_module",
    "unregistered_module",
    "unregistered_parameter",
    "unsafe_checkpoint",
    "unsafe_globals_text",
    "unsynchronized_read",
    "walk_finding",
]
