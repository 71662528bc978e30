"""No secret anywhere: credentials in ``storage_options`` reach Lance but are never written or printed.

The end-to-end test runs ``fit``, ``validate``, ``profile`` and ``materialize`` through the CLI in
subprocesses against a real S3 server on loopback that rejects unsigned requests, then searches
every file the runs wrote (configs, checkpoints, TensorBoard and CSV logs, hparams) and
everything they printed for the secret.
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import lance
import pytest
import yaml

from lance_lightning import LanceSource
from lance_lightning.plan.filter_scan import find_matches
from lance_lightning.redaction import (
    REDACTED,
    command_secrets,
    is_secret_key,
    redact_config,
    redact_exception,
    redact_options,
    redact_text,
)
from lance_lightning.source import pin_source
from tests.helpers import RecordingModel, make_table, run_cli, run_cli_process, write_dataset
from tests.s3_server import S3Server

SECRET = "SUPERSECRET123"


class OptionsModel(RecordingModel):
    """Saves its hyperparameters, which hold storage options (as a model reading its own data would)."""

    def __init__(self, source: dict | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()


@pytest.mark.parametrize(
    "key",
    [
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "access_key_id",
        "secret_access_key",
        "session_token",
        "token",
        "password",
        "azure_storage_sas_key",
        "azure_storage_account_key",
        "azure_client_secret",
        "google_service_account_key",
        "google_service_account",
        "bearer_token",
        "AWS-Secret-Access-Key",
    ],
)
def test_secret_keys_are_recognized(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "aws_region",
        "region",
        "aws_endpoint",
        "endpoint",
        "allow_http",
        "aws_allow_http",
        "azure_storage_account_name",
        "timeout",
        "aws_virtual_hosted_style_request",
    ],
)
def test_plain_options_are_kept(key: str) -> None:
    assert not is_secret_key(key)


def test_redaction_copies_and_never_changes_the_input() -> None:
    options = {"aws_secret_access_key": SECRET, "aws_region": "us-east-1"}
    config = argparse.Namespace(
        data={"train": {"uri": "s3://b/x.lance", "storage_options": options}},
        callbacks=[{"storage_options": dict(options)}],
    )
    redacted = redact_config(config)
    assert redacted.data["train"]["storage_options"] == {"aws_secret_access_key": REDACTED, "aws_region": "us-east-1"}
    assert redacted.callbacks[0]["storage_options"]["aws_secret_access_key"] == REDACTED
    assert options["aws_secret_access_key"] == SECRET  # the live value is untouched
    assert redact_options(None) is None
    text = f"Given value: {{'storage_options': {{'aws_secret_access_key': '{SECRET}'}}}} storage_options.token={SECRET}"
    assert SECRET not in redact_text(text) and "aws_secret_access_key" in redact_text(text)


def test_repr_of_a_source_redacts_credentials() -> None:
    source = LanceSource("s3://b/x.lance", storage_options={"aws_secret_access_key": SECRET, "aws_region": "r"})
    assert SECRET not in repr(source) and "aws_region" in repr(source) and REDACTED in repr(source)


def test_url_userinfo_is_redacted_in_configs_text_and_reprs() -> None:
    endpoint = f"http://user:{SECRET}@127.0.0.1:9000"
    config = {"data": {"train": {"uri": f"s3://me:{SECRET}@b/x.lance", "storage_options": {"aws_endpoint": endpoint}}}}
    redacted = redact_config(config)
    assert redacted["data"]["train"]["uri"] == f"s3://{REDACTED}@b/x.lance"
    assert redacted["data"]["train"]["storage_options"]["aws_endpoint"] == f"http://{REDACTED}@127.0.0.1:9000"
    assert config["data"]["train"]["storage_options"]["aws_endpoint"] == endpoint  # the live value is untouched
    assert (
        redact_text(f"GET {endpoint}/b?list-type=2 failed")
        == f"GET http://{REDACTED}@127.0.0.1:9000/b?list-type=2 failed"
    )
    source = LanceSource(f"s3://me:{SECRET}@b/x.lance", storage_options={"endpoint": endpoint})
    assert SECRET not in repr(source) and "127.0.0.1:9000" in repr(source)
    assert redact_text("http://127.0.0.1:9000, mail a@b.com") == "http://127.0.0.1:9000, mail a@b.com"


def test_only_storage_options_and_userinfo_are_redacted_never_column_names_or_other_keys() -> None:
    hints = "pass fill_nulls={'tokens': <value>} to LanceDataModule; e.g. fill_nulls: {tokens: 0}, api_key=3"
    assert redact_text(hints) == hints
    config = {"fill_nulls": {"tokens": 0, "secret": 1}, "model": {"api_key": "k", "max_tokens": 5}}
    assert redact_config(config) == config


def test_inline_options_in_text_are_redacted_whatever_the_values_type() -> None:
    text = (
        f"Namespace(storage_options={{'aws_secret_access_key': ['{SECRET}'], 'aws_region': 'r'}}) "
        f'{{"storage_options": {{"aws_session_token": 12345, "aws_access_key_id": "{SECRET}"}}}} '
        f"--data.train.storage_options.aws_secret_access_key={SECRET} next"
    )
    shown = redact_text(text)
    assert SECRET not in shown and "12345" not in shown, shown
    assert "'aws_region': 'r'" in shown and shown.endswith("=<redacted> next")


def test_parser_messages_mask_the_values_a_command_line_gives(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("data: {train: {storage_options: {aws_secret_access_key: [abcd1], aws_region: us-east-1}}}\n")
    argv = ["--config", str(config), "--data.val.storage_options.aws_session_token", "9876543", "--trainer.max_steps=3"]
    assert command_secrets(argv) == {"abcd1", "9876543"}
    message = "Expected a <class 'str'>. Got value: ['abcd1']\n Got value: 9876543; max_steps 3"
    assert redact_text(message, command_secrets(argv)) == (
        "Expected a <class 'str'>. Got value: ['<redacted>']\n Got value: <redacted>; max_steps 3"
    )


def test_resume_command_redacts_the_credentials_of_the_command_line() -> None:
    from lance_lightning.cli.lightning import resume_command

    options = json.dumps({"aws_access_key_id": "AKIA" + SECRET, "aws_secret_access_key": SECRET, "aws_region": "r"})
    argv = [
        "fit",
        "--config=c.yaml",
        "--data.train.storage_options",
        options,
        f"--data.val.storage_options={{aws_secret_access_key: {SECRET}, aws_endpoint: 'http://u:{SECRET}@h:1'}}",
        f"--data.val.storage_options.aws_session_token={SECRET}",
        "--data.test.storage_options.aws_secret_access_key",
        f"[{SECRET}]",
        "--model.init_args.max_tokens=5",
        "--ckpt_path",
        "old.ckpt",
    ]
    command = resume_command(argv, "last.ckpt")
    assert SECRET not in command, command
    assert command.count(REDACTED) == 6 and "'aws_region': 'r'" not in command and '"aws_region": "r"' in command
    assert (
        "--model.init_args.max_tokens=5" in command and "old.ckpt" not in command and "http://<redacted>@h:1" in command
    )


def test_redacted_exception_chain_holds_no_credential() -> None:
    try:
        try:
            raise ValueError(f"Given value: {{'storage_options': {{'aws_secret_access_key': '{SECRET}'}}}}")
        except ValueError as inner:
            raise ValueError(f"Given value: Namespace(uri='s3://u:{SECRET}@b/x')") from inner
    except ValueError as error:
        redact_exception(error)
        text = "".join(traceback.format_exception(error))
    assert SECRET not in text and text.count(REDACTED) == 2, text


def test_parser_typo_names_the_key_and_never_prints_the_secret(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 40)
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
model:
  class_path: tests.helpers.RecordingModel
data:
  train: {{uri: {uri}, colums: [id, x], storage_options: {{aws_secret_access_key: {SECRET}}}}}
""")
    code, out, err = run_cli(["fit", "--config", str(config)])
    assert code == 2
    assert "colums" in err and SECRET not in out + err
    assert "usage:" not in err and len(err.splitlines()) < 15, err  # no usage dump


def test_a_saved_redacted_config_says_to_pass_credentials_by_environment(tmp_path: Path) -> None:
    uri = write_dataset(tmp_path / "ds.lance", 40)
    config = tmp_path / "config.yaml"
    config.write_text(f"""\
trainer: {{accelerator: cpu, max_steps: 1, logger: false, default_root_dir: {tmp_path / "root"}}}
model: {{class_path: tests.helpers.RecordingModel}}
data:
  train: {{uri: {uri}, storage_options: {{aws_secret_access_key: "{REDACTED}"}}}}
""")
    code, _, err = run_cli(["fit", "--config", str(config)])
    assert code == 1 and "train.storage_options.aws_secret_access_key" in err, err
    assert "environment" in err and "Traceback" not in err


def test_a_uri_with_userinfo_is_shown_redacted_and_opened_as_given(s3: S3Server) -> None:
    uri = "s3://data/userinfo.lance"
    lance.write_dataset(make_table(40), uri, storage_options=s3.storage_options(), mode="overwrite")
    given = uri.replace("://", f"://me:{SECRET}@")
    pinned = pin_source(LanceSource(given, filter="label < 5", storage_options=s3.storage_options()), "train")
    assert pinned.uri == uri.replace("://", f"://{REDACTED}@") and pinned.location == given
    assert SECRET not in repr(pinned) + json.dumps(pinned.identity())
    assert pinned.open().count_rows() == 40
    assert find_matches(pinned, child_from_rows=0).rows == 20  # the child process opens the given URI too


@pytest.mark.soak  # tests/reliability/test_secrets.py runs every command on S3 with planted credentials
@pytest.mark.slow
def test_cli_runs_on_s3_never_write_or_print_credentials(tmp_path: Path, s3: S3Server) -> None:
    uri = "s3://data/secrets.lance"
    lance.write_dataset(make_table(200), uri, storage_options=s3.storage_options(), max_rows_per_file=100)
    secrets = [s3.secret_key, s3.access_key]
    options = "{" + ", ".join(f"{k}: '{v}'" for k, v in s3.storage_options().items()) + "}"
    inputs, out = tmp_path / "input", tmp_path / "out"
    inputs.mkdir()
    out.mkdir()
    config = inputs / "config.yaml"
    config.write_text(f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  max_epochs: 1
  enable_progress_bar: false
  default_root_dir: {out / "root"}
  logger:
    - class_path: lightning.pytorch.loggers.TensorBoardLogger
      init_args: {{save_dir: {out / "root"}, name: tb}}
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {out / "root"}, name: csv}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{every_n_train_steps: 3, save_last: true}}
    - class_path: lance_lightning.DataCursorCheckpoint
    - class_path: lance_lightning.DataLoadingMonitor
      init_args: {{log_every_n_steps: 2}}
model:
  class_path: tests.unit.test_redaction.OptionsModel
  init_args: {{source: {{uri: {uri}, storage_options: {options}}}}}
data:
  train: {{uri: {uri}, columns: [id, x], filter: "label < 5", storage_options: {options}}}
  val: {{uri: {uri}, columns: [id, x], filter: "label >= 5", storage_options: {options}}}
  batch_size: 16
""")
    printed = []
    code, text = run_cli_process(["fit", "--config", str(config)], out)
    printed.append(text)
    assert code == 0, text[-3000:]
    checkpoints = sorted((out / "root").rglob("last.ckpt"))
    assert checkpoints, text[-3000:]
    code, text = run_cli_process(["validate", "--config", str(config), "--ckpt_path", str(checkpoints[0])], out)
    printed.append(text)
    assert code == 0, text[-3000:]
    code, text = run_cli_process(["fit", "--config", str(config), "--print_config"], out)
    printed.append(text)
    assert code == 0 and REDACTED in text, text[-3000:]
    code, text = run_cli_process(["profile", "--config", str(config), "--batches", "5", "--progress", "false"], out)
    printed.append(text)
    assert code == 0 and "Loader-only profile" in text, text[-3000:]
    code, text = run_cli_process(
        [
            "materialize",
            "--uri",
            uri,
            "--out-dir",
            str(out / "views"),
            *(f"--storage-option={k}={v}" for k, v in s3.storage_options().items()),
        ],
        out,
    )
    printed.append(text)
    assert code == 0 and "view:" in text, text[-3000:]

    written = [p for p in out.rglob("*") if p.is_file()]
    kinds = {p.name.split(".")[0] if p.suffix != ".ckpt" else "ckpt" for p in written}
    assert {"config", "hparams", "metrics", "events", "ckpt"} <= kinds, sorted(kinds)
    saved = yaml.safe_load(next(p for p in written if p.name == "config.yaml").read_text())
    assert saved["data"]["train"]["storage_options"]["aws_secret_access_key"] == REDACTED
    hparams = yaml.safe_load(next(p for p in written if p.name == "hparams.yaml").read_text())
    assert hparams["source"]["storage_options"]["aws_secret_access_key"] == REDACTED
    for secret in secrets:
        assert not [p for p in written if secret.encode() in p.read_bytes()], f"{secret!r} written to disk"
        assert not [t for t in printed if secret in t], f"{secret!r} printed"
