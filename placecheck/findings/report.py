"""The result of an audit: :class:`Report`, its summary, and the exit code.

No torch import here: formats and the CLI's exit logic depend on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from placecheck.basics.devices import human_bytes
from placecheck.basics.values import Device, device_order
from placecheck.findings import problems
from placecheck.findings.finding import Finding, Severity

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
"""An unexpected error inside placecheck (a bug, or something it did not foresee): never 1, so a CI
step does not read a crash as placement findings, nor 2, which says the user's input is wrong."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (KeyboardInterrupt): 128 + SIGINT, what a shell reports for a command it interrupted."""
EXIT_STDOUT_CLOSED = 141
"""The reader of stdout closed it (``placecheck rules | head``): 128 + SIGPIPE, as a shell reports it."""


ASSUMED_BRANCHES = "assumed_branches"
"""The stat counting lines where the forward branched on a value the fake engine assumed
(:mod:`placecheck.engines.datadep`): the summary then says the other paths are unchecked."""

ENGINE_WORDS = {"simulated cuda": "simulated (fake tensors, no data)",
                "simulated cuda (real values)": "simulated (real values on the CPU)"}
"""How a reader is told the engine beside the device (a report's ``engine`` is the machine's name of it,
``simulated cuda (real values)``, kept as is in JSON)."""

PLACED = {"keep": "as placed", "device-map": "as mapped"}
"""A report's ``device`` when no single target was audited: ``keep`` (the model's own placement) and
``device-map`` (placed by ``--device-map``): each tensor is judged against its module's device."""


@dataclass(frozen=True)
class StageRow:
    """One row of a device map: a top-level stage of the model (a child of the root) and where its
    registered state lives."""

    path: str
    """The stage's module path (``s1``, ``encoder``; ``layers.4`` when ``layers`` spans several devices);
    ``""`` for state the root module holds itself."""
    devices: tuple[str, ...]
    """Every device its parameters and buffers are on, sorted (``cpu`` and ``disk`` for offloaded state)."""
    nbytes: int
    """Bytes of its parameters and buffers, each tensor counted once."""
    by_device: tuple[tuple[str, int], ...] = ()
    """Those bytes per device, when the stage spans more than one."""
    note: str = ""
    """A remark for the row (``offloaded: weights copied on every forward``); empty when none."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "devices": list(self.devices), "bytes": self.nbytes,
                "by_device": dict(self.by_device), "note": self.note}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> StageRow:
        return StageRow(str(data["path"]), tuple(data["devices"]), int(data["bytes"]),
                        tuple((str(k), int(v)) for k, v in dict(data.get("by_device", {})).items()),
                        str(data.get("note", "")))


@dataclass(frozen=True)
class Transfer:
    """A copy of a tensor between two devices during one forward (cross-device traffic).

    Explicit copies between stages (``x.to("cuda:1")``) are how a model-parallel
    forward works: listed here, not findings. Identical copies (same devices, line
    and boundary) are one row with their ``count``.
    """

    src: str
    """The device copied from (``cuda:0``)."""
    dst: str
    """The device copied to (``cuda:1``)."""
    nbytes: int
    """Bytes of one copy."""
    source: str
    """``file:line`` of the user's code that made the copy ("" when unknown)."""
    from_stage: str
    """The stage (module path) whose forward produced the copied tensor; ``"(input)"`` for the forward's
    inputs, ``""`` for the root's own work."""
    to_stage: str
    """The stage whose forward computed on the copy first; ``""`` for none (the root, or returned)."""
    count: int = 1

    @property
    def boundary(self) -> str:
        """``s1 -> s2``: the module boundary the copy crosses (``(root)`` for the root or the input)."""
        return f"{self.from_stage or '(root)'} -> {self.to_stage or '(root)'}"

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "bytes": self.nbytes, "source": self.source,
                "from_stage": self.from_stage, "to_stage": self.to_stage, "boundary": self.boundary,
                "count": self.count}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Transfer:
        return Transfer(str(data["src"]), str(data["dst"]), int(data["bytes"]), str(data.get("source", "")),
                        str(data.get("from_stage", "")), str(data.get("to_stage", "")),
                        int(data.get("count", 1)))


@dataclass(frozen=True)
class DeviceMap:
    """Where a model placed across devices keeps its state, and what one forward copied between them.

    Filled by ``--device keep`` (the model's own placement, :mod:`placecheck.placement`), and meant for any
    audit that places a model on several devices (a device map computed by accelerate): ``budgets`` then
    holds each device's memory budget, and ``StageRow.note`` marks offloaded stages.
    """

    stages: tuple[StageRow, ...] = ()
    transfers: tuple[Transfer, ...] = ()
    budgets: tuple[tuple[str, int], ...] = ()
    """Device -> bytes it may hold (``--gpu-memory``); empty when no budget was given."""
    rows: str = "stage"
    """What each row of :attr:`stages` is, for the table's heading (``map entry`` for ``--device-map``)."""

    def bytes_per_device(self) -> dict[str, int]:
        """Bytes of parameters and buffers per device, over every stage, devices sorted."""
        total: dict[str, int] = {}
        for row in self.stages:
            for device, nbytes in (row.by_device or ((row.devices[0], row.nbytes),) if row.devices else ()):
                total[device] = total.get(device, 0) + nbytes
        return dict(sorted(total.items(), key=lambda kv: device_order(kv[0])))

    def to_dict(self) -> dict[str, Any]:
        """``{"stages": [...], "bytes_per_device": {...}, "budgets": {...}, "rows": "stage"}`` (the transfers
        go beside it); ``rows`` says what a row of ``stages`` is (``map entry`` for ``--device-map``)."""
        return {"stages": [r.to_dict() for r in self.stages], "bytes_per_device": self.bytes_per_device(),
                "budgets": dict(self.budgets), "rows": self.rows}

    @staticmethod
    def from_dict(data: dict[str, Any], transfers: list[dict[str, Any]] | None = None) -> DeviceMap:
        return DeviceMap(tuple(StageRow.from_dict(r) for r in data.get("stages", ())),
                         tuple(Transfer.from_dict(t) for t in transfers or ()),
                         tuple((str(k), int(v)) for k, v in dict(data.get("budgets", {})).items()),
                         str(data.get("rows", "stage")))

    def lines(self) -> list[str]:
        """The short text section a table shows after the findings: one line per stage, then per copy."""
        out = [f"device map (parameters and buffers per {self.rows}):"]
        width = max([len(r.path or "(root)") for r in self.stages] + [5])
        for row in self.stages:
            where = ", ".join(f"{d} {human_bytes(n)}" for d, n in row.by_device) if row.by_device \
                else ", ".join(row.devices) or "no state"
            out.append(f"  {row.path or '(root)':<{width}}  {where:<16} {human_bytes(row.nbytes):>10}"
                       + (f"  ({row.note})" if row.note else ""))
        budgets = dict(self.budgets)
        per_device = self.bytes_per_device()
        if len(per_device) > 1 or budgets:
            out.append("  total: " + ", ".join(
                f"{d} {human_bytes(n)}" + (f" of {human_bytes(budgets[d])}" if d in budgets else "")
                for d, n in per_device.items()))
        if self.transfers:
            out.append("cross-device copies in one forward:")
            for t in self.transfers:
                times = f" x{t.count}" if t.count > 1 else ""
                out.append(f"  {t.src} -> {t.dst}  {human_bytes(t.nbytes)}{times}  {t.boundary}"
                           + (f"  {t.source}" if t.source else ""))
        else:
            out.append("cross-device copies in one forward: none")
        return out


@dataclass(frozen=True)
class Coverage:
    """Which of a script's statements ``placecheck run`` ran: what its findings cover."""

    file: str
    """The script, as the report names it (``train.py``)."""
    lines: int
    """Its executable lines: the first line of each statement."""
    run: int
    """How many of them ran."""
    not_run: tuple[int, ...] = ()
    """The lines that never ran, ascending."""
    blocks: tuple[str, ...] = ()
    """The blocks that never ran, each with why when the script says it (``41-43 (`if epoch % 10 ==
    9:` never true)``)."""

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "lines": self.lines, "lines_run": self.run,
                "lines_not_run": list(self.not_run), "blocks_not_run": list(self.blocks)}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Coverage:
        return Coverage(str(data["file"]), int(data["lines"]), int(data["lines_run"]),
                        tuple(int(n) for n in data.get("lines_not_run", ())),
                        tuple(str(b) for b in data.get("blocks_not_run", ())))

    def line(self) -> str:
        """``checked 61 of 64 lines of train.py; never ran: lines 41-43 (...)``."""
        text = f"checked {self.run} of {self.lines} lines of {self.file}"
        if self.blocks:
            text += "; never ran: " + "; ".join(self.blocks)
        return text


@dataclass(frozen=True)
class FileWrite:
    """A file a script ``placecheck run`` ran changed (:mod:`placecheck.run.scratch`)."""

    path: str
    """The path the script wrote, absolute."""
    change: str
    """``created``, ``overwritten``, ``deleted`` (redirected to the scratch area: the real file is
    untouched); ``blocked`` (a write that got past the redirection, refused); ``escaped`` (changed on
    disk during the run by code nothing in Python saw: C code, another program)."""
    scratch: str = ""
    """Where its content went, when the scratch area is kept (``--keep-scratch``); "" otherwise."""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "change": self.change, "scratch": self.scratch}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> FileWrite:
        return FileWrite(str(data["path"]), str(data["change"]), str(data.get("scratch", "")))


@dataclass(frozen=True)
class Report:
    """What one audit found.

    ``findings`` are sorted deterministically (worst first, then code and
    location); built with ``group=True`` (an audit's default) they are *problems*:
    findings sharing a root cause grouped into one (see
    :mod:`placecheck.findings.problems`). ``notes`` are human remarks on how the audit
    ran (the engine chosen, an inferred input, a fallback taken).
    """

    target: str
    """What was audited: the CLI target, or the model's class name."""
    device: str
    """The normalised target device, e.g. ``cuda:0``."""
    engine: str
    """The engine that ran: ``cuda``, ``simulated cuda``, ``cpu``, ..."""
    findings: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()
    stats: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    """Counts from the audit (modules, parameters, buffers, bytes walked)."""
    incomplete: str = ""
    """Why the forward pass was not checked to its end (a limit of the simulation), "" when it was:
    "no placement problems" then covers only the part that ran, and the summary says so."""
    device_map: DeviceMap | None = None
    """Where a model placed across devices keeps its state and what its forward copied between them
    (``--device keep``); None for an audit that moved the model to one device."""
    unfinished: str = ""
    """Why a script ``placecheck run`` ran did not run through (its own non-zero ``sys.exit``, a limit of
    the simulation), "" when it did: the rest of the script is unchecked, and without a finding that
    fails the run the exit code is 2 (:func:`exit_code`)."""
    script_traceback: tuple[str, ...] = ()
    """When the script raised an exception of its own (:attr:`unfinished` says which, and where): the
    script's own frames of its traceback, as Python prints them; ``placecheck run`` writes them to
    stderr under its one-line error."""
    coverage: Coverage | None = None
    """Which lines of the script ``placecheck run`` ran (None for an audit, or when not measured)."""
    writes: tuple[FileWrite, ...] | None = None
    """What the script ``placecheck run`` ran wrote, each redirected to the scratch area, or refused, or
    found changed on disk after the run (None for an audit)."""

    @staticmethod
    def build(
        target: str, device: str, engine: str, findings: Iterable[Finding],
        notes: Iterable[str] = (), stats: dict[str, int] | None = None, incomplete: str = "",
        group: bool = False, device_map: DeviceMap | None = None, unfinished: str = "",
        script_traceback: tuple[str, ...] = (),
        coverage: Coverage | None = None,
    ) -> Report:
        """Make a report with findings in their canonical order.

        ``group``: one finding per problem (root cause), with its instances and
        evidence (what ``audit()`` gives by default, ``AuditOptions.group``);
        ``False`` keeps one finding per instance (``--no-group``).
        """
        ordered = problems.group(findings) if group else sorted(findings, key=lambda f: f.sort_key)
        return Report(
            target=target, device=device, engine=engine,
            findings=tuple(ordered),
            notes=tuple(notes), stats=tuple((stats or {}).items()), incomplete=incomplete,
            device_map=device_map, unfinished=unfinished, script_traceback=script_traceback,
            coverage=coverage,
        )

    @property
    def device_label(self) -> str:
        """Where the model was audited, for a reader: the device, or for ``--device keep`` the devices
        of its own placement (``cuda:0, cuda:1, as placed``), for ``--device-map`` those of the map
        (``cuda:0, cuda:1, cpu, as mapped``)."""
        if self.device not in PLACED:
            return self.device
        devices = list(self.device_map.bytes_per_device()) if self.device_map is not None else []
        return f"{', '.join(devices)}, {PLACED[self.device]}" if devices else "its own placement"

    @property
    def run_on(self) -> str:
        """Where and how the model ran, for a reader: ``cuda:0, simulated (real values on the CPU)``,
        ``cuda:0, simulated (fake tensors, no data)``; the device alone on a real one."""
        words = ENGINE_WORDS.get(self.engine)
        if words is not None:
            return f"{self.device_label}, {words}"
        real = bool(self.device) and self.engine == Device.of(self.device).type
        if not self.engine or real:  # a real device: no more to say
            return self.device_label
        return f"{self.device_label} ({self.engine})"

    def grouped(self) -> Report:
        """This report with its findings grouped into problems (the same report when they already are)."""
        return replace(self, findings=tuple(problems.group(self.findings)))

    @property
    def ok(self) -> bool:
        """True when the audit found nothing at warning level or above."""
        return not any(f.severity.rank >= Severity.WARNING.rank for f in self.findings)

    def counts(self) -> dict[str, int]:
        """Findings per severity, every severity present (zero included)."""
        c = Counter(f.severity.value for f in self.findings)
        return {s.value: c.get(s.value, 0) for s in Severity}

    def modules(self) -> list[str]:
        """The distinct module paths the findings point at (every instance's), in order."""
        seen: dict[str, None] = {}
        for f in self.findings:
            for module in problems.instance_modules(f):
                seen.setdefault(module, None)
        return list(seen)

    def bytes_off_device(self) -> int:
        """Bytes of tensor data found off the target device."""
        return sum(f.nbytes for f in self.findings if f.device and f.device != f.expected)

    def instances(self) -> int:
        """The per-instance findings the problems cover (what ``--no-group`` lists), evidence included,
        once each: an op that two problems' tensors crashed is evidence of both, one finding all the same."""
        evidence = {(e.code, e.source, e.where, e.origin, e.message)
                    for f in self.findings for e in f.evidence}
        return sum(max(1, len(f.instances)) for f in self.findings) + len(evidence)

    def problem_count(self) -> str:
        """``3 problems (8 instances)``: the problems of this report grouped as the CLI groups them
        (:mod:`placecheck.findings.problems`), whether or not its findings are (an ``audit()`` report, a
        ``--no-group`` one), and the instances when they differ; ``0 problems`` for none. Every count a
        reader sees (the summary line, a config run's progress, the pytest plugin's message) is this one."""
        grouped = self.grouped()
        n, instances = len(grouped.findings), grouped.instances()
        return plural(n, "problem") + (f" ({plural(instances, 'instance')})" if n and instances != n else "")

    def summary(self) -> dict[str, Any]:
        """Machine-readable summary (used by the JSON format): counts of the grouped problems, as the
        summary line's (:meth:`problem_count`)."""
        grouped = self.grouped()
        return {
            "problems": len(grouped.findings),
            "instances": grouped.instances(),
            "modules": len(self.modules()),
            **{f"{k}s" if k != "info" else k: v for k, v in grouped.counts().items()},
            "bytes_off_device": self.bytes_off_device(),
            "incomplete": self.incomplete,
            "unfinished": self.unfinished,
            "line": self.summary_line(),
        }

    def summary_line(self) -> str:
        """One line, e.g. ``3 problems (5 instances) in 2 modules: 2 errors; 1.2 MiB not on cuda:0``.

        Problems and severities are counted grouped, whether or not the findings are (an ``audit()``
        report, ``--no-group``): one count everywhere; the instance count is shown when it differs.
        """
        n = len(self.findings)
        if n == 0 and self.unfinished.endswith(NOTHING_CHECKED):
            # "no placement problems found" would read as a pass
            return f"nothing checked on {self.run_on}: {self.unfinished}"
        if n == 0:
            line = f"no placement problems found on {self.run_on}"
        else:
            mods = len(self.modules())
            parts = [plural(v, k) for k, v in self.grouped().counts().items() if v]
            line = f"{self.problem_count()} in {plural(mods, 'module')}: {', '.join(parts)}"
            off = self.bytes_off_device()
            if off:
                line += f"; {human_bytes(off)} not on " + (
                    "the device of their module" if self.device in PLACED else self.device)
        if self.incomplete:
            line += "; the forward pass stopped before its end, the rest is unchecked (see the notes)"
        if self.unfinished:
            line += (f"; the script did not run through ({self.unfinished}): the rest is unchecked "
                     "(see the notes)")
        branches = dict(self.stats).get(ASSUMED_BRANCHES, 0)
        if branches:
            line += (f"; the code branched on {plural(branches, 'value')} the simulation assumed, "
                     "the paths other values take are unchecked (see the notes)")
        return line


def plural(n: int, word: str) -> str:
    if word == "info":
        return f"{n} info"
    return f"{n} {word}" + ("" if n == 1 else "s")


NOTHING_CHECKED = ": nothing was checked"
"""How :attr:`Report.unfinished` ends when ``placecheck run`` ran but checked nothing (no forward pass
before a ``sys.exit(0)``, no op on a simulated GPU): the summary then says so instead of "no placement
problems found"."""


def exit_code(reports: Iterable[Report], fail_on: str = "warning", exit_zero: bool = False) -> int:
    """0 when no finding is at or above ``fail_on``, 1 when one is; 2 when none is but a script
    ``placecheck run`` ran did not run through (:attr:`Report.unfinished`): nothing was found in
    the part that ran, and the rest is unchecked.

    ``exit_zero`` (or ``fail_on="never"``) forces 0 for findings, not for a script that did not run
    through. Usage and load errors (exit 2) never reach a report.
    """
    reports = list(reports)
    unfinished = EXIT_USAGE if any(r.unfinished for r in reports) else EXIT_OK
    if exit_zero or fail_on == "never":
        return unfinished
    threshold = Severity(fail_on).rank
    for report in reports:
        if any(f.severity.rank >= threshold for f in report.findings):
            return EXIT_FINDINGS
    return unfinished
