"""The README and docs/: short README, its first commands exact, every relative link alive.

Plain text checks (no TensorFlow of their own): they read README.md and docs/*.md, and list
every command there with the test that runs it or the reason it cannot run here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

SETUP = ("python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' -c constraints.txt && "
         ".venv/bin/python -m trainer")
TESTS = ".venv/bin/python -m pytest"

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
FENCE_INFO = re.compile(r"^```([^\n]*)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced blocks and inline code, where a [x](y) is not a link."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def _relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(_prose(path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto:


def test_the_readme_fits_on_a_screen_or_two():
    assert len(README.read_text().splitlines()) <= 200


def test_the_readmes_first_two_code_blocks_are_setup_and_tests():
    blocks = [block.strip() for block in FENCE.findall(README.read_text())]
    assert blocks[:2] == [SETUP, TESTS]


def test_every_relative_link_points_into_the_repository():
    broken = []
    for page in [README, *DOCS]:
        for target in _relative_links(page):
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            if not resolved.exists() or REPO not in [resolved, *resolved.parents]:
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_readme_links_every_docs_page():
    linked = {(REPO / target.partition("#")[0]).resolve()
              for target in _relative_links(README)}
    assert DOCS and [page.name for page in DOCS if page not in linked] == []


def test_no_reference_to_files_outside_the_repository():
    code = [path for folder in ("trainer", "scripts", "conf")
            for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".yaml", ".md")]
    texts = {path: path.read_text() for path in [README, *DOCS, *code]}
    assert [str(p.relative_to(REPO)) for p, text in texts.items()
            if "PERF_NOTES" in text or "DESIGN.md" in text or "../shared" in text] == []


# Every command of the README and docs/: each line of a ```bash block (a `\` continuation or
# an open quote joins the next line; `# ...` comments dropped) and each `$ ` line of other
# blocks (the one-line errors shown with their command). Each is run by a test, named here
# as file::function, or listed in NOT_RUN_HERE with why it cannot run on this machine; a
# command added to the docs without either fails `test_every_documented_command_is_tested`.
RUNS_AS_WRITTEN = "tests/test_readme_examples.py::test_a_documented_command_runs"
TESTED_BY = {
    # docs/resume.md: the k best checkpoints and averaged weights
    "python -m trainer checkpoint.monitor=val_loss checkpoint.keep_best=3 "
    "checkpoint.average_best=3":
        "tests/test_best_and_averaged.py::"
        "test_keep_best_3_leaves_the_best_three_named_by_epoch_and_value",
    "python -m trainer optimizer.ema=true optimizer.ema_momentum=0.999":
        "tests/test_best_and_averaged.py::"
        "test_ema_under_two_replicas_is_the_average_of_every_step_and_is_what_was_tested",
    "python -m trainer.evaluate RUN_DIR checkpoint=averaged split=test":
        "tests/test_best_and_averaged.py::"
        "test_average_best_tests_the_mean_of_the_best_checkpoints_once",
    # docs/resume.md: a run directory at a URL (on moto's S3 server and gcp-storage-emulator)
    "python -m trainer hydra.run.dir=s3://my-bucket/runs/a checkpoint.backup_every=50":
        "tests/test_remote_rundir.py::"
        "test_killed_mid_epoch_at_a_url_resumes_to_the_weights_of_an_uninterrupted_run",
    "python -m trainer.evaluate s3://my-bucket/runs/a":
        "tests/test_remote_rundir.py::"
        "test_killed_mid_epoch_at_a_url_resumes_to_the_weights_of_an_uninterrupted_run",
    # the README
    "python -m trainer": RUNS_AS_WRITTEN,
    "python -m trainer model=mobilenet devices=[0,1]":
        "tests/test_cli.py::test_the_design_cards_command_trains",
    "python -m trainer model=keras_app accelerator=cpu devices=2":
        "tests/test_cli.py::test_the_headline_commands_as_written",
    "python -m trainer -m accelerator=cpu devices=1,2,4":
        "tests/test_cli.py::test_sweep_over_devices_gives_each_job_its_devices",
    "python -m trainer tune=lr":
        "tests/test_tune.py::test_the_suggested_rate_trains_as_well_and_replicas_agree",
    "python -m trainer tune=batch accelerator=cpu devices=2":
        "tests/test_tune.py::test_tune_batch_draws_a_throughput_curve_and_suggests_a_batch_on_it",
    "python -m trainer.distribute.devices":
        "tests/test_devices.py::test_devices_helper_lists_logical_cpus",
    "python -m trainer dataset._target_=wine.load model._target_=wine.build optimizer.lr=0.01 "
    "batch.per_replica=16 accelerator=cpu devices=2":
        "tests/test_readme_examples.py::test_own_classification_example_trains_on_two_replicas",
    "python -m trainer dataset._target_=shop.load model._target_=shop.build optimizer.lr=0.01 "
    "'loss={label: sparse_categorical_crossentropy, score: mse}' 'loss_weights={label: 1, "
    "score: 0.1}' 'metrics={label: [accuracy], score: [mae]}' "
    "checkpoint.monitor=val_label_accuracy devices=2":
        "tests/test_readme_examples.py::test_two_input_two_output_example_beats_trivial_answers",
    "python -m trainer hydra.run.dir=runs/a checkpoint.backup_every=50":
        "tests/test_fault_tolerance.py::test_sigterm_stops_at_a_step_and_resumes_from_it",
    "python -m trainer epochs=20 resume=runs/a":
        "tests/test_fault_tolerance.py::test_finished_run_is_not_overwritten_unless_resumed",
    "python -m trainer.launch --workers 2 epochs=3 hydra.run.dir=runs/two":
        "tests/test_multiworker.py::test_two_workers_train_like_one",
    "python -m trainer.launch --workers 2 train.py runs/two":
        "tests/test_worker_scripts.py::test_a_script_runs_as_every_worker_under_the_launcher",
    "python train.py runs/two":
        "tests/test_worker_scripts.py::"
        "test_a_script_started_by_hand_with_tf_config_ends_cleanly_on_every_worker",
    "python -m trainer.launch --workers 2 --evaluator epochs=3 hydra.run.dir=runs/eval":
        "tests/test_evaluator.py::test_two_workers_and_an_evaluator",
    "python -m trainer.launch --workers 2 dataset.service=local:2 epochs=3 "
    "hydra.run.dir=runs/served":
        "tests/test_data_service.py::test_two_workers_each_with_local_services_train_like_one",
    "python -m trainer -m optimizer.lr=0.01,0.1 batch.per_replica=32,64":
        "tests/test_sweep.py::test_a_grid_sweep_runs_every_job_and_names_the_failed_one",
    "python -m trainer -m hparams_search=digits_optuna":
        "tests/test_sweep.py::test_optuna_search_goes_on_past_a_failed_trial_and_tables_every_trial",
    "python -m trainer logger=[tensorboard,csv,mlflow]": RUNS_AS_WRITTEN,
    # docs/own-task.md
    "python -m trainer.data.tfrecords images/ records/ --shards 4":
        "tests/test_tfrecords.py::test_the_writer_keeps_the_image_folders_split_and_decodes_alike",
    "python -m trainer dataset=tfrecord dataset.path=records/":
        "tests/test_sharded_input.py::"
        "test_tfrecord_shards_of_an_image_folder_train_on_two_workers_like_one",
    # docs/api.md
    "python -m trainer.predict runs/a input=new_images/ output=predictions.csv accelerator=cpu "
    "devices=3": "tests/test_api.py::test_predict_from_the_command_line_and_its_one_line_errors",
    # docs/configuration.md: the one-line errors
    "python -m trainer model=resnet":
        "tests/test_cli.py::test_config_errors_are_one_line_and_exit_2",
    "python -m trainer accelerator=cpu devices=3 batch.per_replica=null batch.global_size=100":
        "tests/test_cli.py::test_config_errors_are_one_line_and_exit_2",
    "python -m trainer +epoch=1": "tests/test_cli.py::test_config_errors_are_one_line_and_exit_2",
    # docs/devices-and-performance.md
    "python -m trainer -m accelerator=cpu devices=1,2,4 epochs=2":
        "tests/test_cli.py::test_sweep_over_devices_gives_each_job_its_devices",
    "python -m trainer.track.report multirun/<date>/<time>":
        "tests/test_sweep.py::test_launcher_plugins_give_each_job_its_own_devices",
    "python -m trainer batch.per_replica=null batch.global_size=2048 batch.max_per_replica=256 "
    "batch.accumulate=auto": RUNS_AS_WRITTEN,
    # docs/own-task.md
    "python -m trainer 'loss={_target_: keras.losses.SparseCategoricalCrossentropy, "
    "from_logits: true}'": RUNS_AS_WRITTEN,
    "python -m trainer 'metrics=[accuracy,{_target_: keras.metrics.SparseTopKCategoricalAccuracy,"
    " k: 3}]'": RUNS_AS_WRITTEN,
    "python -m trainer optimizer=adamw optimizer.weight_decay=0.01 optimizer.global_clipnorm=1.0":
        RUNS_AS_WRITTEN,
    "python -m trainer callbacks=[early_stopping,csv_logger] callbacks.early_stopping.patience=5":
        RUNS_AS_WRITTEN,
    "python -m trainer --config-dir conf experiment=diabetes accelerator=cpu devices=2":
        "tests/test_task.py::test_readme_project_trains_outside_the_repository_from_an_installed_"
        "trainer",
    "python -m trainer.evaluate outputs/2026-11-22/10-00-00 split=test accelerator=cpu devices=3":
        "tests/test_splits.py::test_test_split_evaluated_on_1_3_4_replicas_equals_numpy_over_"
        "every_example",
    "python -m trainer model=keras_app model.name=ResNet50V2 model.input_size=64 accelerator=cpu "
    "devices=2": RUNS_AS_WRITTEN,
    "python -m trainer model=keras_app model.name=MobileNetV3Small "
    "model.weights=outputs/.../checkpoints/best.keras":
        "tests/test_zoo.py::test_weights_from_an_earlier_runs_checkpoint_load_into_the_backbone",
    "python -m trainer augment=[flip,crop]": RUNS_AS_WRITTEN,
    "python -m trainer model=keras_app model.input_size=32 "
    "'augment=[flip,crop,rotation,zoom,contrast]'": RUNS_AS_WRITTEN,
    # docs/resume.md
    "python -m trainer.evaluate outputs/2026-11-21/10-00-00 accelerator=cpu devices=2 "
    "checkpoint=last":
        "tests/test_task.py::test_evaluate_on_2_replicas_gives_the_metrics_of_a_run_trained_on_1",
    # docs/sweeps-and-trackers.md
    "python -m trainer -m hparams_search=digits_optuna hydra.sweeper.n_trials=40 epochs=10":
        "tests/test_sweep.py::test_optuna_search_goes_on_past_a_failed_trial_and_tables_every_trial",
    "python -m trainer -m hparams_search=digits_optuna hydra/sweeper/pruner=hyperband":
        "tests/test_optuna_sweep.py::"
        "test_samplers_and_pruners_are_chosen_by_name_and_take_their_arguments",
    "python -m trainer -m hparams_search=digits_optuna hydra.sweeper.pruner=null":
        "tests/test_optuna_sweep.py::"
        "test_samplers_and_pruners_are_chosen_by_name_and_take_their_arguments",
    "python -m trainer -m hparams_search=digits_optuna +hydra.sweeper.pruner.n_warmup_steps=1":
        "tests/test_optuna_sweep.py::"
        "test_samplers_and_pruners_are_chosen_by_name_and_take_their_arguments",
    "python -m trainer -m hparams_search=digits_optuna hydra.sweeper.pruner=null "
    "'hydra.sweeper.pruner={_target_: optuna.pruners.ThresholdPruner, lower: 0.5}'":
        "tests/test_optuna_sweep.py::"
        "test_a_pruned_trial_stops_training_exits_cleanly_and_ends_pruned",
    "python -m trainer -m hparams_search=digits_optuna "
    "hydra.sweeper.storage=sqlite:////data/digits.db hydra.sweeper.study_name=digits":
        "tests/test_optuna_sweep.py::test_two_sweeps_at_once_share_one_sqlite_study",
    "python -m trainer logger=[mlflow] logger.mlflow.tracking_uri=http://127.0.0.1:5999":
        "tests/test_loggers.py::test_an_unreachable_tracking_server_is_one_line_before_"
        "tensorflow_starts",
    # docs/versions.md
    "python scripts/check_versions.py --lowest":
        "tests/test_versions.py::test_the_lowest_bounds_pass_the_keras_contract_subset",
    ".venv/bin/pip freeze --all --exclude-editable | grep -v '^pip==' > constraints.txt":
        "tests/test_versions.py::test_the_refresh_command_writes_what_pip_c_accepts",
}
NOT_RUN_HERE = {
    "python scripts/check_versions.py --newest":
        "the upgrade check: its outcome follows PyPI's newest releases, so no test can expect "
        "one; its install and subset are the --lowest slow test's, its scoreboard "
        "tests/test_versions.py::test_the_scoreboard_driver_keeps_each_cells_traceback",
    ".venv/bin/python -m pytest": "the test suite itself, which runs every test named here",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' -c constraints.txt && "
    ".venv/bin/python -m trainer":
        "a fresh virtual environment installed from PyPI (minutes, and the network); its last "
        "part, the default run, is `python -m trainer` above; the versions it installs are "
        "tests/test_versions.py's, a fresh venv at the lowest bounds "
        "tests/test_versions.py::test_the_lowest_bounds_pass_the_keras_contract_subset",
    "python -m trainer -m experiment=mnist_towers devices=1,2,4,8":
        "downloads MNIST through TFDS (no network here) and means 8 GPUs; the experiment's "
        "one epoch on mock data is tests/test_experiments.py::"
        "test_experiment_runs_one_short_epoch",
    "srun .venv/bin/python -m trainer model=mobilenet dataset=cifar10 "
    "hydra.run.dir=runs/${SLURM_JOB_ID}":
        "a SLURM cluster (srun) and CIFAR-10's download; a faked job step is "
        "tests/test_multiworker.py::test_a_faked_slurm_step_trains_as_two_workers_like_one_and_"
        "only_the_chief_logs",
    "python -m trainer.data.tfrecords /data/imagenet /shared/imagenet-tfrecord --shards 1024":
        "ImageNet's 150 GB; the same writer on a small folder is tests/test_tfrecords.py::"
        "test_the_writer_keeps_the_image_folders_split_and_decodes_alike",
    "srun .venv/bin/python -m trainer model=keras_app model.name=ResNet50 dataset=tfrecord "
    "dataset.path=/shared/imagenet-tfrecord dataset.image_size=224 dataset.cache=disk "
    "dataset.lanes=32 augment=[flip,crop] batch.per_replica=64 epochs=90 "
    "hydra.run.dir=runs/${SLURM_JOB_ID}":
        "a SLURM cluster of 32 GPUs and ImageNet; TFRecord shards on 2 workers training as 1 are "
        "tests/test_sharded_input.py::"
        "test_tfrecord_shards_of_an_image_folder_train_on_two_workers_like_one",
    "python -m trainer loss=categorical_crossentropy ...":
        "a pattern, not a command (`...` is the rest of a command line); loss names are run by "
        "tests/test_task.py::test_binary_task_keeps_the_checkpoint_with_the_highest_auc",
    "python -m trainer model=keras_app model.name=EfficientNetV2B0 model.weights=imagenet "
    "dataset=cats_vs_dogs":
        "downloads the ImageNet weights and cats_vs_dogs (no network here); offline it is the "
        "one line of tests/test_zoo.py::test_imagenet_weights_offline_is_one_line_naming_the_file",
    "python -m trainer model=keras_app model.input_size=32 model.weights=imagenet "
    "finetune.freeze_backbone=true finetune.unfreeze_at_epoch=6 finetune.unfreeze_layers=54 "
    "epochs=10":
        "downloads the ImageNet weights (no network here); the same phases on a small backbone "
        "are tests/test_finetune.py",
    "python -m trainer model=mobilenet dataset=cifar10 strategy=multi_worker "
    "cluster.workers=[10.0.0.1:2222,10.0.0.2:2222] cluster.task_index=0 hydra.run.dir=runs/mw":
        "two machines at 10.0.0.1 and 10.0.0.2, and CIFAR-10's download; the same on 127.0.0.1 "
        "is tests/test_multiworker.py::test_two_processes_started_by_hand",
    "python -m trainer model=mobilenet dataset=cifar10 strategy=multi_worker "
    "cluster.workers=[10.0.0.1:2222,10.0.0.2:2222] cluster.task_index=1 hydra.run.dir=runs/mw":
        "the second of those two machines",
    "export TF_CONFIG='{\"cluster\": {\"worker\": [\"10.0.0.1:2222\", \"10.0.0.2:2222\"]}, "
    "\"task\": {\"type\": \"worker\", \"index\": 0}}'":
        "the environment of a cluster's machine, not a run; TF_CONFIG clusters are "
        "tests/test_multiworker.py::test_two_processes_started_by_hand",
    "python -m trainer.ray --workers 4 --address HEAD:6379 --max-failures 3 "
    "hydra.run.dir=s3://b/run":
        "a Ray cluster's head and a bucket; 2 workers on Ray's local 2-node cluster, one node "
        "lost, are tests/test_ray.py::"
        "test_two_workers_on_two_nodes_one_lost_mid_run_end_on_one_as_the_uninterrupted_run",
    "pip install 'trainer[ray]'":
        "installs on a cluster's machines; the extra is in the dev install CI makes",
    "python -m trainer.ray --workers 4 --address 10.0.0.1:6379 --max-failures 3 "
    "model=mobilenet dataset=cifar10 hydra.run.dir=s3://my-bucket/runs/cifar":
        "a Ray cluster of several machines, a bucket and CIFAR-10's download; the same on Ray's "
        "local 2-node cluster is tests/test_ray.py's",
    "python -m trainer.ray --workers 2 train.py --epochs 5":
        "a user's train.py on a Ray cluster; a script on several workers is "
        "tests/test_fit_as_model_fit.py::test_the_ported_scripts_train_on_two_workers",
}

# The lines of the SLURM batch scripts that pass a preemption notice on to their step and
# requeue a job that exits 75: a SLURM cluster; the launcher passing SIGUSR1 on and a worker's
# stop on it are tests/test_preemption.py's, a lost peer's 75 tests/test_restarts.py's.
PREEMPTION_SCRIPT = (
    "trap 'kill -USR1 $step' USR1",
    "srun .venv/bin/python -m trainer model=mobilenet dataset=cifar10 "
    "hydra.run.dir=runs/${SLURM_JOB_ID} &",
    "step=$!",
    "wait $step; code=$?",
    "while kill -0 $step 2>/dev/null; do wait $step; code=$?; done",
    "srun .venv/bin/python -m trainer model=mobilenet dataset=cifar10 cluster.max_restarts=3 "
    "hydra.run.dir=runs/${SLURM_JOB_ID}",
    "if [ $? -eq 75 ]; then scontrol requeue $SLURM_JOB_ID; fi",
)
NOT_RUN_HERE.update({line: "a SLURM batch script (srun, sbatch's signal, scontrol); SIGUSR1's "
                     "stop is tests/test_preemption.py's, restarts tests/test_restarts.py's"
                     for line in PREEMPTION_SCRIPT})


def _strip_comment(line: str) -> str:
    """A shell line without its `# comment` (a `#` outside quotes after a space)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _complete(text: str) -> bool:
    try:
        shlex.split(text)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def commands(path: Path) -> list[str]:
    """The commands of a Markdown file, one per logical line, whitespace collapsed."""
    found = []
    for info, body in FENCE_INFO.findall(path.read_text()):
        shell, pending = info.strip() == "bash", ""
        for raw in body.splitlines():
            if not shell and not raw.startswith("$ "):
                continue
            text = f"{pending}\n{raw if shell else raw[2:]}" if pending else (
                raw if shell else raw[2:])
            if text.rstrip().endswith("\\"):
                pending = text.rstrip()[:-1]
                continue
            if not _complete(text):
                pending = text
                continue
            pending = ""
            command = " ".join((_strip_comment(text) if shell else text).split())
            if command:
                found.append(command)
    return found


def documented_commands() -> dict[str, list[str]]:
    """{command: the pages it is on}, over the README and docs/."""
    found: dict[str, list[str]] = {}
    for page in [README, *DOCS]:
        for command in commands(page):
            found.setdefault(command, []).append(str(page.relative_to(REPO)))
    return found


def test_commands_are_read_as_a_user_types_them():
    page = REPO / "docs" / "several-machines.md"
    # an open quote joins the next line
    assert ("export TF_CONFIG='{\"cluster\": {\"worker\": [\"10.0.0.1:2222\", "
            "\"10.0.0.2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}'"
            ) in commands(page)
    assert not any(c.startswith("#") for c in commands(page))  # #!/bin/bash, #SBATCH
    assert "python -m trainer model=resnet" in commands(REPO / "docs" / "configuration.md")


def test_the_readme_shows_the_design_cards_command():
    block = FENCE.findall(README.read_text().split("## What a run looks like", 1)[1])[0]
    shown = [" ".join(_strip_comment(line).split()) for line in block.splitlines()]
    assert "python -m trainer model=mobilenet devices=[0,1]" in shown


def test_every_documented_command_is_tested():
    documented = documented_commands()
    untested = [f"{c}  ({', '.join(pages)})" for c, pages in documented.items()
                if c not in TESTED_BY and c not in NOT_RUN_HERE]
    assert untested == [], "map each to the test that runs it, or to why it cannot run here"
    assert not set(TESTED_BY) & set(NOT_RUN_HERE)
    # no entry for a command the docs no longer have
    assert sorted((set(TESTED_BY) | set(NOT_RUN_HERE)) - set(documented)) == []
    assert all(reason.strip() for reason in NOT_RUN_HERE.values())


def test_every_test_named_for_a_command_exists():
    missing = []
    for test in set(TESTED_BY.values()):
        file, _, name = test.partition("::")
        source = REPO / file
        if not source.is_file() or not re.search(rf"^def {name}\(", source.read_text(), re.M):
            missing.append(test)
    assert missing == []
