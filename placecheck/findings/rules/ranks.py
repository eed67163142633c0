"""PC4xx, the ranks of a torchrun launch (``placecheck run --nproc-per-node``): a rank on a GPU
other than its own (PC401), a CPU tensor in an NCCL collective (PC402).

Each rule's declaration (code, kind, default severity, title, explanation, wrong and right
code) comes first, then its builders: plain data in, the finding out (``placecheck.run.ranks`` only
gathers the evidence). Shared machinery (the rule table, the severity policy) is :mod:`.registry`'s. No
torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from placecheck.basics.codes import Code
from placecheck.basics.values import Device
from placecheck.findings.finding import Finding
from placecheck.findings.rules.registry import E, declare, make_finding

declare(Code.PC401, "rank-device", E, "run", "a rank's tensors or module on a GPU other than its own", """
torchrun starts one process per GPU and tells each its GPU in LOCAL_RANK;
nothing else does: torch.cuda.current_device() is 0 in every process until the
script calls torch.cuda.set_device(local_rank). A rank that moves its model or
creates its tensors with device="cuda" before set_device, a hard-coded
"cuda:0", or a torch.load whose map_location (or saved location) is cuda:0,
puts its work on GPU 0. Then every rank computes on one GPU (N copies of the
model and optimizer state: out of memory), and NCCL refuses two ranks on one
GPU at DistributedDataParallel(...) or the first collective ("Duplicate GPU
detected: rank 1 and rank 0 both on CUDA device"). Call
torch.cuda.set_device(local_rank) first and use torch.device("cuda",
local_rank); load checkpoints with map_location=f"cuda:{local_rank}" (or
"cpu").""", """
dist.init_process_group("nccl")
model = DDP(Net().to("cuda"))                 # cuda:0 on every rank
state = torch.load("ckpt.pt", map_location="cuda:0")
""", """
dist.init_process_group("nccl")
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
model = DDP(Net().to(local_rank), device_ids=[local_rank])
state = torch.load("ckpt.pt", map_location=f"cuda:{local_rank}")
""")

declare(Code.PC402, "collective-off-device", E, "run", "a CPU tensor in an NCCL collective", """
NCCL moves data between GPUs only: with init_process_group("nccl") a
collective (all_reduce, broadcast, all_gather, reduce_scatter, ...) given a
CPU tensor raises ("No backend type associated with device type cpu") at that
line, on every rank that reaches it; a DistributedDataParallel of a model left
on the CPU fails the same way at its construction. Put the tensor on the
rank's GPU before the collective (a loss accumulated on the host, a metric
built with torch.tensor(...) without device=), or initialise the process group
for both ("cuda:nccl,cpu:gloo", the default when no backend is given).""", """
total = torch.tensor([correct, seen])
dist.all_reduce(total)                        # CPU tensor, NCCL group
""", """
total = torch.tensor([correct, seen], device=device)
dist.all_reduce(total)
""")


# -- message builders of the ranks of a torchrun launch (placecheck run --nproc-per-node) -----------------

_SET_DEVICE = ("call torch.cuda.set_device(local_rank) (local_rank = int(os.environ['LOCAL_RANK'])) "
               "before placing anything, and use torch.device('cuda', local_rank)")


def rank_off_device(what: str, where: str, device: Device, own: Device, lines: Sequence[str]) -> Finding:
    """PC401: ``what`` (``Linear.to put the model``, ``randn made float32[16, 8]``; ``where``: the module or
    call) on ``device``, not on the rank's own GPU ``own``; ``lines``: the lines that put tensors there,
    the first one the finding's."""
    later = lines[1:]
    also = f"; also at {', '.join(later[:3])}{' and more' if len(later) > 3 else ''}" if later else ""
    return make_finding(
        Code.PC401, where=where, source=lines[0], device=device, expected=own, count=len(lines),
        message=f"{what} on {device}, not on the rank's own GPU ({own}, LOCAL_RANK){also}: 'cuda' means "
                "the current device, which is cuda:0 in every process until "
                "torch.cuda.set_device(local_rank), and a hard-coded 'cuda:0' is GPU 0 on every rank: the "
                "ranks share one GPU (N copies of the model there; NCCL refuses two ranks on one GPU at DDP "
                "or the first collective)",
        hint=_SET_DEVICE, details=(("lines", ", ".join(lines)),))


def rank_loaded_off_device(devices: str, own: str, line: str) -> Finding:
    """PC401: ``torch.load`` at ``line`` put a rank's state on ``devices``, not on its own GPU ``own``."""
    return make_finding(
        Code.PC401, where="torch.load", source=line, device=devices, expected=own,
        message=f"torch.load puts the checkpoint's tensors on {devices}, not on the rank's own GPU "
                f"({own}, LOCAL_RANK): every rank loads its copy onto that GPU (a map_location of cuda:0, or "
                "the GPU it was saved from), N copies on one GPU while the rank's own stays idle",
        hint="load with map_location=f'cuda:{local_rank}' (or 'cpu', then move the model)",
        details=(("call", "torch.load"),))


def ranks_share_gpu(label: str, call: str, device: Device, ranks: Sequence[int], later: int,
                    line: str) -> Finding:
    """PC401: the ranks ``ranks`` (``label``: ``ranks 0-1``) ran ``call`` (a collective, DDP's construction,
    FSDP's all-gather) on one GPU, ``device``, at ``line``; ``later`` more calls shared a GPU after it."""
    off = [k for k in ranks if device != f"cuda:{k}"]
    first, other = ranks[0], off[0] if off else ranks[1]
    more = f"; {later} later call{'s' if later > 1 else ''} share a GPU too" if later else ""
    own = ", ".join(f"rank {k}: cuda:{k}" for k in off)
    # FSDP places the model on the current GPU itself: set_device is the whole fix there
    ddp = "" if call.startswith("FSDP") else "; DistributedDataParallel(model, device_ids=[local_rank])"
    return make_finding(
        Code.PC401, where="DDP" if call.startswith("DistributedDataParallel") else call, source=line,
        device=device, expected=", ".join(f"cuda:{k}" for k in off), count=len(ranks),
        message=f"on {label}, {call} runs on {device} on each of them: NCCL refuses two ranks on one GPU; on "
                f"a GPU machine this raises 'Duplicate GPU detected : rank {other} and rank {first} both on "
                f"CUDA device {Device.of(device).ordinal}' here; each rank's own GPU is cuda:LOCAL_RANK "
                f"({own}){more}",
        hint="call torch.cuda.set_device(local_rank) first and put the model and tensors on "
             f"torch.device('cuda', local_rank){ddp}",
        details=(("call", call), ("ranks", label.split(" ", 1)[1])))


def collective_on_host(call: str, what: str, backend: str, own: str, line: str) -> Finding:
    """PC402: ``call`` at ``line`` got a CPU tensor (``what``) in a process group of ``backend`` (NCCL), on
    the rank whose GPU is ``own``."""
    return make_finding(
        Code.PC402, where=call, source=line, device="cpu", expected=own,
        message=f"{call} got a CPU tensor ({what}) in a process group initialised for NCCL ('{backend}'): "
                "NCCL moves data between GPUs only; on a GPU machine this raises 'No backend type associated "
                "with device type cpu' here",
        hint="put the tensor on the rank's GPU before the collective (device=torch.device('cuda', "
             "local_rank)), or init_process_group('cuda:nccl,cpu:gloo') for CPU tensors too",
        details=(("call", call),))
