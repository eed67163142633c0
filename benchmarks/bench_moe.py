"""Mixture-of-experts models at full size on the fake engine: audited to the end of the forward?

Routers in transformers' MoE blocks pick experts with ``nonzero`` /
``torch.where(mask)`` and index the expert list with the result, which fake
tensors alone cannot run; :mod:`placecheck.engines.datadep` runs them with stated
assumptions (every expert hit, the largest shapes). Each model is built from
its transformers config on the meta device (``init="meta"``: no memory for
weights) and audited on simulated CUDA with ``engine="fake"``, in its own
subprocess so that its peak RSS is its own:

- ``mixtral_8x22b``: Mixtral-8x22B's layout (56 layers, 6144 wide, 8 experts,
  top-2), about 1.4e11 parameters;
- ``deepseek_v3``: DeepSeek-V3's layout (61 layers, 7168 wide, MLA attention,
  256 routed experts + 1 shared, top-8, the first 3 layers dense), about 6.7e11.

Issue 14's targets: each audited to the end of the forward
(``summary.incomplete`` false) in at most 30 s and 2 GiB of peak RSS. The time
is the subprocess's whole wall time (interpreter start and imports included);
its CPU time is shown beside it (on a shared machine the wall time also counts
waiting for a core); peak RSS is its ``ru_maxrss`` (torch and transformers included).

    python benchmarks/bench_moe.py [--only deepseek_v3] [--tokens 16]

Prints a table and writes ``benchmarks/results/moe.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from machine import describe

RESULTS = Path(__file__).parent / "results"
# a safety net: on a shared machine the 671B audit's wall time can be many times its CPU time
TIMEOUT_S = 1800
LIMIT_S = 30.0
LIMIT_RSS_GIB = 2.0
MIXTRAL_VOCAB = 32768
DEEPSEEK_V3_VOCAB = 129280


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    return transformers


def mixtral_8x22b() -> Any:
    """Mixtral-8x22B's layout (its published config), built from the config: no weights."""
    tf = _transformers()
    config = tf.MixtralConfig(
        hidden_size=6144, intermediate_size=16384, num_hidden_layers=56, num_attention_heads=48,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=MIXTRAL_VOCAB,
        max_position_embeddings=65536, rope_theta=1e6, tie_word_embeddings=False,
    )
    return tf.MixtralForCausalLM(config).eval()


def deepseek_v3() -> Any:
    """DeepSeek-V3's layout (671B): transformers' ``DeepseekV3Config`` defaults are its published config."""
    tf = _transformers()
    config = tf.DeepseekV3Config(vocab_size=DEEPSEEK_V3_VOCAB)
    return tf.DeepseekV3ForCausalLM(config).eval()


MODELS: dict[str, tuple[Any, int, float]] = {
    # name -> (factory, vocabulary, published parameter count)
    "mixtral_8x22b": (mixtral_8x22b, MIXTRAL_VOCAB, 141e9),
    "deepseek_v3": (deepseek_v3, DEEPSEEK_V3_VOCAB, 671e9),
}


def child(name: str, tokens: int) -> None:
    """Audit one model (this process is the measured one) and print its result as JSON."""
    import placecheck

    factory, vocab, _ = MODELS[name]
    start = time.perf_counter()
    report = placecheck.audit(factory, "cuda", engine="fake", init="meta", target=name,
                              inputs=[f"input_ids=int64[1,{tokens}]:0..{vocab}"])
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "audit_s": seconds,
        "incomplete": report.incomplete,
        "engine": report.engine,
        "summary": report.summary_line(),
        "findings": sorted({f"{f.code} {f.where} {f.source}" for f in report.findings}),
        "notes": list(report.notes),
        "peak_rss_gib": usage.ru_maxrss / 2**20,  # KiB on Linux
        # on a shared machine the wall time also counts waiting for a core; the CPU time does not
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }
    print("RESULT " + json.dumps(result))


def run_child(name: str, tokens: int) -> dict[str, Any]:
    """One model in a fresh interpreter: its result plus the whole process's wall time."""
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--tokens", str(tokens)],
                              capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {TIMEOUT_S} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    result["process_s"] = time.perf_counter() - start
    return result


def verdict(result: dict[str, Any]) -> list[str]:
    """What misses issue 14's targets ([] when every target is met)."""
    if "error" in result:
        return [f"failed: {result['error']}"]
    missed = []
    if result["incomplete"]:
        missed.append(f"forward incomplete: {result['incomplete']}")
    if result["process_s"] > LIMIT_S:
        missed.append(f"{result['process_s']:.1f} s > {LIMIT_S:.0f} s")
    if result["peak_rss_gib"] > LIMIT_RSS_GIB:
        missed.append(f"{result['peak_rss_gib']:.2f} GiB > {LIMIT_RSS_GIB:.0f} GiB")
    return missed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--tokens", type=int, default=16, help="sequence length of the input (batch 1)")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.tokens)
        return 0
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    results = {name: run_child(name, args.tokens) for name in names}
    machine = describe()  # after the audits: its own processes do not load the machine during them
    print(f"{'model':<16}{'params':>9}{'process s':>11}{'audit s':>9}{'CPU s':>7}{'peak RSS':>10}"
          "  complete  targets")
    failed = False
    for name, result in results.items():
        missed = verdict(result)
        failed = failed or bool(missed)
        if "error" in result:
            print(f"{name:<16}{MODELS[name][2]:>9.1e}  {result['error']}")
            continue
        print(f"{name:<16}{MODELS[name][2]:>9.1e}{result['process_s']:>11.1f}{result['audit_s']:>9.1f}"
              f"{result['cpu_s']:>7.1f}"
              f"{result['peak_rss_gib']:>8.2f} G  {'yes' if not result['incomplete'] else 'NO':<8}  "
              f"{'met' if not missed else '; '.join(missed)}")
    print(f"\nthis machine's reference workload (benchmarks/machine.py): {machine['reference_s']:.2f} s")
    RESULTS.mkdir(exist_ok=True)
    payload = {
        "machine": machine,
        "targets": {"process_s": LIMIT_S, "peak_rss_gib": LIMIT_RSS_GIB, "incomplete": False},
        "tokens": args.tokens,
        "results": results,
    }
    out = RESULTS / "moe.json"
    if args.only:
        out = RESULTS / f"moe-{'-'.join(names)}.json"
    out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
