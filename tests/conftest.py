"""Shared fixtures and the soak run. Test-specific fixtures belong in the test files that use them.

The default run (``uv run pytest``) deselects the tests marked ``soak`` (pyproject's ``addopts``:
``-m "not soak"``); ``uv run pytest -m soak`` runs them alone. A soak test is one of:

- a randomized long run beyond the fixed replay set (the contract checker's seeded sample;
  ``tests/contract/cases.jsonl``, every defect it found, stays in the default run);
- a benchmark smoke run (``tests/scenarios/test_bench_*.py``);
- a redundant parametrization: a value whose guarantee the default run already checks through the
  same user path. Whole tests carry ``@pytest.mark.soak`` in their files; the parametrizations are
  listed in `SOAK_PARAMS` below, each with why the default run still covers it.

The CLI runs of `tests.helpers.run_cli_process` and `tests.reliability.helpers.run_command`, the
contract checker's subprocess phases (`tests.contract.runner`) and the scripts of
`tests.helpers.run_in_own_session` (DDP rank 0; Lightning starts the other ranks fresh) are forked
from a zygote per worker that imported Lightning once (tests/zygote.py: what it mirrors and when it
starts a fresh process instead); ``LANCE_LIGHTNING_TEST_ZYGOTE=off`` starts every one fresh.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The cache directory this pytest process made for the run (`pytest_configure`).
_MADE_CACHE = pytest.StashKey[str]()
# `tests.helpers` and `examples.digits` import from the repository root, whatever the cwd.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.harness import keep_bytecode  # noqa: E402
from tests.helpers import write_dataset  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402

# Every subprocess a test starts (CLI calls, DDP ranks, workers) reuses compiled bytecode.
keep_bytecode(os.environ)

#: Parametrizations of the soak run: (test file name, test id) -> why the default run still checks
#: that guarantee. Cross products are cut to a pairwise subset: every pair of parameter values
#: still runs together in the default run; the rest of the product runs in the soak.
SOAK_PARAMS: dict[tuple[str, str], str] = {
    **{
        (
            "test_loop_semantics.py",
            f"test_a_limited_epoch_resumed_at_its_last_batch_trains_every_later_epoch_whole[{i}]",
        ): ("pairwise: the 9 kept cover every (limit, checkpoint kind, resume max_steps) pair")
        for i in (
            "with_max_steps-periodic-fraction",
            "epochs-periodic-count",
            "with_max_steps-periodic-fraction_uneven",
            "epochs-last-fraction",
            "with_max_steps-last-count",
            "epochs-last-fraction_uneven",
            "with_max_steps-saved-fraction",
            "epochs-saved-count",
            "epochs-saved-fraction_uneven",
        )
    },
    **{
        (
            "test_loop_semantics.py",
            f"test_a_max_steps_stop_resumed_under_max_epochs_trains_the_rest_of_the_stopped_epoch[{i}]",
        ): "pairwise: the 6 kept cover every (stop, max_epochs, checkpoint kind) pair"
        for i in (
            "max_steps-2-last",
            "max_time-1-last",
            "max_steps-1-saved",
            "max_time-2-saved",
            "max_steps-2-periodic",
            "max_time-1-periodic",
        )
    },
    **{
        ("test_resume_exact.py", f"test_resume_without_cursor_callback[{i}]"): (
            "pairwise: the 6 kept cover every (shuffle, filter, max_epochs) pair"
        )
        for i in (
            "shard:32:1-all-2",
            "shard:32:1-filtered-1",
            "row:2-all-1",
            "row:2-filtered-2",
            "buffer:64:16:3-all-2",
            "buffer:64:16:3-filtered-1",
        )
    },
    ("test_loop_semantics.py", "test_the_cli_resumes_a_max_steps_stop_from_last_ckpt_under_max_epochs[ddp]"): (
        "[one_process] keeps the guarantee through the CLI (step for step); 2-rank CLI fits stay in "
        "test_cli_errors.py::test_ddp_fit_from_the_cli_exits_zero, test_gpt_example.py's DDP kill and "
        "resume and the contract cases, 2-rank loop semantics in "
        "test_under_ddp_a_second_fit_and_a_fractional_limit_resume_as_an_uninterrupted_run"
    ),
    ("test_resume_interrupted.py", "test_resume_across_world_sizes[1-to-ddp2]"): (
        "[ddp2-to-1] keeps a DDP resume across world sizes (with a filter); row:2 from 1 rank to 2 is "
        "test_resume_harness.py::test_epochs_after_resume_are_whole[row:2-ranks-1-to-2]"
    ),
    ("test_ray.py", "test_ray_train_trains_every_row_once_and_resumes_exactly[checkpoint_in_config]"): (
        "[same_run] keeps the Ray Train guarantee (every row once, an exact resume); this one only "
        "hands the checkpoint over through the TorchTrainer's config"
    ),
    ("test_one_screen.py", "test_a_bad_value_is_one_screen[mixture weight -1]"): (
        "the same weight check as [mixture weight 0] (and [mixture weight nan]), through the same command"
    ),
    ("test_one_screen.py", "test_a_bad_value_is_one_screen[source version as text]"): (
        "the same LanceSource type error path (exit 2) as [source columns as a string]"
    ),
    ("test_one_screen.py", "test_a_bad_value_is_one_screen[source storage_options as a list]"): (
        "the same LanceSource type error path (exit 2) as [source columns as a string]"
    ),
}


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if (item.path.name, item.name) in SOAK_PARAMS:
            item.add_marker(pytest.mark.soak)


def pytest_configure(config: pytest.Config) -> None:
    # DataLoader workers started by forkserver/spawn import `tests.helpers` by module path.
    paths = os.environ.get("PYTHONPATH", "")
    if str(REPO_ROOT) not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), paths) if p)
    # The remote cache's default directory is under XDG_CACHE_HOME: tests never write to the user's,
    # and each pytest-xdist worker has its own (its S3 server's datasets may share names with another's).
    if "LANCE_LIGHTNING_TEST_CACHE" not in os.environ:
        import tempfile

        os.environ["LANCE_LIGHTNING_TEST_CACHE"] = tempfile.mkdtemp(prefix="lance-lightning-cache-")
        config.stash[_MADE_CACHE] = os.environ["LANCE_LIGHTNING_TEST_CACHE"]  # removed when the session ends
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    os.environ["XDG_CACHE_HOME"] = os.path.join(os.environ["LANCE_LIGHTNING_TEST_CACHE"], worker)
    # A test with num_workers > 0 follows its workers (written before the race, #51): the race's
    # outcome is forced to them, as the hand-over always did; tests/unit/load/test_race.py checks
    # the race itself, and LANCE_LIGHTNING_WORKER_CHOICE=race runs the suite with the race.
    os.environ.setdefault("LANCE_LIGHTNING_WORKER_CHOICE", "workers")
    # Fits in this process share 2 cores with the other pytest-xdist worker, where a team of OpenMP
    # threads per torch op only contends and spins; so do the fits of its subprocesses (the CLI,
    # DDP ranks, the test zygote's children: a step of the digits CNN took 0.2-0.7 s on 2 threads
    # at load 5 against 5 ms on one). tests/unit/produce/test_threads.py sets the variable itself
    # and checks in a fresh process that the package leaves the training thread's count as it
    # found it.
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_sessionfinish(session: pytest.Session) -> None:
    # The CLI tests' zygote (tests/zygote.py), if this process started one.
    if "tests.zygote" in sys.modules:
        sys.modules["tests.zygote"].stop()
    made = session.config.stash.get(_MADE_CACHE, None)  # the run's cache directory, by the process that made it
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(autouse=True)
def _import_time_variables_kept() -> Iterator[None]:
    """Each test leaves the variables modules may read at import (`tests.zygote.IMPORT_TIME`) as it
    found them. The test zygote mirrors only requests whose variables match those it started under,
    and Ray sets ``KMP_INIT_AT_FORK`` and ``PYTHONBREAKPOINT`` in the process that runs it, for good:
    every later CLI command of that pytest worker ran in a fresh interpreter, silently (and
    `tests/unit/test_zygote.py` failed whole after a Ray test on its worker)."""
    from tests.zygote import IMPORT_TIME

    before = {k: v for k, v in os.environ.items() if k.startswith(IMPORT_TIME)}
    yield
    for name in [k for k in os.environ if k.startswith(IMPORT_TIME) and k not in before]:
        del os.environ[name]
    os.environ.update(before)


@pytest.fixture
def dataset_uri(tmp_path: Path) -> str:
    """A 1000-row id/label/x/vec Lance dataset (see `tests.helpers.write_dataset`)."""
    return write_dataset(tmp_path / "ds.lance", 1000)


@pytest.fixture
def small_uri(tmp_path: Path) -> str:
    """A 100-row dataset in 4 fragments of 25 rows."""
    return write_dataset(tmp_path / "small.lance", 100, fragment_rows=25)


@pytest.fixture
def trainer_kwargs(tmp_path: Path) -> dict:
    """Quiet CPU Trainer arguments writing only under ``tmp_path``."""
    return dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """An S3-compatible server on loopback with a bucket ``data``, one per test session (a start and
    stop cost 3-11 s; the modules that use it write datasets of their own names). A module that
    stops or freezes its server defines its own (tests/unit/materialize/conftest.py)."""
    with S3Server.serving("data") as server:
        yield server
