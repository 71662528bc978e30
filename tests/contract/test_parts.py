"""Issue #50's parts of the contract checker (`tests.contract.parts`): what the generator draws, a
seeded sample of them (soak), and the oracles' own tests. Every defect of issue #50 is a replayed
case (``issue50-*`` in ``cases.jsonl``, run by `tests.contract.test_contract.test_found_defect`).

- `test_parts_draw_every_dimension`: over 600 seeds, the drawn parts cover every prepare format,
  blob members, more units than twice the workers, every kill moment, a truncated JPEG, a fit and
  a predict of the prepared dataset, every format from every input location (a local folder, its
  ``file://`` URI, an S3 prefix) and a prepare from S3 killed at every moment; every per-row random
  transform, both bad-row policies, filters, deletions, workers, 2 ranks, a kill on rank 0 and on
  rank 1, every rerun, a second predict, a train shuffle set; video and audio clips from every
  file of the media corpus.
- `test_parts_sample` (``-m soak``): scenarios of `PART_SEEDS`, only their parts (``fit=False``;
  `tests.contract.test_contract.test_sample` runs parts composed with fits).
- `test_*_oracle_reports_*`: each oracle reports what a wrong result would look like (a scrambled
  column, a missing or kept bad file, a credential of an S3 input printed or left in the dataset;
  two models' outputs, another random value, a value outside the split; a window one sample or
  one frame off), so a green case is not an oracle missing it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.contract.media_draws import AUDIOS, VIDEOS, Media, expected_clips
from tests.contract.oracle import check
from tests.contract.prepare_draws import FORMATS, LOCATIONS, Ingest, compare, expected_rows, units, write_input
from tests.contract.runner import run_scenario
from tests.contract.scenario import generate
from tests.contract.writer_draws import Writing, check_rows, split_ids

MOMENTS = ("commit", "write", "rename")
RANDOMS = ("none", "rowrandom", "flip", "augment")
#: Seeds whose parts draw each folder format, webdataset blobs, parquet, a truncated JPEG, kills at each
#: moment, 2-rank predicts killed on rank 1 and on rank 0, each rerun, a second predict, video and audio clips.
PART_SEEDS = [0, 1, 2, 8, 13, 19, 23, 26, 33, 37, 57]


def _parts(seeds: range) -> tuple[list[Ingest], list[Writing], list[Media]]:
    scenarios = [generate(seed) for seed in seeds]
    return (
        [s.ingest for s in scenarios if s.ingest is not None],
        [s.writing for s in scenarios if s.writing is not None],
        [s.media for s in scenarios if s.media is not None],
    )


def test_parts_draw_every_dimension() -> None:
    ingests, writings, medias = _parts(range(600))
    covered = {
        **{f"prepare {fmt}": any(i.format == fmt for i in ingests) for fmt in ("imagefolder", "videofolder",
                                                                               "audiofolder", "webdataset", "parquet")},
        "blob members of 1 MiB": any(i.big and i.format == "webdataset" for i in ingests),
        "units > 2 x workers": any(units(i) > 2 * i.workers for i in ingests),
        "units <= workers": any(units(i) <= i.workers for i in ingests),
        **{f"prepare killed at {m}": any((i.kill or "").startswith(m) for i in ingests) for m in MOMENTS},
        "truncated JPEG": any(i.truncated for i in ingests),
        "prepare, then fit and predict": any(i.then for i in ingests),
        **{f"prepare {fmt} from {where}": any(i.format == fmt and i.location == where for i in ingests)
           for fmt in FORMATS for where in LOCATIONS},
        **{f"prepare from S3 killed at {m}": any(i.location == "s3" and (i.kill or "").startswith(m) for i in ingests)
           for m in MOMENTS},
        "predict with a train shuffle set": any(w.shuffle != "none" for w in writings),
        **{f"predict {kind}": any(w.random == kind for w in writings) for kind in RANDOMS},
        **{f"bad rows {policy}": any(w.bad == policy for w in writings) for policy in ("raise", "replace")},
        "predict filter": any(w.filter for w in writings),
        "predict deletions": any(w.delete_mod for w in writings),
        "predict workers": any(w.num_workers for w in writings),
        "predict 2 ranks": any(w.world_size == 2 for w in writings),
        "kill rank 1": any(w.kill_rank == 1 for w in writings),
        **{f"rerun {r}": any(w.kill_rank is not None and w.rerun == r for w in writings) for r in
           ("same", "rewritten", "other_model")},
        "second predict": any(w.second for w in writings),
        "run_dir default": any(not w.run_dir_outside for w in writings),
        **{f"clips of {name}": any(name in m.names for m in medias) for name in VIDEOS + AUDIOS},
        "audio at the file's own rate": any(m.kind == "audio" and m.sample_rate is None for m in medias),
        "several clips per file": any(m.per_item == 3 for m in medias),
    }  # fmt: skip
    assert all(covered.values()), [name for name, yes in covered.items() if not yes]


def test_media_names_are_the_corpus() -> None:
    """A drawn scenario names corpus files, every one of them, each long enough for any drawn clip."""
    from tests.media_corpus import corpus

    assert set(VIDEOS) == {i.name for i in corpus() if i.kind == "video"}
    assert set(AUDIOS) == {i.name for i in corpus() if i.kind == "audio"}
    assert min(i.frames for i in corpus() if i.kind == "video") >= 21  # `draw_media`'s longest span


def test_parts_come_from_their_own_streams() -> None:
    """Drawing the parts leaves the rest of every scenario as it was (cases written before replay)."""
    for seed in range(60):
        scenario = generate(seed)
        bare = replace(scenario, ingest=None, writing=None, media=None)
        assert not {"ingest", "writing", "media", "fit"} & set(json.loads(bare.to_json()))


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.parametrize("seed", PART_SEEDS)
def test_parts_sample(seed: int, tmp_path: Path) -> None:
    scenario = replace(generate(seed), fit=False)
    assert scenario.ingest or scenario.writing or scenario.media, f"seed {seed} draws no part"
    failures = check(run_scenario(scenario, tmp_path))
    assert not failures, "\n".join(failures[:5]) + f"\nreplay:\n{scenario.to_json()}"


# -- the oracles report what a wrong result looks like ---------------------------------------------------
def test_prepare_oracle_reports_a_scrambled_column_and_a_kept_bad_file(tmp_path: Path) -> None:
    ingest = Ingest("imagefolder", 8, 2, False, 2, 1, None, True, 0)
    folder = write_input(ingest, tmp_path)
    want = expected_rows(ingest, folder)
    assert len(want) == 7 and 2 not in want  # the cut JPEG (the 3rd file in walk order) is no row
    got = {i: dict(row) for i, row in want.items()}
    assert compare(want, got) == []
    got[3]["path"], got[3]["label_name"] = got[3]["label_name"], got[3]["path"]  # issue #50 (1)'s swap
    assert any("row 3 column label_name" in p for p in compare(want, got))
    kept = {**want, 2: {**want[0], "path": "class0/004.jpg"}}  # issue #50 (7): the cut JPEG kept
    assert any("ids [0, 1, 2" in p for p in compare(want, kept))


def test_prepare_oracle_reports_a_credential_in_the_output_or_a_dataset_file(tmp_path: Path) -> None:
    """An S3 draw's secret or access key printed by the CLI, or in a file the prepare left, is
    reported (the input files themselves are not the prepare's)."""
    from tests.contract.prepare_draws import _leaked

    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "x.bin").write_bytes(b"..SECRETKEY..")
    (tmp_path / "prepared.lance" / "_versions").mkdir(parents=True)
    (tmp_path / "prepared.lance" / "data.lance").write_bytes(b"ok")
    assert _leaked(["SECRETKEY", "AKID"], "prepare: ok", tmp_path, folder) == []
    (tmp_path / "prepared.lance" / "_versions" / "2.manifest").write_bytes(b"\0{input: s3://AKID:SECRETKEY@b}")
    found = _leaked(["SECRETKEY", "AKID"], "error: --storage-option=aws_secret_access_key=SECRETKEY", tmp_path, folder)
    assert found == [
        "prepare: the storage options' secret is in the CLI's output",
        "prepare: the storage options' secret is in prepared.lance/_versions/2.manifest",
        "prepare: the storage options' access key is in prepared.lance/_versions/2.manifest",
    ], found


def test_writer_oracle_reports_two_models_another_draw_and_a_value_outside_the_split() -> None:
    writing = Writing(rows=12, fragment_rows=4, filter="id % 3 != 0", random="rowrandom")
    split = split_ids(writing)
    reference = {i: {"extra": [i / 100]} for i in split}

    def row(i: int, scale: float = 1.0) -> dict:
        return {"emb": [i * scale + k for k in range(4)], "score": i * scale / 2, "extra": [i / 100]}

    good = {i: row(i) if i in split else {"emb": None, "score": None, "extra": None} for i in range(12)}
    assert check_rows(writing, good, reference) == []
    mixed = {**good, 4: row(4, 2.0)}  # issue #50 (3)
    assert any("mix two models" in p for p in check_rows(writing, mixed, reference))
    drawn = {**good, 5: {**row(5), "extra": [0.5]}}  # issue #50 (4)
    assert any("not the uninterrupted run's" in p for p in check_rows(writing, drawn, reference))
    lost = {i: r for i, r in good.items() if i != 7}
    assert any("rows [7] of the predict split" in p for p in check_rows(writing, lost, reference))
    outside = {**good, 3: row(3)}
    assert any("outside the predict split" in p for p in check_rows(writing, outside, reference))


@pytest.mark.parametrize("name", ["stereo.mp3", "mono16k.m4a", "h264_start125.mkv"])
def test_media_oracle_reports_a_window_one_sample_or_frame_off(name: str) -> None:
    from tests.contract.media_draws import _matches

    kind = "video" if name in VIDEOS else "audio"
    media = Media(kind, [name], 2, frames=4, frame_step=1, seconds=0.3, sample_rate=None)
    first, last = expected_clips(media, name)
    if kind == "video":
        clip = (first[0].transpose(0, 3, 1, 2), first[1])
        assert _matches(media, name, clip, first)
        later = replace(media, per_item=3)  # clip 1 of 3 is in the middle: a different start
        assert not _matches(media, name, clip, expected_clips(later, name)[1])
        return
    assert _matches(media, name, first, first) and _matches(media, name, last, last)
    shifted = np.roll(first[0], 1, axis=1)  # every sample one later (issue #50 (5): a wrong start)
    assert not _matches(media, name, (shifted, first[1]), first)
