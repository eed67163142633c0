"""The fast-forward's cost: ``placecheck run`` of each corpus program, fast-forwarded after its two steps,
against the run that stops at its two steps (the behaviour before issue 31), measured in the same run.

The corpus is ``../shared/corpus`` beside the project (pytorch/examples programs, correct on a GPU; its
README gives each program's command). It is copied to a temporary directory first (the programs write
files), where ``make_data.py`` and ``time_sequence_prediction/generate_sine_wave_small.py`` make their
data. Per program, each in its own subprocess, whole-process wall time:

- ``stop``: ``placecheck run`` with ``PLACECHECK_NO_FAST_FORWARD=1``: the run stops at the ``--steps 2``
  budget, as it did before the fast-forward;
- ``fast``: ``placecheck run``: after the budget the rest of the training loop is skipped and the rest of
  the script runs.

The target of issue 31: ``fast`` at most 2x ``stop`` for every program. The table also gives the lines of
the program's script that ran in each (the fast-forward's point: the code after training).

    python benchmarks/bench_fast_forward.py [--repeat 1] [--only mnist,vae] [--corpus ../shared/corpus]

Prints a table and writes ``benchmarks/results/fast_forward.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT.parent / "shared" / "corpus"
RESULTS = Path(__file__).parent / "results"
TARGET_RATIO = 2.0

PROGRAMS: dict[str, tuple[str, list[str], dict[str, str]]] = {
    # name: (folder, placecheck run arguments, environment): the corpus README's commands
    "dcgan": ("dcgan", ["main.py", "--", "--dataset", "fake", "--dry-run", "--batchSize", "8", "--ngf", "8",
                        "--ndf", "8", "--workers", "1", "--outf", "out", "--manualSeed", "1", "--accel"], {}),
    "imagenet": ("imagenet", ["main.py", "--", "--dummy", "-a", "resnet18", "-b", "4", "-j", "1",
                              "--epochs", "1", "-p", "1", "--seed", "1"], {}),
    "word_language_model (LSTM)": (
        "word_language_model", ["main.py", "--", "--data", "./data/wikitext-2-small", "--epochs", "1",
                                "--dry-run", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--bptt",
                                "8", "--batch_size", "4", "--accel", "--save", "model_lstm.pt"], {}),
    "word_language_model (Transformer)": (
        "word_language_model", ["main.py", "--", "--data", "./data/wikitext-2-small", "--model",
                                "Transformer", "--use-optimizer", "--lr", "0.001", "--epochs", "1",
                                "--dry-run", "--emsize", "16", "--nhid", "16", "--nlayers", "1", "--nhead",
                                "2", "--bptt", "8",
                                "--batch_size", "4", "--accel", "--save", "model_tf.pt"], {}),
    "time_sequence_prediction": ("time_sequence_prediction", ["train.py", "--", "--steps", "1"],
                                 {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}),
    "regression": ("regression", ["main.py"], {}),
    "ddp_multigpu_torchrun": ("ddp_multigpu_torchrun", ["--nproc-per-node", "2", "multigpu_torchrun.py", "--",
                                                        "1", "1", "--batch_size", "32"], {}),
    "vae": ("vae", ["main.py", "--", "--epochs", "1", "--batch-size", "128"], {}),
    "mnist": ("mnist", ["main.py", "--", "--epochs", "1", "--dry-run"], {}),
}


def prepare(source: Path, tmp: Path) -> Path:
    """The corpus at ``source`` copied to ``tmp``, with its data made."""
    corpus = tmp / "corpus"
    shutil.copytree(source, corpus)
    subprocess.run([sys.executable, "make_data.py"], cwd=corpus, check=True, capture_output=True)
    subprocess.run([sys.executable, "generate_sine_wave_small.py"], cwd=corpus / "time_sequence_prediction",
                   check=True, capture_output=True)
    return corpus


def measure(corpus: Path, name: str, fast: bool) -> dict[str, Any]:
    """One ``placecheck run`` of ``name``: wall time, exit code, optimizer steps, lines run."""
    folder, args, extra = PROGRAMS[name]
    env = {**os.environ, **extra, "PYTHONPATH": str(ROOT)}
    env.pop("PLACECHECK_NO_FAST_FORWARD", None)
    if not fast:
        env["PLACECHECK_NO_FAST_FORWARD"] = "1"
    command = [sys.executable, "-m", "placecheck", "run", "--format", "json", *args]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=corpus / folder, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"seconds": seconds, "exit": done.returncode, "error": done.stderr[-400:]}
    coverage = report.get("coverage") or {}
    return {"seconds": seconds, "exit": done.returncode, "steps": report["stats"].get("optimizer_steps"),
            "lines_run": coverage.get("lines_run"), "lines": coverage.get("lines"),
            "failing": [f"{f['code']} {f['source']}" for f in report["findings"] if f["severity"] != "info"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per program and kind (the best is kept)")
    parser.add_argument("--only", default="", help="comma-separated program names (default: all)")
    parser.add_argument("--corpus", type=Path, default=CORPUS, help=f"the corpus folder (default {CORPUS})")
    options = parser.parse_args(argv)
    names = [n for n in PROGRAMS if not options.only or n.split(" ")[0] in options.only.split(",")
             or n in options.only.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="placecheck-ff-") as tmp:
        corpus = prepare(options.corpus, Path(tmp))
        for name in names:
            best: dict[str, dict[str, Any]] = {}
            for _ in range(options.repeat):
                for kind, fast in (("stop", False), ("fast", True)):
                    result = measure(corpus, name, fast)
                    if kind not in best or result["seconds"] < best[kind]["seconds"]:
                        best[kind] = result
            ratio = best["fast"]["seconds"] / best["stop"]["seconds"]
            rows.append({"program": name, **{k: v for kind in best for k, v in
                                            ((f"{kind}_{key}", value) for key, value in best[kind].items())},
                         "ratio": ratio, "within_target": ratio <= TARGET_RATIO})
    print(f"{'program':<36} {'stop s':>7} {'fast s':>7} {'ratio':>6}  lines run (stop -> fast)  steps")
    for row in rows:
        lines = f"{row.get('stop_lines_run')}/{row.get('stop_lines')} -> {row.get('fast_lines_run')}/" \
                f"{row.get('fast_lines')}"
        print(f"{row['program']:<36} {row['stop_seconds']:>7.1f} {row['fast_seconds']:>7.1f} "
              f"{row['ratio']:>5.2f}x  {lines:<24} {row.get('stop_steps')} -> {row.get('fast_steps')}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "fast_forward.json"
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "python":
                               platform.python_version(), "target_ratio": TARGET_RATIO, "rows": rows},
                              indent=2) + "\n")
    print(f"written {out}")
    return 0 if all(r["within_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
