"""The result of an audit: :class:`Report`, its summary, and the exit code.

No torch import here: formats and the CLI's exit logic depend on it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from placecheck import problems
from placecheck.finding import Finding, Severity

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Report:
    """What one audit found.

    ``findings`` are sorted deterministically (worst first, then code and
    location); built with ``group=True`` (an audit's default) they are *problems*:
    findings sharing a root cause grouped into one (see
    :mod:`placecheck.problems`). ``notes`` are human remarks on how the audit
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

    @staticmethod
    def build(
        target: str, device: str, engine: str, findings: Iterable[Finding],
        notes: Iterable[str] = (), stats: dict[str, int] | None = None, incomplete: str = "",
        group: bool = False,
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
        )

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
        """The per-instance findings the problems cover (what ``--no-group`` lists), evidence included."""
        return sum(f.instance_count for f in self.findings)

    def summary(self) -> dict[str, Any]:
        """Machine-readable summary (used by the JSON format)."""
        return {
            "problems": len(self.findings),
            "instances": self.instances(),
            "modules": len(self.modules()),
            **{f"{k}s" if k != "info" else k: v for k, v in self.counts().items()},
            "bytes_off_device": self.bytes_off_device(),
            "incomplete": self.incomplete,
            "line": self.summary_line(),
        }

    def summary_line(self) -> str:
        """One line, e.g. ``3 problems (5 instances) in 2 modules: 2 errors; 1.2 MiB not on cuda:0``.

        The instance count is shown when grouping made it differ from the problem count.
        """
        n = len(self.findings)
        if n == 0:
            line = f"no placement problems found on {self.device} ({self.engine})"
        else:
            mods = len(self.modules())
            parts = [plural(v, k) for k, v in self.counts().items() if v]
            instances = self.instances()
            grouped = f" ({plural(instances, 'instance')})" if instances != n else ""
            line = f"{plural(n, 'problem')}{grouped} in {plural(mods, 'module')}: {', '.join(parts)}"
            off = self.bytes_off_device()
            if off:
                line += f"; {human_bytes(off)} not on {self.device}"
        if self.incomplete:
            line += "; the forward pass stopped before its end, the rest is unchecked (see the notes)"
        return line


def plural(n: int, word: str) -> str:
    if word == "info":
        return f"{n} info"
    return f"{n} {word}" + ("" if n == 1 else "s")


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, one decimal."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


FAIL_ON_CHOICES = ("error", "warning", "info", "never")


def exit_code(reports: Iterable[Report], fail_on: str = "warning", exit_zero: bool = False) -> int:
    """0 when no finding is at or above ``fail_on``, 1 when one is.

    ``exit_zero`` (or ``fail_on="never"``) forces 0 for findings. Usage and
    load errors (exit 2) never reach a report.
    """
    if exit_zero or fail_on == "never":
        return EXIT_OK
    threshold = Severity(fail_on).rank
    for report in reports:
        if any(f.severity.rank >= threshold for f in report.findings):
            return EXIT_FINDINGS
    return EXIT_OK
