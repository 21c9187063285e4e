"""One way in: the command line, `trainer.fit`, a sweep and the launcher compose a run once
and start it the same way, so its run directory is one folder whatever the time between
the steps; the README's commands as a user types them, from an empty folder, with no
`hydra.run.dir`; run directories that cannot be a run's, refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY, error_lines, run_main
from tests.test_multiworker import COMMON, launches
from tests.test_remote_rundir import BUCKET, s3

__all__ = ["launches", "s3"]  # the fixtures, imported for the tests below

# The run's files as one folder holds them, whichever way it started.
WHOLE = (".hydra/config.yaml", ".hydra/overrides.yaml", "trainer.log", "summary.json",
         "checkpoints/best.keras")


def _env(**extra: str) -> dict[str, str]:
    """A user's environment: no test-only variable, TensorFlow's notices as they come."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HYDRA_FULL_ERROR", "TF_CPP_MIN_LOG_LEVEL")}
    return {**env, **extra}


def _python(*args: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env or _env(),
                          capture_output=True, text=True, timeout=timeout)


def _printed_run_dir(stdout: str) -> str:
    """The run directory the summary printed."""
    lines = [line for line in stdout.splitlines() if line.strip().startswith("run directory")]
    assert len(lines) == 1, stdout[-3000:]
    return lines[0].split("run directory", 1)[1].strip()


def _one_run_under(root: Path) -> Path:
    """The one run directory under `root` (`outputs/DATE/TIME`), failing if the run's files
    are in more than one folder."""
    holders = {p.parent for name in (".hydra", "trainer.log", "summary.json", "checkpoints",
                                     "backup") for p in root.rglob(name)}
    assert len(holders) == 1, sorted(holders)
    return holders.pop()


def _assert_whole(run_dir: Path) -> None:
    missing = [name for name in WHOLE if not (run_dir / name).is_file()]
    assert missing == [], (run_dir, sorted(p.name for p in run_dir.iterdir()))


@pytest.mark.long
def test_the_readmes_first_command_leaves_one_run_that_evaluate_and_predict_open(tmp_path):
    """`python -m trainer` as the README's first command types it (one epoch), from an empty
    folder, in a fresh process with an empty MPLCONFIGDIR (a first run on a new machine):
    one directory under outputs/, the project's lines alone, and `trainer.evaluate` and
    `trainer.predict` on the directory it printed."""
    fonts = tmp_path / "mpl"
    fonts.mkdir()
    env = _env(MPLCONFIGDIR=str(fonts))
    run = _python("-m", "trainer", "epochs=1", cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr == "", run.stderr[-3000:]  # no TensorFlow notice, no matplotlib line
    assert "matplotlib" not in run.stdout and "fontManager" not in run.stdout
    printed = _printed_run_dir(run.stdout)
    run_dir = _one_run_under(tmp_path / "outputs")
    assert (tmp_path / printed).resolve() == run_dir.resolve()
    _assert_whole(run_dir)
    evaluated = _python("-m", "trainer.evaluate", printed, cwd=tmp_path, env=env)
    assert evaluated.returncode == 0 and evaluated.stderr == "", evaluated.stderr[-3000:]
    assert '"accuracy"' in evaluated.stdout
    np.save(tmp_path / "new.npy", np.random.default_rng(0).integers(0, 17, (5, 8, 8, 1), "uint8"))
    predicted = _python("-m", "trainer.predict", printed, "input=new.npy",
                        "output=predictions.csv", cwd=tmp_path, env=env)
    assert predicted.returncode == 0 and predicted.stderr == "", predicted.stderr[-3000:]
    rows = (tmp_path / "predictions.csv").read_text().splitlines()
    assert len(rows) == 6 and "class" in rows[0]


def test_a_run_directory_read_to_the_microsecond_is_one_folder(tmp_path):
    """`${now:...}` in the run directory is read once per run: with microseconds, any second
    reading would name another folder."""
    out = run_main(*TINY, "model=small", "hydra.run.dir=runs/t-${now:%H-%M-%S-%f}",
                   cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = _one_run_under(tmp_path / "runs")
    _assert_whole(run_dir)
    assert Path(_printed_run_dir(out.stdout)).name == run_dir.name
    hydra = (run_dir / ".hydra" / "hydra.yaml").read_text()
    assert f"dir: runs/{run_dir.name}" in hydra and f"output_dir: {run_dir}" in hydra


def test_hydra_interpolations_in_a_single_run_read_its_one_composition(tmp_path):
    """`${hydra:runtime.output_dir}` in a run's config is the run's own directory, read from
    the one composition the run started with."""
    out = run_main(*TINY, "model=small", "hydra.run.dir=runs/h-${now:%H-%M-%S-%f}",
                   "+callbacks.csv._target_=keras.callbacks.CSVLogger",
                   "+callbacks.csv.filename=${hydra:runtime.output_dir}/own.csv", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = _one_run_under(tmp_path / "runs")
    assert (run_dir / "own.csv").is_file()


def test_a_file_url_is_the_local_folder_it_names(tmp_path):
    target = tmp_path / "x"
    out = run_main(*TINY, "model=small", f"hydra.run.dir=file://{target}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    _assert_whole(target)
    assert not (tmp_path / "file:").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]


@pytest.mark.parametrize("where, said", [
    ("/", "is the file system's root"),
    ("/etc/trainer-run", "is in a folder of the operating system's"),
    ("/proc/trainer-run", "is in a folder of the operating system's"),
    ("{tmp}/a-file/run", "is under {tmp}/a-file, which is a file, not a folder"),
    ("file://relative/run", "a file:// run directory names an absolute local path"),
])
def test_a_run_directory_that_cannot_be_a_runs_is_one_line_and_nothing_is_written(
        tmp_path, where, said):
    (tmp_path / "a-file").write_text("x")
    where, said = where.format(tmp=tmp_path), said.format(tmp=tmp_path)
    root_before = sorted(os.listdir("/"))
    out = run_main(*TINY, "model=small", f"hydra.run.dir={where}", cwd=tmp_path)
    lines = error_lines(out.stderr)
    assert out.returncode == 2 and len(lines) == 1 and said in lines[0], out.stderr
    assert sorted(os.listdir("/")) == root_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.long
def test_trainer_fit_without_a_run_dir_leaves_one_whole_run_with_its_log(tmp_path):
    """A user's script calling `trainer.fit([...])` with no `run_dir`, as `python script.py`
    from an empty folder: one run under outputs/, `.hydra/` and `trainer.log` in it, and the
    script's own logging left as it was."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""
        import logging
        import trainer

        logging.basicConfig(level=logging.WARNING, format="own: %(message)s")
        result = trainer.fit(["epochs=1", "verbose=0", "logger=[]"])
        logging.getLogger("user").warning("after the run")
        print("RUN", result.run_dir)
    """))
    done = _python(str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = _one_run_under(tmp_path / "outputs")
    _assert_whole(run_dir)
    assert f"RUN {run_dir.relative_to(tmp_path)}" in done.stdout
    assert "own: after the run" in done.stderr  # the script's handler kept
    assert "after the run" not in (run_dir / "trainer.log").read_text()


@pytest.mark.long
def test_a_sweep_without_a_directory_gives_each_job_one_whole_folder(tmp_path):
    done = _python("-m", "trainer", "-m", "epochs=1", "verbose=0", "logger=[]", "seed=1,2",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    sweeps = [p for p in (tmp_path / "multirun").glob("*/*") if p.is_dir()]
    assert len(sweeps) == 1, sweeps
    jobs = sorted(p for p in sweeps[0].iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    for job in jobs:
        _assert_whole(job)
        assert json.loads((job / "summary.json").read_text())["epochs_done"] == 1


@pytest.mark.multiworker
def test_the_launcher_without_a_directory_leaves_one_whole_run(tmp_path, launches):
    """`python -m trainer.launch --workers 2` with no `hydra.run.dir`: the chief's run is one
    folder under outputs/, which the launcher named."""
    launch = launches(2, *COMMON, "epochs=1")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    run_dir = _one_run_under(tmp_path / "outputs")
    _assert_whole(run_dir)
    assert f"the chief (worker 0) writes {run_dir.relative_to(tmp_path)}" in launch.output
    assert json.loads((run_dir / "summary.json").read_text())["workers"] == 2


@pytest.mark.multiworker
def test_the_launcher_trains_at_an_experiment_files_url(tmp_path, launches, s3):
    """An experiment file's `hydra.run.dir: s3://...` (with `--config-dir`), which the
    launcher composes as the workers do: the run is at the URL, and nothing local."""
    own = tmp_path / "conf" / "experiment"
    own.mkdir(parents=True)
    (own / "at_url.yaml").write_text(textwrap.dedent(f"""\
        # @package _global_
        epochs: 1
        hydra:
          run:
            dir: s3://{BUCKET}/runs/from-experiment
    """))
    launch = launches(2, "--config-dir", str(tmp_path / "conf"), *COMMON,
                      "experiment=at_url")
    assert launch.wait(timeout=300) == 0, launch.output[-3000:]
    summary = json.loads(s3.fs.cat_file(f"{BUCKET}/runs/from-experiment/summary.json"))
    assert summary["workers"] == 2 and summary["epochs_done"] == 1
    assert f"writes s3://{BUCKET}/runs/from-experiment" in launch.output
    assert not (tmp_path / "outputs").exists()
