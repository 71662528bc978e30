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
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.contract.media_draws import (
    AUDIOS,
    PAST_END,
    POLICIES,
    REGULAR_PAST,
    VIDEOS,
    Media,
    bad_reasons,
    check_error,
    draw_media,
    expected_clips,
    expected_places,
)
from tests.contract.oracle import check
from tests.contract.parts import SHARE
from tests.contract.prepare_draws import FORMATS, LOCATIONS, Ingest, compare, expected_rows, units, write_input
from tests.contract.runner import run_scenario
from tests.contract.scenario import generate
from tests.contract.writer_draws import Writing, check_rows, split_ids

MOMENTS = ("commit", "write", "rename")
RANDOMS = ("none", "rowrandom", "flip", "augment")
#: Seeds whose parts draw each folder format, webdataset blobs, parquet, a truncated JPEG, kills at each
#: moment, 2-rank predicts killed on rank 1 and on rank 0, each rerun, a second predict, video and audio clips;
#: issue #52's clip options: 173 (video ``policy="error"`` past the end: a bad row), 211 (regular video
#: starts filled by ``wrap``), 218 (video range from the end, ``repeat_last``), 458 (audio range, ``repeat_last``).
PART_SEEDS = [0, 1, 2, 8, 13, 19, 23, 26, 33, 37, 57, 173, 211, 218, 458]


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


def _media_draws(seeds: range) -> list[Media]:
    """The media parts `tests.contract.parts.draw_parts` draws for ``seeds`` (its stream, only)."""
    draws = []
    for seed in seeds:
        rng = random.Random(f"{seed}-media")
        if rng.random() < SHARE["media"]:
            draws.append(draw_media(rng))
    return draws


def _filled(media: Media) -> set[str]:
    """What ``media``'s clips meet past the end: the policy that filled one, or the bad row's reason."""
    met = set()
    for name in media.names:
        for place in expected_places(media, name):
            if isinstance(place, str):
                met.add(place)
            elif len(place) > 1 and not np.all(np.diff(place) > 0):  # repeated or wrapped positions
                met.add(media.policy)
    return met


def test_media_draws_every_clip_option() -> None:
    """Issue #52: TorchCodec's placement options in the media draws, and clips that meet the end."""
    medias = _media_draws(range(1500))
    drawn = [scenario.media for scenario in map(generate, range(100)) if scenario.media is not None]
    assert medias[: len(drawn)] == drawn  # the generator's own draws
    video, audio = [m for m in medias if m.kind == "video"], [m for m in medias if m.kind == "audio"]
    met = {kind: [_filled(m) for m in group] for kind, group in (("video", video), ("audio", audio))}
    covered = {
        **{f"{kind} policy {p}": any(m.policy == p and m.range_start is not None for m in group)
           for kind, group in (("video", video), ("audio", audio)) for p in POLICIES},
        "video range from the start": any(m.every is None and (m.range_start or 0) > 0 for m in video),
        "video range from the end": any(m.every is None and (m.range_start or 0) < 0 for m in video),
        "video range end from the end": any(m.every is None and (m.range_end or 0) < 0 for m in video),
        "video range end": any(m.every is None and (m.range_end or 0) > 0 for m in video),
        "audio range": any(m.every is None and m.range_start and m.range_end for m in audio),
        **{f"{kind} regular starts{r}": any(m.every and (m.range_start is None) == (r == "") for m in group)
           for kind, group in (("video", video), ("audio", audio)) for r in ("", " from a range start")},
        **{f"{kind} regular starts to a range end": any(m.every and m.range_end for m in group)
           for kind, group in (("video", video), ("audio", audio))},
        **{f"{kind} TorchCodec's names": any(m.aliases for m in group) for kind, group in (("video", video),
                                                                                         ("audio", audio))},
        **{f"{kind} clip filled by {p}": any(p in seen for seen in met[kind]) for kind in met
           for p in ("repeat_last", "wrap")},
        **{f"{kind} bad row: {r}": any(r in seen for seen in met[kind]) for kind in met
           for r in (PAST_END, REGULAR_PAST)},
        "a regular video clip filled": any(m.every and {"repeat_last", "wrap"} & _filled(m) for m in video),
        "draws without options (as before)": sum(m == replace(m, policy="error", range_start=None, range_end=None,
                                                             every=None, aliases=False) for m in medias) > 50,
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


def test_writer_oracle_takes_row_zero_for_either_model() -> None:
    """Soak seed 1435 (``predict(W1K2 flip bad=replace kill=r0@1->other_model)``): the rerun's model
    (scale 2) committed every row, and row ``id`` 0, which every scale gives ``emb = k, score = 0``,
    was taken for scale 1, a mix of two models the writer never made."""
    writing = Writing(rows=10, fragment_rows=4, rerun="other_model", kill_rank=0)
    split = split_ids(writing)
    assert 0 in split

    def row(i: int, scale: float) -> dict:
        return {"emb": [i * scale + k for k in range(4)], "score": i * scale / 2, "extra": None}

    for scale in (1.0, 2.0):
        assert check_rows(writing, {i: row(i, scale) for i in range(10)}, {}) == [], scale
    mixed = {**{i: row(i, 2.0) for i in range(10)}, 5: row(5, 1.0)}
    assert any("mix two models" in p for p in check_rows(writing, mixed, {}))


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


def test_media_oracle_reports_a_clip_filled_or_placed_otherwise() -> None:
    """Issue #52's options: the oracle's placements are docs/video.md's (the literal indices of
    tests/unit/media/test_clip_options.py), and it reports a clip filled by the other policy, one at
    another regular start, a TorchCodec-style short window, and a documented bad row not raised."""
    from tests.contract.media_draws import _matches

    wrap = Media("video", ["h264.mp4"], 2, frames=8, frame_step=2, policy="wrap", range_start=30)  # 36 frames
    assert [p.tolist() for p in expected_places(wrap, "h264.mp4")] == [[30, 32, 34, 30, 32, 34, 30, 32]] * 2
    repeat = replace(wrap, policy="repeat_last", range_start=-6)  # frame 30 from the end
    assert expected_places(repeat, "h264.mp4")[1].tolist() == [30, 32, 34, 34, 34, 34, 34, 34]
    (repeated, times), (wrapped, _) = expected_clips(repeat, "h264.mp4")[0], expected_clips(wrap, "h264.mp4")[0]
    assert np.array_equal(repeated[3], repeated[7]) and not np.array_equal(wrapped[3], wrapped[7])
    got = (repeated.transpose(0, 3, 1, 2), times)
    assert _matches(repeat, "h264.mp4", got, (repeated, times))
    assert not _matches(wrap, "h264.mp4", got, expected_clips(wrap, "h264.mp4")[0])
    assert bad_reasons(replace(wrap, policy="error"), "h264.mp4") == [PAST_END, PAST_END]

    regular = Media("video", ["h264_start125.mkv"], 4, frames=3, every=0.5)  # 24 fps from 1.25 s
    clips = expected_clips(regular, "h264_start125.mkv")
    assert [round(c[1][0], 3) for c in clips] == [1.25, 1.75, 2.25, 2.75]
    got = (clips[1][0].transpose(0, 3, 1, 2), clips[1][1])
    assert _matches(regular, "h264_start125.mkv", got, clips[1])
    assert not _matches(regular, "h264_start125.mkv", got, clips[2])
    assert bad_reasons(replace(regular, names=["h264_60.mp4"]), "h264_60.mp4") == [REGULAR_PAST] * 2  # 1.0 s

    audio = Media("audio", ["mono.flac"], 1, seconds=0.5, sample_rate=None, policy="repeat_last", range_start=2.0)
    ((window, start),) = expected_clips(audio, "mono.flac")  # 2.3 s at 48 kHz: 0.2 s past the end
    assert start == 2.0 and window.shape == (1, 24000) and np.all(window[:, 14400:] == window[:, 14399:14400])
    assert _matches(audio, "mono.flac", (window, start), (window, start))
    ((wrapped_window, _),) = expected_clips(replace(audio, policy="wrap"), "mono.flac")
    assert not _matches(audio, "mono.flac", (wrapped_window, start), (window, start))
    assert not _matches(audio, "mono.flac", (window[:, :14400], start), (window, start))  # TorchCodec's short one
    regular_audio = replace(audio, per_item=3, range_start=None, every=1.2)  # starts 0, 1.2 and 2.4 s of 2.3
    assert bad_reasons(regular_audio, "mono.flac") == [REGULAR_PAST]
    assert [start for _, start in expected_clips(replace(regular_audio, per_item=2), "mono.flac")] == [0.0, 1.2]

    bad = {"h264.mp4": [PAST_END]}
    assert check_error(wrap, bad, "BadRowError: row 0 ... (policy 'error'; policy: repeat_last or wrap fills it)") == []
    assert check_error(wrap, bad, None)  # the fit trained a clip the docs call a bad row
    assert check_error(wrap, bad, "BadRowError: decoding the video failed")  # another reason
    assert check_error(wrap, {}, "BadRowError: row 0 ... (policy 'error')")  # a bad row the docs place
