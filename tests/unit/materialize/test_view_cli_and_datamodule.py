"""``lance-lightning materialize`` prints only the view's path with ``--quiet``, reuses an unchanged
view, exits 1 or 2 with a message naming the bad setting and leaves nothing behind, and reads S3 with
storage options it never prints; ``LanceDataModule(materialize=...)`` trains from the view and reuses it,
reopens only complete views of its cache dir, resumes from the checkpoint's view after the source moved
on, rejects bad settings, and takes its settings from a YAML config.

Everything is real: Lance datasets in ``tmp_path`` or on a moto S3 server (loopback), the command line
in process, a real Trainer.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lance
import pytest
import torch
import yaml

from lance_lightning import ConfigError, LanceDataModule, LanceSource, MaterializedView, RowShuffle
from lance_lightning.materialize.view import materialize_view
from tests.harness import ckpt_file, fit
from tests.helpers import append_rows, flat, run_cli
from tests.s3_server import S3Server
from tests.unit.materialize.view_helpers import COLUMNS, FILTER, expected_ids, ids, leftovers, snapshot


def run_materialize(args: list[str]) -> tuple[int, str, str]:
    """``lance-lightning materialize ARGS`` in process: (exit status, stdout, stderr)."""
    return run_cli(["materialize", *args])


# -- 1. the command line -----------------------------------------------------------------------------
def test_cli_quiet_prints_only_the_path_and_reuses(tmp_path: Path, source_uri: str) -> None:
    args = [
        "--uri",
        source_uri,
        "--out-dir",
        str(tmp_path / "views"),
        "--columns",
        "id",
        "x",
        "--filter",
        FILTER,
        "--shuffle-seed",
        "3",
        "--chunk-rows",
        "300",
    ]
    code, out, err = run_materialize([*args, "--quiet"])
    assert code == 0 and err == ""
    view = out.strip()
    assert out == view + "\n" and Path(view).is_dir() and Path(view).parent == tmp_path / "views"
    assert sorted(ids(view)) == expected_ids(FILTER)
    code, out, err = run_materialize(args)
    assert code == 0 and f"view: {view}" in out and "reused (source version unchanged)" in out
    assert "rows: 800" in out and err == "", "a reused view commits nothing, so no progress lines"


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--uri", "{tmp}/nope.lance"], 1, "`materialize.uri`='{tmp}/nope.lance': no Lance dataset exists there"),
        (["--uri", "{src}", "--columns", "id", "nope"], 1, "column(s) ['nope'] are not in the dataset"),
        (["--uri", "{src}", "--filter", "label <"], 1, "`materialize.filter`='label <': Lance cannot run this filter"),
        (
            ["--uri", "{src}", "--filter", "label > 100"],
            1,
            "`materialize.filter`='label > 100': matches no rows of {src} (version 1), so the view would be empty",
        ),
        (["--uri", "{src}", "--version", "9"], 1, "`materialize.version`=9: that version does not exist"),
        (["--uri", "{src}", "--chunk-rows", "0"], 1, "`materialize.chunk_rows`=0: must be an integer >= 1"),
        (["--uri", "{src}", "--shuffle-seed", "-1"], 1, "`materialize.shuffle_seed`=-1: must be an integer >= 0"),
        (["--uri", "{src}", "--storage-option", "region"], 2, "--storage-option 'region' must be KEY=VALUE"),
        ([], 2, "the following arguments are required: --uri"),
    ],
    ids=[
        "missing-uri",
        "missing-column",
        "bad-sql",
        "zero-match",
        "no-version",
        "chunk-rows",
        "seed",
        "option",
        "usage",
    ],
)
def test_cli_errors_and_exit_codes(tmp_path: Path, source_uri: str, args: list[str], code: int, text: str) -> None:
    fill = {"tmp": str(tmp_path), "src": source_uri}
    got, out, err = run_materialize([a.format(**fill) for a in args] + ["--out-dir", str(tmp_path / "views")])
    assert got == code, err
    assert text.format(**fill) in err, err
    assert out == ""
    assert not (tmp_path / "views").exists() or leftovers(tmp_path / "views") == []


def test_cli_help_exits_zero() -> None:
    code, out, _ = run_materialize(["--help"])
    assert code == 0 and "--chunk-rows" in out and "--storage-option" in out


def test_cli_reads_s3_with_storage_options_and_never_prints_them(tmp_path: Path, s3: S3Server, s3_uri: str) -> None:
    options = [f"--storage-option={k}={v}" for k, v in s3.storage_options().items()]
    code, out, err = run_materialize(
        ["--uri", s3_uri, "--out-dir", str(tmp_path / "views"), "--filter", FILTER, *options]
    )
    assert code == 0, err
    assert s3.secret_key not in out + err and s3.access_key not in out + err
    view = out.split("view: ")[1].split()[0]
    assert ids(view) == expected_ids(FILTER)
    wrong = [o for o in options if "secret" not in o] + ["--storage-option=aws_secret_access_key=wrong-secret-42"]
    code, _, err = run_materialize(["--uri", s3_uri, "--out-dir", str(tmp_path / "views"), *wrong])
    assert code == 1 and f"`materialize.uri`='{s3_uri}'" in err and "wrong-secret-42" not in err, err


# -- 2. the data module ------------------------------------------------------------------------------
def test_datamodule_trains_from_the_view_and_reuses_it(
    tmp_path: Path, source_uri: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "views"

    def make() -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(source_uri, columns=COLUMNS, filter=FILTER),
            val=LanceSource(source_uri, columns=COLUMNS, filter="label >= 8"),
            batch_size=16,
            materialize=MaterializedView(cache_dir=str(cache), shuffle_seed=3, splits=["train"]),
        )

    caplog.set_level(logging.INFO, logger="lance_lightning.materialize.view")
    dm = make()
    first = fit(tmp_path, dm, name="a")
    views = list(cache.glob("*.lance"))
    assert len(views) == 1
    view = str(views[0])
    assert dm.plans["train"].source.uri == view and view in dm.explain("train")
    assert dm.plans["val"].source.uri == source_uri, "splits=['train'] leaves val on the source"
    assert flat(first.seen) == ids(view)[: 800 // 16 * 16], "training did not read the view in its order"
    assert "made in" in caplog.text
    created = json.loads(Path(view).with_suffix(".json").read_text())["created"]
    files = snapshot(cache)

    caplog.clear()
    dm = make()
    second = fit(tmp_path, dm, name="b")
    assert dm.plans["train"].source.uri == view
    assert "reused" in caplog.text and "made in" not in caplog.text
    assert json.loads(Path(view).with_suffix(".json").read_text())["created"] == created
    assert snapshot(cache) == files, "the second run wrote into the cache"
    assert second.seen == first.seen


def test_reopen_finds_only_complete_views_of_its_cache_dir(tmp_path: Path, source_uri: str) -> None:
    config = MaterializedView(cache_dir=str(tmp_path / "views"))
    made = materialize_view(LanceSource(source_uri, columns=COLUMNS), config.cache_dir)
    assert config.reopen(made.uri) == LanceSource(uri=made.uri, columns=COLUMNS)
    assert config.reopen(str(tmp_path / "views" / "0123456789abcdef0123.lance")) is None
    assert config.reopen(source_uri) is None, "a dataset outside cache_dir is not a view"
    assert MaterializedView(cache_dir=str(tmp_path / "other")).reopen(made.uri) is None
    Path(made.uri).with_suffix(".json").unlink()
    assert config.reopen(made.uri) is None, "a view without its manifest is not complete"


def test_resume_after_the_source_moved_on_reads_the_checkpoint_view(tmp_path: Path, source_uri: str) -> None:
    """The checkpoint's cursor was read from the view of version 1; the source is at version 3 now.

    Exact resume needs the old view (kept in cache_dir), as a plain source re-pins its old version.
    Needs `LanceDataModule.load_state_dict` to re-plan train from
    ``self.materialize.reopen(cursor["plan"]["uri"])`` when that differs from the current plan's URI.
    """

    def make() -> LanceDataModule:
        return LanceDataModule(
            train=LanceSource(source_uri, columns=COLUMNS, filter=FILTER),
            batch_size=16,
            shuffle=RowShuffle(seed=2),
            materialize=MaterializedView(cache_dir=str(tmp_path / "v")),
        )

    k = 20
    whole = fit(tmp_path, make(), name="whole")
    first = fit(tmp_path, make(), name="first", max_steps=k, ckpt_every=k)
    old_view = next((tmp_path / "v").glob("*.lance"))
    append_rows(source_uri, 300)
    lance.dataset(source_uri).delete("id < 50")
    dm = make()
    rest = fit(tmp_path, dm, name="rest", ckpt_path=ckpt_file(tmp_path, "first", k))
    assert dm.plans["train"].source.uri == str(old_view)
    assert first.seen + rest.seen == whole.seen


def test_datamodule_rejects_bad_materialize_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`materialize.cache_dir`='s3://bucket/views': views are written to local"):
        MaterializedView(cache_dir="s3://bucket/views")
    with pytest.raises(ConfigError, match=r"`materialize.splits`=\['training'\]: splits must be among"):
        MaterializedView(cache_dir=str(tmp_path), splits=["training"])


def test_yaml_config_with_materialize(tmp_path: Path, source_uri: str) -> None:
    cache = tmp_path / "views"
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer:
  accelerator: cpu
  max_steps: 3
  logger: false
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {tmp_path / "root"}
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {source_uri}, columns: [id, x], filter: "{FILTER}"}}
  batch_size: 16
  materialize: {{cache_dir: {cache}, shuffle_seed: 5, chunk_rows: 256}}
""")
    code, printed, err = run_cli(["fit", "--config", str(config), "--print_config"])
    assert code == 0, err
    assert yaml.safe_load(printed)["data"]["materialize"] == {
        "cache_dir": str(cache),
        "shuffle_seed": 5,
        "splits": None,
        "chunk_rows": 256,
        "verify": "stat",
    }
    code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 0, err
    views = list(cache.glob("*.lance"))
    assert len(views) == 1 and json.loads(views[0].with_suffix(".json").read_text())["shuffle_seed"] == 5
    checkpoint = next((tmp_path / "root" / "checkpoints").glob("*.ckpt"))
    cursor = torch.load(checkpoint, weights_only=True)["LanceDataModule"]["train_cursor"]
    assert cursor["plan"]["uri"] == str(views[0]) and cursor["steps"] == 3
