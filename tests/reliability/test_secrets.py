"""Nothing leaks: credentials planted everywhere a user can put them are never printed or written.

Recognizable fake credentials (and the S3 server's real ones, which the working runs need) are
given through YAML ``storage_options`` (a plain source and every source of a mixture), the command
line (a JSON mapping, a dotted key), environment variables, URL userinfo (endpoints and URIs) and
values of the wrong type (a list, a number). The commands (``fit``, ``validate``, ``predict``,
``profile``, ``materialize``, ``--print_config``) and the error paths (wrong types, a bad mixture
value, a missing bucket, refused credentials) run through the CLI, in subprocesses against a real
S3 server on loopback (parser errors in process), and every byte printed and every file written
(configs, hparams, checkpoints also as loaded objects, logs, views) is searched for each value.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import lance
import pytest
import torch

from lance_lightning.redaction import REDACTED
from tests.helpers import make_table, run_cli, run_cli_process
from tests.s3_server import S3Server, environment_credentials

ACCESS_KEY = "AKIAFAKEACCESS1234"
SECRET_KEY = "fake-secret-key-xyz"
SESSION_TOKEN = "fake-session-token"
PASSWORD = "fakepass"  # in URLs as user:fakepass@
LISTED = "fake-listed-secret"  # a credential given as a list
NUMBER = 987654321987  # a credential given as a number
ENV_ACCESS_KEY, ENV_SECRET_KEY, ENV_TOKEN = "AKIAFAKEENVACCESS99", "fake-env-secret-key", "fake-env-session-token"
FAKES = (
    ACCESS_KEY,
    SECRET_KEY,
    SESSION_TOKEN,
    PASSWORD,
    LISTED,
    str(NUMBER),
    ENV_ACCESS_KEY,
    ENV_SECRET_KEY,
    ENV_TOKEN,
)
FAKE_OPTIONS = {
    "aws_access_key_id": ACCESS_KEY,
    "aws_secret_access_key": SECRET_KEY,
    "aws_session_token": SESSION_TOKEN,
}
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": ENV_ACCESS_KEY,
    "AWS_SECRET_ACCESS_KEY": ENV_SECRET_KEY,
    "AWS_SESSION_TOKEN": ENV_TOKEN,
}


def leaks(values: Iterable[str], printed: Iterable[str], roots: Iterable[Path]) -> list[str]:
    """Where any of ``values`` shows: in ``printed`` text, in the bytes of a file under ``roots``,
    or in a checkpoint loaded with ``torch.load``."""
    found = [f"{value!r} printed" for value in values if any(value in text for text in printed)]
    for path in (path for root in roots if root.exists() for path in sorted(root.rglob("*")) if path.is_file()):
        loaded = repr(torch.load(path, map_location="cpu", weights_only=False)) if path.suffix == ".ckpt" else ""
        found += [f"{value!r} in {path}" for value in values if value.encode() in path.read_bytes() or value in loaded]
    return found


def _options(s3: S3Server, **extra: object) -> dict:
    """The server's working options, its endpoint given with a user and password (Lance ignores them)."""
    return {**s3.storage_options(), "aws_endpoint": s3.endpoint.replace("://", f"://user:{PASSWORD}@"), **extra}


def _flow(options: dict) -> str:
    return json.dumps(options)  # JSON is YAML flow style


@pytest.fixture(scope="module")
def uris(s3: S3Server) -> tuple[str, str]:
    """Two tiny datasets on the server (a mixture's sources), the second read through a URI with userinfo."""
    for name, start in (("a", 0), ("b", 1000)):
        lance.write_dataset(
            make_table(48, start=start), f"s3://data/{name}.lance", storage_options=s3.storage_options()
        )
    return "s3://data/a.lance", f"s3://user:{PASSWORD}@data/b.lance"


def _config(path: Path, root: Path, train: str, extra: str = "") -> Path:
    path.write_text(f"""\
seed_everything: 0
trainer:
  accelerator: cpu
  max_steps: 4
  enable_progress_bar: false
  enable_model_summary: false
  default_root_dir: {root}
  logger:
    - class_path: lightning.pytorch.loggers.TensorBoardLogger
      init_args: {{save_dir: {root}, name: tb}}
    - class_path: lightning.pytorch.loggers.CSVLogger
      init_args: {{save_dir: {root}, name: csv}}
  callbacks:
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{every_n_train_steps: 2, save_last: true}}
    - class_path: lance_lightning.DataCursorCheckpoint
    - class_path: lance_lightning.DataLoadingMonitor
      init_args: {{log_every_n_steps: 2}}
{extra}data:
  train:
{train}  batch_size: 8
""")
    return path


def _mixture(sources: list[str], weights: str = "[1, 1]") -> str:
    listed = "".join(f"        - {source}\n" for source in sources)
    return f"""\
    class_path: lance_lightning.LanceMixture
    init_args:
      sources:
{listed}      weights: {weights}
      block: 8
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_command_on_s3_never_prints_or_writes_a_planted_credential(
    tmp_path: Path, s3: S3Server, uris: tuple[str, str]
) -> None:
    a, b = uris
    real = _options(s3)
    inputs, out = tmp_path / "input", tmp_path / "out"
    inputs.mkdir()
    out.mkdir()
    model = f"""\
model:
  class_path: tests.unit.test_redaction.OptionsModel
  init_args: {{source: {{uri: {b}, storage_options: {_flow(real)}}}}}
"""
    train = _mixture(
        [
            f"{{uri: {a}, columns: [id, x], storage_options: {_flow(real)}}}",
            f"{{uri: {b}, columns: [id, x], storage_options: {_flow(real)}}}",
        ]
    )
    config = _config(inputs / "config.yaml", out / "root", train, model)
    config.write_text(
        config.read_text()
        + f"  val: {{uri: {b}, columns: [id, x]}}\n"
        + f"  predict: {{uri: {a}, columns: [id, x], storage_options: {_flow(real)}}}\n"
    )
    without_secret = {k: v for k, v in real.items() if k != "aws_secret_access_key"}
    command_line = [
        "--data.val.storage_options",
        json.dumps(without_secret),
        f"--data.val.storage_options.aws_secret_access_key={s3.secret_key}",
    ]
    printed = []

    def run(args: list[str], env: dict | None = None) -> str:
        code, text = run_cli_process(args, out, env)
        printed.append(text)
        assert code == 0, text[-3000:]
        return text

    fitted = run(["fit", "--config", str(config), *command_line])
    assert f"resume with: lance-lightning fit --config {config} --data.val.storage_options" in fitted, fitted[-2000:]
    resume = next(line for line in fitted.splitlines() if line.startswith("resume with:"))
    assert resume.count(REDACTED) == 3, resume  # the key id and endpoint userinfo of the JSON, the dotted secret
    last = sorted((out / "root").rglob("last.ckpt"))[0]
    run(["validate", "--config", str(config), *command_line, "--ckpt_path", str(last)])
    run(["predict", "--config", str(config), *command_line, "--ckpt_path", str(last)])
    env_config = _config(inputs / "env.yaml", out / "env", f"    uri: {b}\n    columns: [id, x]\n")
    from_environment = {**environment_credentials(s3), "AWS_ENDPOINT": real["aws_endpoint"]}
    assert "Loader-only profile" in run(
        ["profile", "--config", str(env_config), "--batches", "3", "--progress", "false"], from_environment
    )
    options = [f"--storage-option={k}={v}" for k, v in real.items()]
    assert "view:" in run(["materialize", "--uri", b, "--out-dir", str(out / "views"), *options])
    shown = run(
        [
            "fit",
            "--config",
            str(config),
            *command_line,
            "--data.test.uri=s3://data/a.lance",
            f"--data.test.storage_options={json.dumps(FAKE_OPTIONS)}",
            "--print_config",
        ],
        FAKE_ENV,
    )
    assert shown.count(REDACTED) >= 15 and "aws_region: us-east-1" in shown, shown

    kinds = {p.name.split(".")[0] if p.suffix != ".ckpt" else "ckpt" for p in out.rglob("*") if p.is_file()}
    assert {"config", "hparams", "metrics", "events", "ckpt"} <= kinds, sorted(kinds)
    planted = [*FAKES, s3.access_key, s3.secret_key]
    assert not leaks(planted, printed, [out]), leaks(planted, printed, [out])


@pytest.mark.parametrize(
    "where",
    [
        "yaml_list",
        "yaml_number",
        "command_line_dotted_list",
        "command_line_json_number",
    ],
)
def test_a_credential_of_the_wrong_type_is_never_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    for name, value in FAKE_ENV.items():
        monkeypatch.setenv(name, value)
    options = {
        "yaml_list": {**FAKE_OPTIONS, "aws_secret_access_key": [LISTED]},
        "yaml_number": {**FAKE_OPTIONS, "aws_session_token": NUMBER},
    }.get(where, FAKE_OPTIONS)
    options = {**options, "aws_endpoint": f"http://user:{PASSWORD}@127.0.0.1:9"}
    config = _config(
        tmp_path / "config.yaml",
        tmp_path / "root",
        f"    uri: s3://user:{PASSWORD}@data/x.lance\n    storage_options: {_flow(options)}\n",
        "model: {class_path: tests.helpers.RecordingModel}\n",
    )
    extra = {
        "command_line_dotted_list": [f"--data.train.storage_options.aws_secret_access_key=[{LISTED}]"],
        "command_line_json_number": ["--data.train.storage_options", json.dumps({"aws_session_token": NUMBER})],
    }.get(where, [])
    code, out, err = run_cli(["fit", "--config", str(config), *extra])
    assert code == 2 and "storage_options" in err, err
    assert not leaks(FAKES, [out, err], [tmp_path / "root"]), err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_error_paths_on_s3_never_print_a_planted_credential(
    tmp_path: Path, s3: S3Server, uris: tuple[str, str]
) -> None:
    a, b = uris
    real, fake = _options(s3), _options(s3, **FAKE_OPTIONS)
    model = "model: {class_path: tests.helpers.RecordingModel}\n"
    inputs, out = tmp_path / "input", tmp_path / "out"
    inputs.mkdir()
    out.mkdir()
    printed = []

    def run(name: str, train: str, expected: str, env: dict | None = None) -> None:
        config = _config(inputs / f"{name}.yaml", out / name, train, model)
        code, text = run_cli_process(["fit", "--config", str(config)], out, env)
        printed.append(text)
        assert code != 0 and expected in text, text[-3000:]

    bad_mixture = _mixture(
        [f"{{uri: {a}, storage_options: {_flow(fake)}}}", f"{{uri: {b}, storage_options: {_flow(fake)}}}"], "[1, -1]"
    )
    run("mixture", bad_mixture, "weights[1]")
    run("bucket", f"    uri: s3://user:{PASSWORD}@nobucket/x.lance\n    storage_options: {_flow(real)}\n", "nobucket")
    run("refused", f"    uri: {a}\n    storage_options: {_flow(fake)}\n", "refused access")
    no_credentials = {k: v for k, v in real.items() if k not in ("aws_access_key_id", "aws_secret_access_key")}
    run("environment", f"    uri: {b}\n    storage_options: {_flow(no_credentials)}\n", "refused access", FAKE_ENV)
    options = [f"--storage-option={k}={v}" for k, v in fake.items()]
    code, text = run_cli_process(["materialize", "--uri", b, "--out-dir", str(out / "views"), *options], out)
    printed.append(text)
    assert code == 1 and "refused access" in text, text[-3000:]
    assert not leaks([*FAKES, s3.access_key, s3.secret_key], printed, [out]), printed
