"""What trainer promises on GPUs, measured on this machine: one Markdown table, PASS or FAIL.

Rows (`--rows` picks some; each runs in a subprocess of its own, because TensorFlow sets up
its devices once per process, under a hard timeout; a row that crashes or times out is a FAIL
row with a one-line reason):

    devices_0              devices=[0]: only GPU 0 used, memory growth on, the GPU not taken
    devices_auto           devices=auto: every GPU used, memory growth on each
    memory_limit           gpu.memory_limit_mb caps the GPU (a bigger tensor is refused)
    replicas_equal         two logical GPUs of one physical GPU: the cross-device ops trainer
                           chooses, and 1 vs 2 replicas at one global batch ending with the
                           same weights (1e-5, float32), loop=fit and loop=custom
    speed_precision        precision=auto: what it chose, its throughput against float32's
                           and mixed_float16's (whichever it did not choose), >= 0.98x
    speed_jit              jit_compile=auto: likewise against no XLA and XLA
    speed_steps            steps_per_execution=auto: likewise against 1 step and 8
    vs_keras_32_1gpu       trainer / plain Keras MirroredStrategy + fit, MobileNetV2,
    vs_keras_224_1gpu      32x32 and 224x224 inputs, 64 per replica, on 1 GPU and on two
    vs_keras_32_2logical   logical GPUs; alternating pairs, median ratio >= 0.98
    vs_keras_224_2logical
    default_run            `python -m trainer` as the README's first command: wall time
    cifar10_shaped         32x32x3, 10 classes, model=mobilenet, every speed option auto:
                           training throughput beside the input pipeline's own
    pytest_gpu             `python -m pytest -m gpu`: the gpu-marked tests

It needs no network: the data is synthetic or scikit-learn's bundled digits. Without a GPU it
prints one line and exits 0. Exit code: 0 when every row passes, 1 otherwise. The throughput
rows take minutes each; `--rows` runs some of them, `--rounds 1` shortens the comparisons.

    python scripts/gpu_check.py --out gpu_check.md
    python scripts/gpu_check.py --rows replicas_equal,vs_keras_32_2logical --rounds 1

For its tests, `--cpu-dry-run` runs the rows' workers on logical CPU devices with tiny sizes
and the small default network (`model=cnn`) in MobileNetV2's place: the dry run proves the
rows' machinery (alternating pairs, ratios, the table), and MobileNetV2's graph alone costs a
dry run's row about 30 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Before any TensorFlow import, here and in every subprocess: its start-up lines are noise.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parent.parent
NO_GPU = "gpu_check: no GPU visible to TensorFlow; nothing to check"
RESULT = "gpu_check-result: "
ERROR = "gpu_check-error: "
RATIO = 0.98  # trainer / plain Keras, and auto / the other choice
RTOL = ATOL = 1e-5  # 1 vs 2 replicas, float32
LIMIT_MB = 1024  # the gpu.memory_limit_mb row's cap
NOISE = ("I0000", "W0000", "E0000", "WARNING: All log messages before absl")


@dataclass(frozen=True)
class Context:
    """What a row's worker runs on, and how long it measures.

    Attributes:
        kind: `gpu`, or `cpu` in a dry run (logical CPU devices, tiny sizes).
        rounds: alternating rounds (pairs) of each throughput comparison.
        logical_mb: memory of each logical GPU carved from GPU 0; 0: decided here.
        overrides: extra trainer overrides for every trainer run of the row.
    """

    kind: str
    rounds: int
    logical_mb: int
    overrides: tuple[str, ...]

    @property
    def dry(self) -> bool:
        """Whether this is a CPU dry run."""
        return self.kind == "cpu"

    def size(self, gpu: Any, dry: Any) -> Any:
        """The GPU size, or the dry run's."""
        return dry if self.dry else gpu

    @property
    def model(self) -> str:
        """The throughput rows' network: MobileNetV2, or the dry run's small default one."""
        return self.size("mobilenet", "cnn")


@dataclass(frozen=True)
class Row:
    """One check: its table cells, its worker, its timeout, whether a dry run can run it."""

    name: str
    check: str
    setting: str
    target: str
    work: Callable[[Context], dict[str, Any]]
    timeout: float = 600
    dry: bool = False


# ---------------------------------------------------------------- the parent: rows, table


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen rows, prints the table and writes it to `--out`.

    Returns:
        0 when every row passes (or there is no GPU), 1 otherwise.
    """
    args = parse_args(argv)
    if args.worker:
        return work(args)
    if not args.cpu_dry_run:
        gpus, error = count_gpus()
        if error:
            print(f"gpu_check: TensorFlow did not start: {error}")
            return 1
        if not gpus:
            print(NO_GPU)
            return 0
    results = [run_row(ROWS[name], args) for name in args.rows]
    table = render(results)
    print(table)
    Path(args.out).write_text(table + "\n")
    return 0 if all(r["ok"] for r in results) else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; `--cpu-dry-run`, `--worker` and `--override` are for development."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.md", help="where the table is written")
    parser.add_argument("--rows", default=None,
                        help=f"comma-separated rows to run (default: all): {', '.join(ROWS)}")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds each row may run (default: the row's own)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds of each throughput comparison")
    parser.add_argument("--logical-mb", type=int, default=0,
                        help="MiB of each of the two logical GPUs (default: 40%% of GPU 0, at "
                             "most 16384)")
    # A row's worker on logical CPU devices with tiny sizes: proves the machinery on CPU.
    parser.add_argument("--cpu-dry-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--override", action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; received: {args.rounds}")
    usable = [n for n, r in ROWS.items() if r.dry or not args.cpu_dry_run]
    args.rows = args.rows.split(",") if args.rows else usable
    unknown = [n for n in args.rows if n not in ROWS]
    if unknown:
        parser.error(f"unknown row(s); valid: {', '.join(ROWS)}; received: {','.join(unknown)}")
    return args


def count_gpus() -> tuple[int, str | None]:
    """Physical GPUs TensorFlow sees, asked in a subprocess (this one never starts it).

    Returns:
        (count, None), or (0, a one-line reason) when TensorFlow could not say.
    """
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=worker_env(), timeout=300)
    except subprocess.TimeoutExpired:
        return 0, "listing the GPUs took over 300 s"
    lines = out.stdout.split()
    if out.returncode != 0 or not lines or not lines[-1].isdigit():
        return 0, reason_from(out.returncode, out.stderr)
    return int(lines[-1]), None


def worker_env() -> dict[str, str]:
    """The environment of every subprocess: quiet TensorFlow, this checkout importable."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": path}


def run_row(row: Row, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one row's worker in a subprocess of its own and turns what it says into cells."""
    command = [sys.executable, str(SCRIPT), "--worker", row.name, "--rounds", str(args.rounds),
               "--logical-mb", str(args.logical_mb)]
    command += ["--cpu-dry-run"] * args.cpu_dry_run
    command += [f"--override={o}" for o in args.override]
    timeout = args.timeout if args.timeout is not None else row.timeout
    cells = {"check": row.check, "setting": row.setting, "target": row.target, "ok": False}
    started = time.perf_counter()
    # A session of its own: a timeout kills the worker's children (trainer, pytest) too.
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=worker_env(), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        cells["measured"] = f"timed out after {timeout:g} s"
    else:
        cells.update(read_result(proc.returncode, out, err))
    if args.cpu_dry_run:
        cells["setting"] = "CPU dry run: " + cells["setting"]
    seconds = time.perf_counter() - started
    print(f"gpu_check: {row.name}: {'PASS' if cells['ok'] else 'FAIL'} in {seconds:.0f} s",
          file=sys.stderr, flush=True)
    return cells


def read_result(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """What a worker reported: its result line, or a one-line reason why there is none."""
    lines = stdout.splitlines()
    results = [line[len(RESULT):] for line in lines if line.startswith(RESULT)]
    errors = [line[len(ERROR):] for line in lines if line.startswith(ERROR)]
    if returncode == 0 and results:
        found = json.loads(results[-1])
        return {key: found[key] for key in ("measured", "ok", "setting", "target")
                if key in found}
    if errors:
        return {"measured": f"crashed: {errors[-1]}", "ok": False}
    return {"measured": f"crashed: {reason_from(returncode, stderr)}", "ok": False}


def reason_from(returncode: int, stderr: str) -> str:
    """One line for a process that died: its exit status and its last meaningful line."""
    status = (f"killed by {signal.Signals(-returncode).name}" if returncode < 0
              else f"exit code {returncode}")
    lines = [line.strip() for line in stderr.splitlines()
             if line.strip() and not line.startswith(NOISE)]
    return f"{status}: {lines[-1]}" if lines else status


def render(results: list[dict[str, Any]]) -> str:
    """The Markdown table: check | setting | measured | target | result."""
    rows = ["| check | setting | measured | target | result |", "|---|---|---|---|---|"]
    for r in results:
        cells = [r["check"], r["setting"], r["measured"], r["target"],
                 "PASS" if r["ok"] else "FAIL"]
        rows.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(rows)


def cell(text: Any, limit: int = 400) -> str:
    """One table cell: one line, pipes escaped, at most `limit` characters."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------- the worker: one row


def work(args: argparse.Namespace) -> int:
    """Runs one row in this process; prints its result (or one error line) for the parent."""
    row = ROWS.get(args.worker)
    try:
        if row is None:
            raise ValueError(f"unknown row; valid: {', '.join(ROWS)}; received: {args.worker}")
        if args.cpu_dry_run and not row.dry:
            raise RuntimeError(f"row {row.name} needs a GPU: a dry run runs only "
                               f"{', '.join(n for n, r in ROWS.items() if r.dry)}; "
                               f"received: {row.name}")
        from trainer.config.schema import register_configs

        register_configs()
        ctx = Context("cpu" if args.cpu_dry_run else "gpu", args.rounds, args.logical_mb,
                      tuple(args.override))
        result = row.work(ctx)
    except Exception as error:  # the parent shows one line, never a traceback
        message = " ".join(str(error).split())
        print(f"{ERROR}{type(error).__name__}: {message}", flush=True)
        return 1
    print(RESULT + json.dumps(result), flush=True)
    return 0


def compose(overrides: list[str]) -> Any:
    """The config `python -m trainer OVERRIDES` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from trainer.config.schema import config_dir

    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def train_once(overrides: list[str], callbacks: tuple = ()) -> dict[str, Any]:
    """One trainer run in a fresh run directory; returns its summary."""
    from trainer.run.train import train

    cfg = compose(overrides)
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as run_dir:
        return train(cfg, run_dir=run_dir, callbacks=list(callbacks))


def gpu_memory() -> list[tuple[int, int]] | None:
    """(used, total) MiB of every GPU as nvidia-smi reports it; None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [tuple(int(float(v)) for v in line.split(",")) for line in out.stdout.splitlines()
            if line.strip()]


def carve(ctx: Context, count: int) -> tuple[str, ...]:
    """Splits physical device 0 into `count` logical devices and starts the runtime.

    Returns:
        The logical devices' names, e.g. `("/gpu:0", "/gpu:1")`.
    """
    import tensorflow as tf

    kind = ctx.kind.upper()
    device = tf.config.list_physical_devices(kind)[0]
    if ctx.dry:
        config = tf.config.LogicalDeviceConfiguration()
    else:
        tf.config.set_visible_devices([device], "GPU")
        config = tf.config.LogicalDeviceConfiguration(memory_limit=logical_mb(ctx))
    tf.config.set_logical_device_configuration(device, [config] * count)
    # Started now, trainer's configure_devices finds these devices in place and accepts them.
    if len(tf.config.list_logical_devices(kind)) != count:
        raise RuntimeError(f"carving {count} logical {kind} devices failed; received: "
                           f"{tf.config.list_logical_devices(kind)}")
    return tuple(f"/{ctx.kind}:{i}" for i in range(count))


def logical_mb(ctx: Context) -> int:
    """MiB per logical GPU: as asked, else 40% of the smallest GPU, at most 16384."""
    if ctx.logical_mb:
        return ctx.logical_mb
    memory = gpu_memory()
    return min(16384, int(0.4 * min(t for _, t in memory))) if memory else 4096


def use_devices(kind: str, names: tuple[str, ...]) -> None:
    """Makes trainer's runs in this process use `names`, logical devices carved here.

    trainer's device plans map each GPU replica to a physical GPU and have no setting for
    logical GPUs of one physical GPU; its plan is replaced, the rest of its run is its own.
    """
    import trainer.distribute.devices as devices_module
    from trainer.distribute.device_plan import DevicePlan

    plan = DevicePlan(kind, (0,) if kind == "gpu" else (), 0, names)
    devices_module.plan_devices = lambda *args, **kwargs: plan
    if kind == "gpu" and len(names) > 1:
        refuse_nccl(len(names))


def refuse_nccl(replicas: int) -> None:
    """Stops a run whose cross-device ops would be NCCL on logical GPUs of one GPU.

    NCCL cannot all-reduce between them (it aborts or hangs); the row then fails at once,
    saying what trainer chose, instead of at its timeout.
    """
    import trainer.run.assemble as assemble_module

    decide = assemble_module.choose_cross_device_ops
    if getattr(decide, "refuses_nccl", False):
        return

    def checked(*args, **kwargs):
        chosen = decide(*args, **kwargs)
        if chosen == "nccl":
            raise RuntimeError(f"trainer chose nccl for {replicas} logical GPUs of one "
                               "physical GPU, which NCCL cannot all-reduce between; received: "
                               f"physical_gpus={kwargs.get('physical_gpus', 'not passed')}")
        return chosen

    checked.refuses_nccl = True
    assemble_module.choose_cross_device_ops = checked


def one_device(ctx: Context) -> tuple[str, ...]:
    """GPU 0 alone with memory growth, as trainer's `devices=[0]` sets it up (or /cpu:0)."""
    import tensorflow as tf

    if not ctx.dry:
        gpu = tf.config.list_physical_devices("GPU")[0]
        tf.config.set_visible_devices([gpu], "GPU")
        tf.config.experimental.set_memory_growth(gpu, True)
    return (f"/{ctx.kind}:0",)


def rate(value: float) -> str:
    """Examples per second, short."""
    return f"{value / 1000:.1f}k ex/s" if value >= 1000 else f"{value:.0f} ex/s"


# ---------------------------------------------------------------- devices and memory

QUICK = ["accelerator=gpu", "epochs=1", "verbose=0", "logger=[]"]


def devices_work(spec: str) -> Callable[[Context], dict[str, Any]]:
    """The worker of `devices=SPEC`: which GPUs the run saw, and how much memory it took."""

    def run(ctx: Context) -> dict[str, Any]:
        import tensorflow as tf

        physical = tf.config.list_physical_devices("GPU")
        wanted = physical[:1] if spec == "[0]" else physical
        before = gpu_memory()
        summary = train_once([*QUICK, f"devices={spec}", *ctx.overrides])
        visible = tf.config.get_visible_devices("GPU")
        logical = tf.config.list_logical_devices("GPU")
        growth = all(tf.config.experimental.get_memory_growth(g) for g in visible)
        taken = memory_taken(before, gpu_memory())
        ok = (visible == wanted and len(logical) == len(wanted) == summary["replicas"]
              and growth and taken is not None and taken[0] < 0.5)
        seen = ", ".join(g.name.split(":", 1)[-1] for g in visible)
        took = ("nvidia-smi not found: memory not measured" if taken is None
                else f"took {taken[1]} MiB, {taken[0]:.1%} of a GPU at most (nvidia-smi)")
        return {"ok": ok, "measured": f"sees {seen} of {len(physical)} GPU(s); "
                f"{summary['replicas']} replica(s); memory growth "
                f"{'on' if growth else 'off'}; {took}"}

    return run


def memory_taken(before: list | None, after: list | None) -> tuple[float, int] | None:
    """The largest share of one GPU's memory taken between two readings, and the MiB taken."""
    if not before or not after:
        return None
    grown = [(a - b, total) for (b, _), (a, total) in zip(before, after, strict=True)]
    return max(d / t for d, t in grown), sum(max(d, 0) for d, _ in grown)


def memory_limit_work(ctx: Context) -> dict[str, Any]:
    """The worker of `gpu.memory_limit_mb`: the cap set, and a tensor above it refused."""
    import tensorflow as tf

    gpu = tf.config.list_physical_devices("GPU")[0]
    summary = train_once([*QUICK, "devices=[0]", f"gpu.memory_limit_mb={LIMIT_MB}",
                          *ctx.overrides])
    config = tf.config.get_logical_device_configuration(gpu) or []
    capped = [c.memory_limit for c in config] == [LIMIT_MB]
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    small, big = fits(LIMIT_MB // 4), fits(LIMIT_MB * 3 // 2)
    ok = capped and small and not big and peak <= LIMIT_MB and summary["replicas"] == 1
    return {"ok": ok, "measured": f"logical GPU limits {[c.memory_limit for c in config]} MiB; "
            f"training peak {peak:.0f} MiB; a {LIMIT_MB // 4} MiB tensor "
            f"{'fits' if small else 'refused'}; a {LIMIT_MB * 3 // 2} MiB tensor "
            f"{'fits' if big else 'refused'}"}


def fits(mb: int) -> bool:
    """Whether a float32 tensor of `mb` MiB can be made on GPU 0."""
    import tensorflow as tf

    try:
        with tf.device("/gpu:0"):
            tensor = tf.zeros((mb * 2**18,), tf.float32)
            float(tf.reduce_sum(tensor[:1]))
        del tensor
        return True
    except tf.errors.ResourceExhaustedError:
        return False


# ---------------------------------------------------------------- 1 vs 2 replicas


def replicas_equal_work(ctx: Context) -> dict[str, Any]:
    """The worker of 1 vs 2 logical devices of one physical device: same final weights."""
    import tensorflow as tf

    from trainer.distribute.runtime import nccl_available
    from trainer.distribute.strategy import choose_cross_device_ops

    names = carve(ctx, 2)
    # TF32 (on by default from Ampere on) rounds float32 matmuls and convolutions to a 10-bit
    # mantissa, far coarser than the 1e-5 compared here.
    tf.config.experimental.enable_tensor_float_32_execution(False)
    expected = choose_cross_device_ops("auto", ctx.kind, 2, nccl_available(), physical_gpus=1)
    chosen, parts, ok = set(), [], True
    for loop in ("fit", "custom"):
        weights = {}
        for replicas in (1, 2):
            use_devices(ctx.kind, names[:replicas])
            catch = weight_catcher()
            summary = train_once(equal_overrides(ctx, loop, replicas), (catch,))
            weights[replicas] = catch
            ok = ok and summary["replicas"] == replicas and summary["loop"] == loop
            if replicas == 2:
                ok = ok and summary["strategy"] == "mirrored"
                chosen.add(summary["cross_device_ops"])
        gap, within = weight_gap(weights[1].final, weights[2].final)
        moved, _ = weight_gap(weights[1].initial, weights[1].final)
        ok = ok and within and moved > 1e-3
        parts.append(f"{loop}: max |w1 - w2| {gap:.1e} (training moved w by {moved:.1e})")
    ok = ok and chosen == {expected}
    setting = (f"2 logical {ctx.kind.upper()}s of one physical "
               + ("CPU" if ctx.dry else f"GPU, {logical_mb(ctx)} MiB each")
               + f", vs 1; cnn without dropout, synthetic "
               f"{ctx.size(32, 8)}x{ctx.size(32, 8)}x{ctx.size(3, 1)}, global batch "
               f"{ctx.size(64, 32)}, SGD, 2 epochs, float32 (TF32 off), fit and custom")
    return {"ok": ok, "setting": setting,
            "target": f"cross-device ops {expected} (as decided for 1 physical device); "
                      f"weights within rtol {RTOL:g}, atol {ATOL:g}",
            "measured": f"cross-device ops {', '.join(sorted(chosen))}; " + "; ".join(parts)}


def equal_overrides(ctx: Context, loop: str, replicas: int) -> list[str]:
    """A run whose maths does not depend on the replica count: no dropout, no batch norm."""
    return ["model=cnn", "model.dropout=0.0", "dataset=synthetic",
            f"dataset.image_size={ctx.size(32, 8)}", f"dataset.channels={ctx.size(3, 1)}",
            f"dataset.train_examples={ctx.size(2048, 256)}", "dataset.validation_examples=64",
            f"accelerator={ctx.kind}", f"devices={replicas}", "batch.per_replica=null",
            f"batch.global_size={ctx.size(64, 32)}", "batch.drop_remainder=true",
            "optimizer=sgd", "optimizer.momentum=0.0", "precision=float32",
            "jit_compile=false", "steps_per_execution=1", f"loop={loop}", "epochs=2",
            "seed=42", "checkpoint.save_best=false",
            # the logical GPUs have their memory limits; growth cannot be set on them
            "gpu.memory_growth=false", "verbose=0", "logger=[]", *ctx.overrides]


def weight_catcher() -> Any:
    """A callback keeping the weights at the start and at the end of training."""
    import keras

    class Catch(keras.callbacks.Callback):
        initial = final = None

        def on_train_begin(self, logs=None):
            if self.initial is None:
                self.initial = self.model.get_weights()

        def on_train_end(self, logs=None):
            self.final = self.model.get_weights()

    return Catch()


def weight_gap(a: list, b: list) -> tuple[float, bool]:
    """The largest |a - b| over all weights, and whether every one is within RTOL/ATOL."""
    import numpy as np

    gap = max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))
    within = all(np.allclose(y, x, rtol=RTOL, atol=ATOL) for x, y in zip(a, b, strict=True))
    return gap, within


# ---------------------------------------------------------------- speed: auto vs the rest

SPEED = {  # row: (key, reference, alternative)
    "speed_precision": ("precision", "float32", "mixed_float16"),
    "speed_jit": ("jit_compile", "false", "true"),
    "speed_steps": ("steps_per_execution", "1", "8"),
}


def bench_overrides(ctx: Context, image: int, devices: list[str]) -> list[str]:
    """MobileNetV2 on synthetic images, 64 per replica, as the throughput rows train it."""
    examples = ctx.size(4096 if image > 64 else 8192, 64)
    return [f"model={ctx.model}", "dataset=synthetic", f"dataset.image_size={image}",
            f"dataset.train_examples={examples}",
            f"dataset.validation_examples={ctx.size(512, 32)}", f"accelerator={ctx.kind}",
            *devices, f"epochs={ctx.size(4, 2)}",
            f"batch.per_replica={ctx.size(64, 8)}", "batch.drop_remainder=true", "verbose=0",
            "logger=[]"]


def speed_work(name: str) -> Callable[[Context], dict[str, Any]]:
    """The worker of one speed option: auto's choice against the other choices, alternating."""
    key, reference, alternative = SPEED[name]

    def run(ctx: Context) -> dict[str, Any]:
        one_device(ctx)
        base = [*bench_overrides(ctx, 32, [f"devices={ctx.size('[0]', '1')}"]),
                *ctx.overrides]
        chosen, reason, rates = None, "", {"auto": []}
        for _ in range(ctx.rounds):
            catch = jit_catcher()
            summary = train_once(base, (catch,))
            rates["auto"].append(summary["examples_per_sec"])
            chosen = resolved(key, summary, catch)
            reason = next((r for r in summary["speed_reasons"] if r.startswith(key)), "")
            for other in (reference, alternative):
                if other != chosen:
                    rates.setdefault(other, []).append(
                        train_once([*base, f"{key}={other}"])["examples_per_sec"])
        auto = statistics.median(rates["auto"])
        ratios = {o: statistics.median(a / b for a, b in zip(rates["auto"], r, strict=True))
                  for o, r in rates.items() if o != "auto"}
        others = "; ".join(f"{key}={o}: {rate(statistics.median(rates[o]))} (auto {x:.2f}x)"
                           for o, x in ratios.items())
        return {"ok": all(x >= RATIO for x in ratios.values()),
                "measured": f"auto chose {key}={chosen}: {rate(auto)}; {others}; "
                            f"reason: {reason}"}

    return run


def resolved(key: str, summary: dict[str, Any], catch: Any) -> str:
    """What `auto` became, as the override would spell it."""
    if key == "jit_compile":
        return "true" if catch.jit else "false"  # auto: Keras decided per model
    return str(summary[key])


def jit_catcher() -> Any:
    """A callback keeping whether the model trains XLA-compiled."""
    import keras

    class Catch(keras.callbacks.Callback):
        jit = None

        def on_train_begin(self, logs=None):
            self.jit = bool(self.model.jit_compile)

    return Catch()


# ---------------------------------------------------------------- trainer vs plain Keras


def vs_keras_work(image: int, logical: bool) -> Callable[[Context], dict[str, Any]]:
    """The worker of trainer against plain Keras, alternating, on 1 GPU or 2 logical GPUs."""

    def run(ctx: Context) -> dict[str, Any]:
        size = ctx.size(image, 32)
        names = carve(ctx, 2) if logical else one_device(ctx)
        if logical:
            use_devices(ctx.kind, names)
            devices = ["devices=2", "gpu.memory_growth=false"]
        else:
            devices = [f"devices={ctx.size('[0]', '1')}"]
        # Keras's defaults: float32; jit_compile and steps_per_execution stay auto
        ours = [*bench_overrides(ctx, size, devices), "precision=float32", *ctx.overrides]
        data = plain_data(ctx, size)
        plains, mine, ratios, cross = [], [], [], ""
        for _ in range(ctx.rounds):
            plains.append(plain_rate(ctx, names, size, data))
            examples_per_sec, cross = trainer_rate(ours, len(names) * ctx.size(64, 8))
            mine.append(examples_per_sec)
            ratios.append(mine[-1] / plains[-1])
        median = statistics.median(ratios)
        where = (f"{len(names)} logical {ctx.kind.upper()}s of one physical device"
                 if logical else f"1 {ctx.kind.upper()}")
        return {"ok": median >= RATIO,
                "setting": f"{ctx.size('MobileNetV2', 'cnn')} {size}x{size}, "
                           f"{ctx.size(64, 8)} per replica, {where}; "
                           "float32; alternating pairs",
                "measured": f"median ratio {median:.3f} over {ctx.rounds} pair(s) (each: "
                            f"{', '.join(f'{r:.3f}' for r in ratios)}); trainer "
                            f"{rate(statistics.median(mine))}, plain "
                            f"{rate(statistics.median(plains))}; trainer's cross-device "
                            f"ops: {cross}"}

    return run


def trainer_rate(overrides: list[str], global_batch: int) -> tuple[float, str]:
    """Steady examples/s of one trainer run inside its training steps, and its cross ops."""
    from bench_overhead import make_probe, steady_rate

    probe = make_probe()
    summary = train_once(overrides, (probe,))
    return steady_rate(probe, global_batch), summary["cross_device_ops"]


def plain_data(ctx: Context, size: int) -> tuple:
    """The plain side's uint8 images and labels, made once per row."""
    import numpy as np

    rng = np.random.default_rng(42)
    shape = (size, size, 3)
    examples = ctx.size(4096 if size > 64 else 8192, 64)
    return (rng.integers(0, 256, size=(examples, *shape), dtype=np.uint8),
            rng.integers(0, 10, size=examples, dtype=np.int32),
            rng.integers(0, 256, size=(ctx.size(512, 32), *shape), dtype=np.uint8),
            rng.integers(0, 10, size=ctx.size(512, 32), dtype=np.int32))


def plain_rate(ctx: Context, names: tuple[str, ...], size: int, data: tuple) -> float:
    """What a user writes from the MirroredStrategy tutorial: steady examples/s in `fit`."""
    import keras
    import tensorflow as tf
    from bench_overhead import make_probe, steady_rate

    from trainer.models import cnn, mobilenet

    keras.config.set_dtype_policy("float32")
    x, y, xv, yv = data
    global_batch = ctx.size(64, 8) * len(names)

    def scale(image, label):
        return tf.cast(image, tf.float32) / 255.0, label

    train = (tf.data.Dataset.from_tensor_slices((x, y)).map(scale).cache().shuffle(2048)
             .batch(global_batch, drop_remainder=True))
    validation = tf.data.Dataset.from_tensor_slices((xv, yv)).map(scale).batch(global_batch)
    strategy = tf.distribute.MirroredStrategy(list(names))
    with strategy.scope():
        model = (mobilenet if ctx.model == "mobilenet" else cnn).build((size, size, 3), 10)
        model.compile(optimizer=keras.optimizers.Adam(0.001),
                      loss=keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    probe = make_probe()
    model.fit(train, validation_data=validation, epochs=ctx.size(4, 2), callbacks=[probe],
              verbose=0)
    return steady_rate(probe, global_batch)


# ---------------------------------------------------------------- whole runs


def default_run_work(ctx: Context) -> dict[str, Any]:
    """The worker of the README's first command, `python -m trainer`, timed from outside."""
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        started = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "trainer", f"hydra.run.dir={tmp}/run",
                              *ctx.overrides], cwd=tmp, env=worker_env(), capture_output=True,
                             text=True)
        wall = time.perf_counter() - started
        if out.returncode != 0:
            why = reason_from(out.returncode, out.stderr)
            raise RuntimeError(f"python -m trainer failed: {why}")
        summary = json.loads((Path(tmp) / "run" / "summary.json").read_text())
    accuracy = summary["validation_metrics"]["accuracy"]
    return {"ok": wall <= 60 and accuracy >= 0.95,
            "measured": f"wall {wall:.1f} s (run {summary['time']['wall_s']:.1f} s, first step "
                        f"{summary['time']['first_step_s']:.1f} s); validation accuracy "
                        f"{accuracy:.4f}; {summary['replicas']} replica(s), "
                        f"{summary['precision']}, {rate(summary['examples_per_sec'])}"}


def cifar10_work(ctx: Context) -> dict[str, Any]:
    """The worker of cifar10-shaped data at full speed: training beside its input pipeline."""
    overrides = [f"model={ctx.model}", "dataset=synthetic", "dataset.image_size=32",
                 "dataset.channels=3", "dataset.num_classes=10",
                 f"dataset.train_examples={ctx.size(16384, 64)}",
                 f"dataset.validation_examples={ctx.size(1024, 32)}",
                 f"accelerator={ctx.kind}", f"devices={ctx.size('auto', '1')}",
                 f"epochs={ctx.size(4, 2)}", f"batch.per_replica={ctx.size(64, 8)}",
                 "verbose=0", "logger=[]", *ctx.overrides]
    built = record_data()
    summary = train_once(overrides)
    training = summary["examples_per_sec"]
    feeding = pipeline_rate(built[-1], summary)
    return {"ok": feeding >= training,
            "measured": f"training {rate(training)} ({summary['replicas']} replica(s), "
                        f"{summary['precision']}, jit_compile={summary['jit_compile']}, "
                        f"{summary['steps_per_execution']} step(s)/call); input pipeline "
                        f"alone {rate(feeding)} ({feeding / training:.1f}x); wall "
                        f"{summary['time']['wall_s']:.1f} s"}


def record_data() -> list:
    """Keeps every `Data` trainer builds in this process (its input pipelines), in a list."""
    import trainer.run.assemble as assemble_module

    built, build = [], assemble_module.build_data

    def recording(*args, **kwargs):
        built.append(build(*args, **kwargs))
        return built[-1]

    assemble_module.build_data = recording
    return built


def pipeline_rate(data: Any, summary: dict[str, Any]) -> float:
    """Examples/s of a run's own training pipeline alone, after the epoch filling its cache."""
    steps = summary["steps_per_epoch"]
    batches = iter(data.make_train(0, summary["epochs"], 0))
    for _ in range(steps):
        next(batches)
    started, examples = time.perf_counter(), 0
    for images, _ in batches:
        examples += int(images.shape[0])
    return examples / (time.perf_counter() - started)


def pytest_work(ctx: Context) -> dict[str, Any]:
    """The worker of `python -m pytest -m gpu`: all pass, none skipped."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "tests"],
                         cwd=REPO, env=worker_env(), capture_output=True, text=True)
    lines = [line.strip(" =") for line in out.stdout.splitlines() if line.strip(" =")]
    last = lines[-1] if lines else reason_from(out.returncode, out.stderr)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last)}
    ok = (out.returncode == 0 and counts.get("passed", 0) > 0
          and not any(counts.get(w) for w in ("failed", "skipped", "error", "errors")))
    return {"ok": ok, "measured": last}


ROWS = {row.name: row for row in [
    Row("devices_0", "devices=[0]", "devices=[0], gpu.memory_growth=true (default); cnn on "
        "digits, 1 epoch", "only GPU 0 seen; memory growth on; < 50% of a GPU's memory taken",
        devices_work("[0]"), timeout=300),
    Row("devices_auto", "devices=auto", "devices=auto; cnn on digits, 1 epoch",
        "every GPU seen, one replica each; memory growth on; < 50% of a GPU's memory taken",
        devices_work("auto"), timeout=300),
    Row("memory_limit", "gpu.memory_limit_mb", f"devices=[0], gpu.memory_limit_mb={LIMIT_MB}; "
        "cnn on digits, 1 epoch", f"GPU capped at {LIMIT_MB} MiB: training peak within it, "
        f"a {LIMIT_MB * 3 // 2} MiB tensor refused", memory_limit_work, timeout=300),
    Row("replicas_equal", "1 vs 2 logical GPUs", "2 logical GPUs of GPU 0 vs 1; cnn without "
        "dropout, global batch 64, float32, fit and custom", "cross-device ops not nccl; "
        f"weights within rtol {RTOL:g}, atol {ATOL:g}", replicas_equal_work, dry=True),
    *(Row(name, f"{key}=auto", f"MobileNetV2 32x32, 64 per replica, 1 GPU; auto vs "
          f"{key}={ref} and {key}={alt}", f"auto >= {RATIO}x the other choice(s)",
          speed_work(name), timeout=900, dry=True)
      for name, (key, ref, alt) in SPEED.items()),
    *(Row(f"vs_keras_{image}_{where}", "trainer vs plain Keras",
          f"MobileNetV2 {image}x{image}, 64 per replica, "
          + ("1 GPU" if where == "1gpu" else "2 logical GPUs of GPU 0")
          + "; float32; alternating pairs", f"median trainer / plain >= {RATIO}",
          vs_keras_work(image, where == "2logical"), timeout=900, dry=True)
      for where in ("1gpu", "2logical") for image in (32, 224)),
    Row("default_run", "default run", "python -m trainer (cnn on digits, 8 epochs, every GPU)",
        "wall <= 60 s; validation accuracy >= 0.95", default_run_work, timeout=300),
    Row("cifar10_shaped", "cifar10-shaped, full speed", "synthetic 32x32x3, 10 classes; "
        "model=mobilenet, devices=auto, precision, jit_compile, steps_per_execution auto",
        "input pipeline alone >= training throughput", cifar10_work, dry=True),
    Row("pytest_gpu", "gpu tests", "python -m pytest -m gpu tests",
        "all pass, none skipped", pytest_work, timeout=900, dry=True),
]}


if __name__ == "__main__":
    raise SystemExit(main())
