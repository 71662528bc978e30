"""Bad `LanceMixture` input fails in the main process, before training, with a `ConfigError`
naming the parameter, the value and the fix: weights (count, sign, size for the block), names,
the epoch rule, mismatched columns or types, a mixture outside the train split, and settings a
mixture does not support."""

from __future__ import annotations

import lance
import pyarrow as pa
import pytest

from lance_lightning import ConfigError, LanceDataModule, LanceMixture, LanceSource, MaterializedView
from lance_lightning.produce.badrows import ReplaceBadRow
from tests.helpers import make_table, write_dataset


@pytest.fixture
def uris(tmp_path) -> tuple[str, str]:
    return write_dataset(tmp_path / "a.lance", 200), write_dataset(tmp_path / "b.lance", 100)


def _sources(uris: tuple[str, ...], columns: list[str] | None = None) -> list[LanceSource]:
    return [LanceSource(uri, columns=columns or ["id", "x"]) for uri in uris]


@pytest.mark.parametrize(
    ("kwargs", "param", "shown"),
    [
        ({"weights": [1.0]}, "weights", "[1.0]"),
        ({"weights": [1.0, 2.0, 3.0]}, "weights", "[1.0, 2.0, 3.0]"),
        ({"weights": [1.0, -0.5]}, "weights[1]", "-0.5"),
        ({"weights": [0, 1.0]}, "weights[0]", "0"),
        ({"weights": [1.0, float("nan")]}, "weights[1]", "nan"),
        ({"weights": [1.0, 1e-9]}, "weights[1]", "1e-09"),
        ({"weights": [1, 1], "names": ["a"]}, "names", "['a']"),
        ({"weights": [1, 1], "names": ["a", "a"]}, "names", "['a', 'a']"),
        ({"weights": [1, 1], "epoch": "longest"}, "epoch", "longest"),
        ({"weights": [1, 1], "epoch": "samples"}, "samples", "None"),
        ({"weights": [1, 1], "samples": 10}, "samples", "10"),
        ({"weights": [1, 1], "block": 1}, "block", "1"),
    ],
)
def test_bad_arguments_name_the_parameter(uris, kwargs, param, shown):
    with pytest.raises(ConfigError) as info:
        LanceMixture(_sources(uris), **kwargs)
    assert info.value.param == param
    assert shown in str(info.value) and "Fix:" in str(info.value)


def test_an_empty_source_list_is_refused():
    with pytest.raises(ConfigError) as info:
        LanceMixture([], weights=[])
    assert info.value.param == "sources"


def test_mismatched_columns_are_refused_at_setup(uris):
    dm = LanceDataModule(
        train=LanceMixture([LanceSource(uris[0], ["id", "x"]), LanceSource(uris[1], ["id", "label"])], [1, 1]),
        batch_size=10,
    )
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    assert info.value.param == "train.sources[1].columns"
    assert "label: int64" in str(info.value) and "x: float" in str(info.value)


def test_mismatched_types_are_refused_at_setup(tmp_path, uris):
    other = str(tmp_path / "c.lance")
    table = make_table(100)
    lance.write_dataset(table.set_column(2, "x", table["x"].cast(pa.float64())), other)
    dm = LanceDataModule(train=LanceMixture(_sources((uris[0], other)), [1, 1]), batch_size=10)
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    assert info.value.param == "train.sources[1].columns" and "double" in str(info.value)


def test_a_source_too_small_for_a_whole_block(uris):
    dm = LanceDataModule(train=LanceMixture(_sources(uris), [1, 1], block=1000), batch_size=10)
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    assert info.value.param == "block" and "source1" in str(info.value)


def test_a_bad_source_is_named_by_its_index(uris, tmp_path):
    dm = LanceDataModule(train=LanceMixture(_sources((uris[0], str(tmp_path / "missing.lance"))), [1, 1]))
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    assert info.value.param.startswith("train.sources[1]")


def test_only_the_train_split_can_be_a_mixture(uris):
    with pytest.raises(ConfigError) as info:
        LanceDataModule(train=LanceSource(uris[0]), val=LanceMixture(_sources(uris), [1, 1]))
    assert info.value.param == "val"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"bad_rows": ReplaceBadRow()}, "bad_rows"), ({"materialize": "view"}, "materialize")],
)
def test_unsupported_settings_are_refused_when_the_data_module_is_made(uris, tmp_path, kwargs, param):
    if param == "materialize":
        kwargs = {"materialize": MaterializedView(str(tmp_path / "views"))}
    with pytest.raises(ConfigError) as info:
        LanceDataModule(train=LanceMixture(_sources(uris), [1, 1], block=10), batch_size=10, **kwargs)
    assert info.value.param == param


def test_a_source_column_named_source_is_refused(tmp_path):
    uris = [write_dataset(tmp_path / f"{n}.lance", 100, extra={"source": list(range(100))}) for n in "ab"]
    dm = LanceDataModule(train=LanceMixture(_sources(uris, ["id", "source"]), [1, 1], block=10), batch_size=10)
    with pytest.raises(ConfigError) as info:
        dm.setup("fit")
    assert info.value.param == "train.sources[0].columns" and "'source'" in str(info.value)


_STAGES = [{"until_sample": 100, "weights": [1, 0]}, {"weights": [1, 1]}]


@pytest.mark.parametrize(
    ("kwargs", "param", "shown"),
    [
        ({"schedule": [{"until_sample": 10, "weights": [1]}, {"weights": [1, 1]}]}, "schedule[0].weights", "[1]"),
        ({"schedule": [{"until_sample": 10, "weights": [1, -1]}, {"weights": [1, 1]}]}, "schedule[0].weights[1]", "-1"),
        ({"schedule": [{"until_sample": 10, "weights": [1, 1]}, {"weights": [0, 0]}]}, "schedule[1].weights", "[0, 0]"),
        (
            {"schedule": [{"until_sample": 10, "weights": [1, float("inf")]}, {"weights": [1, 1]}]},
            "schedule[0].weights[1]",
            "inf",
        ),
        (
            {
                "schedule": [
                    {"until_sample": 50, "weights": [1, 0]},
                    {"until_sample": 50, "weights": [1, 1]},
                    {"weights": [0, 1]},
                ]
            },
            "schedule[1].until_sample",
            "50",
        ),
        (
            {
                "schedule": [
                    {"until_step": 9, "weights": [1, 0]},
                    {"until_step": 4, "weights": [1, 1]},
                    {"weights": [0, 1]},
                ],
                "step_samples": 10,
            },
            "schedule[1].until_step",
            "4",
        ),
        ({"schedule": [{"until_step": 10, "weights": [1, 0]}, {"weights": [1, 1]}]}, "step_samples", "None"),
        (
            {"schedule": [{"until_sample": 10, "weights": [1, 0]}, {"until_sample": 20, "weights": [1, 1]}]},
            "schedule[1].until_sample",
            "20",
        ),
        ({"schedule": [{"weights": [1, 0]}, {"weights": [1, 1]}]}, "schedule[0]", "weights"),
        ({"schedule": [{"until": 10, "weights": [1, 0]}, {"weights": [1, 1]}]}, "schedule[0]", "until"),
        ({"schedule": []}, "schedule", "[]"),
        ({"schedule": _STAGES, "interpolate": "cubic"}, "interpolate", "cubic"),
        ({"schedule": _STAGES, "weights": [1, 1]}, "weights", "[1, 1]"),
        ({"schedule": _STAGES, "on_schedule_change": "ignore"}, "on_schedule_change", "ignore"),
        ({"weights": [1, 1], "interpolate": "linear"}, "interpolate", "linear"),
        ({"weights": [1, 1], "step_samples": 8}, "step_samples", "8"),
        ({}, "weights", "None"),
    ],
)
def test_bad_schedules_name_the_field(uris, kwargs, param, shown):
    kwargs = {"epoch": "samples", "samples": 500, **kwargs}
    with pytest.raises(ConfigError) as info:
        LanceMixture(_sources(uris), **kwargs)
    assert info.value.param == param
    assert shown in str(info.value) and "Fix:" in str(info.value)


def test_a_schedule_needs_the_samples_epoch_rule(uris):
    with pytest.raises(ConfigError) as info:
        LanceMixture(_sources(uris), schedule=_STAGES)  # epoch="first_exhausted" by default
    assert info.value.param == "schedule"
    assert 'epoch="samples"' in info.value.problem and 'epoch="samples"' in info.value.fix


def test_a_valid_schedule_is_kept_in_samples(uris):
    stages = [
        {"until_step": 10, "weights": [0.9, 0.1]},
        {"until_sample": 500, "weights": [0.5, 0.5]},
        {"weights": [0, 1]},
    ]
    mixture = LanceMixture(_sources(uris), epoch="samples", samples=400, schedule=stages, step_samples=32)
    assert mixture.parsed_schedule is not None and mixture.parsed_schedule.ends == (320, 500)
    assert mixture.schedule == stages and mixture.weights is None  # as given, for the hyperparameters
    again = mixture.at_versions([1, 1])
    assert again.parsed_schedule == mixture.parsed_schedule and [s.version for s in again.sources] == [1, 1]
    assert "schedule=" in repr(mixture)
