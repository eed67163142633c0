"""What the protection of the user's files costs, kept small by construction (issue 40: at most 10% on
``benchmarks/bench_run_size.py``, which measures the time; these tests count the work, never time it).

``placecheck run`` keeps an audit hook (:func:`sys.addaudithook`) as the net under its scratch area, and an
audit hook cannot be removed: every audit event of the process calls it. Reading a frame's ``f_code`` is
one (Python 3.11 and later), and the line tracer of Python 3.11 is called for every Python function call
of the run: it read ``f_code`` of each (2 million audit calls in a resnet50 run, 20% of its time). It
reads only a frame's module ``__file__`` first now, and ``f_code`` for the script's own frames. And
until the script first writes or removes a file, a read does not look into the scratch area at all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent('''
    import json, sys
    from placecheck.run.lines import ScriptLines

    reads = [0]
    def hook(event, args):
        if event == "object.__getattr__" and args[1] == "f_code":
            reads[0] += 1
    sys.addaudithook(hook)

    script = sys.argv[1]
    lines = ScriptLines(script)
    with lines.watching():
        for _ in range(1000):  # 1000 calls of another module's Python function
            json.dumps({"a": [1, 2]})
        namespace = {"__file__": script, "__name__": "__main__"}
        exec(compile(open(script).read(), script, "exec"), namespace)
        namespace["step"]()
    print(reads[0], sorted(lines.executed))
''')

SCRIPT = "def step():\n    x = 1\n    return x\n"


def test_the_line_tracer_reads_code_objects_of_the_scripts_frames_only(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, "-c", PROBE, str(script)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    reads, executed = done.stdout.split(" ", 1)
    # the script's lines were recorded (the tracer still works), and the thousands of calls of json's
    # functions cost no f_code read (Python 3.12+ watches lines through sys.monitoring: none at all)
    assert executed.strip() == "[1, 2, 3]", done.stderr
    assert int(reads) < 20, f"{reads} f_code reads for 1000 calls of another module's functions"


def test_reads_skip_the_scratch_area_until_any_process_of_the_run_writes(tmp_path: Path) -> None:
    # until the first write or removal, a read is of the real path with no look into the scratch area;
    # a write in another process of the run (a spawned DataLoader worker, a torchrun rank) is seen at once
    from placecheck.run.overlay import Overlay

    root, work = tmp_path / "scratch", tmp_path / "work"
    work.mkdir()
    target = str(work / "ckpt.pt")
    overlay = Overlay(str(root), [str(work)])
    assert not overlay.touched() and overlay.resolve(target) == target and not overlay.exists(target)
    child = (f"from placecheck.run.overlay import Overlay\n"
             f"overlay = Overlay({str(root)!r}, [{str(work)!r}])\n"
             f"with open(overlay.for_write({target!r}), 'w') as f:\n"
             f"    f.write('saved')\n")
    subprocess.run([sys.executable, "-c", child], cwd=ROOT, timeout=120, check=True)
    assert overlay.touched()
    assert overlay.resolve(target) == overlay.upper(target) and overlay.exists(target)
    assert not (work / "ckpt.pt").exists()
    overlay.reset()  # auto's second attempt starts over: the user's files as they are
    assert not overlay.touched() and overlay.resolve(target) == target
    overlay.close()
