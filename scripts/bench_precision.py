"""float32 vs mixed_bfloat16 vs XLA on this CPU, through `trainer`, side by side.

Each variant trains the same model on the same synthetic data on one replica; the variants
alternate (A B C A B C ...) because this machine's speed drifts (the same command has
measured 507 to 1042 images/s minutes apart on these 2-core machines); each
reports steady examples per second (epochs 2..E) and time to first step, and the ratios
to float32 are medians over rounds. These numbers justify `precision=auto` and
`jit_compile=auto` on CPUs (trainer/plan/speed.py).

    python scripts/bench_precision.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

VARIANTS = {
    "float32": ["precision=float32", "jit_compile=false"],
    "mixed_bfloat16": ["precision=mixed_bfloat16", "jit_compile=false"],
    "float32+xla": ["precision=float32", "jit_compile=true"],
}


def run(args, overrides: list[str]) -> tuple[float, float]:
    from hydra import compose, initialize_config_dir

    from trainer.config.schema import config_dir
    from trainer.run.train import train

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose("config", overrides=[
            f"model={args.model}", "dataset=synthetic", f"dataset.train_examples={args.examples}",
            "dataset.validation_examples=256", f"dataset.image_size={args.image_size}",
            "accelerator=cpu", "devices=1",
            f"epochs={args.epochs}", "verbose=0", "logger=[]",
            f"batch.per_replica={args.batch}", *overrides])
    with tempfile.TemporaryDirectory() as run_dir:
        summary = train(cfg, run_dir=run_dir)
    return summary["examples_per_sec"], summary["time"]["first_step_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--model", default="mobilenet")
    parser.add_argument("--image-size", type=int, default=32)
    args = parser.parse_args()
    from trainer.config.schema import register_configs

    register_configs()
    ratios = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        rates = {name: run(args, overrides) for name, overrides in VARIANTS.items()}
        base = rates["float32"][0]
        for name, (rate, _) in rates.items():
            ratios[name].append(rate / base)
        print(f"round {r + 1}: " + "  ".join(
            f"{name} {rate:7.1f} ex/s (first step {first:.1f} s)"
            for name, (rate, first) in rates.items()), flush=True)
    for name, values in ratios.items():
        print(f"median throughput ratio {name} / float32: {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
