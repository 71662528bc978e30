"""Per-row randomness: a row's draws depend only on (seed, epoch, its epoch position), never on the
batch size, the reader threads, the world size or the other rows of its batch."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from lance_lightning import LanceIterableDataset, LanceSource, RowShuffle
from lance_lightning.errors import ConfigError
from lance_lightning.source import pin_source
from lance_lightning.transforms import MaskTokens, RandomCrop, RandomFlip, RowRandom
from lance_lightning.vocabulary import EPOCH, EPOCH_POSITION
from tests.helpers import plan_of, write_dataset


def identity(positions: list[int], epoch: int = 0) -> dict[str, Any]:
    return {
        EPOCH_POSITION: torch.tensor(positions, dtype=torch.int64),
        EPOCH: torch.full((len(positions),), epoch, dtype=torch.int64),
    }


class Record:
    """Adds each row's uniform draws (3 per row) and a torch draw from its own generator."""

    def __init__(self) -> None:
        self.random = RowRandom(seed=11)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        draws = [torch.rand(1, generator=g).item() for g in self.random.generators(batch)]
        return {**batch, "u": self.random.uniform(batch, 3), "g": torch.tensor(draws)}


def draws_by_position(uri: str, batch_size: int, threads: int, world_size: int) -> dict[tuple[int, int], Any]:
    plan = plan_of("train", pin_source(LanceSource(uri, columns=["id"]), "train"), RowShuffle(seed=3), None, batch_size)
    seen: dict[tuple[int, int], Any] = {}
    for rank in range(world_size):
        dataset = LanceIterableDataset(
            plan, world_size=world_size, rank=rank, transform=Record(), reader_threads=threads, row_identity=True
        )
        for epoch in (0, 1):
            dataset.set_epoch(epoch)
            for batch in dataset:
                for i, position in enumerate(batch[EPOCH_POSITION].tolist()):
                    seen[(epoch, position)] = (int(batch["id"][i]), batch["u"][i].tolist(), float(batch["g"][i]))
    return seen


def test_same_rows_same_draws_whatever_batch_size_threads_and_ranks(tmp_path: Any) -> None:
    uri = write_dataset(tmp_path / "ds.lance", rows=120, fragment_rows=50)
    reference = draws_by_position(uri, batch_size=8, threads=0, world_size=1)
    assert len(reference) == 240
    for batch_size, threads, world_size in ((5, 3, 1), (16, 2, 2), (7, 0, 3)):
        other = draws_by_position(uri, batch_size, threads, world_size)
        assert {key: value for key, value in reference.items() if key in other} == other
    # Epochs draw anew, and the draws look uniform.
    assert reference[(0, 5)][1] != reference[(1, 5)][1]
    values = np.array([u for _, u, _ in reference.values()]).ravel()
    assert 0.0 <= values.min() and values.max() < 1.0 and abs(values.mean() - 0.5) < 0.05


def test_draws_depend_on_seed_epoch_and_position_only() -> None:
    random = RowRandom(seed=1)
    whole = random.uniform(identity([4, 9, 2, 7]), 5)
    assert whole.shape == (4, 5) and whole.dtype == torch.float64
    assert torch.equal(random.uniform(identity([9, 7]), 5), whole[[1, 3]])
    assert not torch.equal(RowRandom(seed=2).uniform(identity([4]), 5), whole[:1])
    assert not torch.equal(random.uniform(identity([4], epoch=1), 5), whole[:1])
    numpy_draws = [g.random() for g in random.numpy_generators(identity([4, 4]))]
    assert numpy_draws[0] == numpy_draws[1]
    high = random.integers(identity(list(range(1000))), 6)
    assert set(high.tolist()) == set(range(6))


def test_random_transforms_are_per_row() -> None:
    images = torch.arange(2 * 3 * 6 * 8, dtype=torch.float32).reshape(2, 3, 6, 8).repeat(20, 1, 1, 1)
    batch = {"image": images, **identity(list(range(40)))}
    flipped = RandomFlip(p=0.5, seed=3)(batch)["image"]
    mask = (flipped != images).flatten(1).any(1)
    assert 5 < int(mask.sum()) < 35
    assert torch.equal(flipped[mask], images[mask].flip(-1))
    # Row 7's flip and crop are the same in a batch of its own.
    alone = {"image": images[7:8], **identity([7])}
    assert torch.equal(RandomFlip(p=0.5, seed=3)(alone)["image"][0], flipped[7])
    crops = RandomCrop(size=(4, 5), seed=3)(batch)["image"]
    assert crops.shape == (40, 3, 4, 5)
    assert torch.equal(RandomCrop(size=(4, 5), seed=3)(alone)["image"][0], crops[7])
    tokens = torch.arange(40 * 50).reshape(40, 50)
    masked = MaskTokens("tokens", p=0.25, mask_id=-1, seed=0)({"tokens": tokens, **identity(list(range(40)))})
    share = masked["tokens_mask"].float().mean().item()
    assert 0.2 < share < 0.3
    assert torch.equal(masked["tokens"] == -1, masked["tokens_mask"])


def test_a_batch_without_identity_is_a_config_error_naming_row_identity() -> None:
    with pytest.raises(ConfigError) as info:
        RandomFlip()({"image": torch.zeros(2, 3, 4, 4)})
    assert info.value.param == "row_identity"
    with pytest.raises(ConfigError):
        RowRandom(seed=-1)
    with pytest.raises(ConfigError):
        RandomFlip(p=1.5)
    with pytest.raises(ConfigError):
        RandomCrop(size=None)  # type: ignore[arg-type]


def test_device_augment_with_a_seed_draws_per_row() -> None:
    from torchvision.transforms import v2

    from lance_lightning.transforms import DeviceAugment

    images = torch.rand(30, 3, 8, 8)
    augment = DeviceAugment([v2.RandomHorizontalFlip(), v2.RandomResizedCrop(6, antialias=True)], seed=4)
    whole = augment({"image": images, **identity(list(range(30)))})["image"]
    torch.manual_seed(0)
    part = augment({"image": images[[9, 3]], **identity([9, 3])})["image"]
    assert torch.equal(part, whole[[9, 3]])
    assert not torch.equal(augment({"image": images, **identity(list(range(30)), epoch=1)})["image"], whole)


class _PauseOnce(torch.nn.Module):
    """A v2-style transform that, on its first call, says it was reached and waits to be resumed."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.resume = threading.Event(), threading.Event()

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        if not self.reached.is_set():
            self.reached.set()
            assert self.resume.wait(60), "never resumed"
        return image


def test_a_seeded_augment_on_another_thread_leaves_this_threads_draws_alone() -> None:
    """CI failure on ffad2d8 (test_predict_reruns, device_augment): a seeded `DeviceAugment` run by
    a reader thread seeded torch's global generator for each image and restored it after, so a model
    built under ``torch.manual_seed(0)`` in the training thread at that moment got other weights, and
    the prediction writer refused the resumed run as another model's. Here the augment pauses inside
    an image's transforms on another thread while this thread draws: this thread's draws are those of
    its own seed (before, they came from the row's stream, then repeated once the state was
    restored), and the augment's output is the one it gives alone."""
    from torchvision.transforms import v2

    from lance_lightning.transforms import DeviceAugment

    images = torch.rand(6, 3, 8, 8)
    batch = {"image": images, **identity(list(range(6)))}
    flips = [v2.RandomHorizontalFlip(), v2.RandomResizedCrop(6, antialias=True)]
    alone = DeviceAugment(flips, seed=4)(batch)["image"]
    pause = _PauseOnce()
    augment = DeviceAugment([flips[0], pause, flips[1]], seed=4)
    out: dict[str, torch.Tensor] = {}
    worker = threading.Thread(target=lambda: out.update(augment(batch)))
    torch.manual_seed(0)
    drawn = [torch.rand(3)]
    worker.start()
    assert pause.reached.wait(60), "the augment never ran"
    drawn.append(torch.rand(3))
    pause.resume.set()
    worker.join(60)
    drawn.append(torch.rand(3))
    torch.manual_seed(0)
    assert torch.equal(torch.cat(drawn), torch.rand(9)), "another thread's seeded augment moved this thread's draws"
    assert torch.equal(out["image"], alone), "this thread's draws moved the seeded augment's"


def _random_calls(t: torch.Tensor) -> dict[Any, Any]:
    """One CPU call of each of `RANDOM_FUNCTIONS`, none naming a generator."""
    return {
        torch.rand: lambda: torch.rand(3),
        torch.randn: lambda: torch.randn(3),
        torch.randint: lambda: torch.randint(0, 5, (3,)),
        torch.randperm: lambda: torch.randperm(5),
        torch.rand_like: lambda: torch.rand_like(t),
        torch.randn_like: lambda: torch.randn_like(t),
        torch.randint_like: lambda: torch.randint_like(t, 5),
        torch.normal: lambda: torch.normal(0.0, 1.0, size=(3,)),
        torch.bernoulli: lambda: torch.bernoulli(t),
        torch.multinomial: lambda: torch.multinomial(t[0], 2),
        torch.poisson: lambda: torch.poisson(t),
        torch.Tensor.uniform_: lambda: t.clone().uniform_(),
        torch.Tensor.normal_: lambda: t.clone().normal_(),
        torch.Tensor.random_: lambda: t.clone().random_(0, 5),
        torch.Tensor.bernoulli: lambda: t.bernoulli(),
        torch.Tensor.bernoulli_: lambda: t.clone().bernoulli_(0.5),
        torch.Tensor.multinomial: lambda: t[0].multinomial(2),
        torch.Tensor.exponential_: lambda: t.clone().exponential_(),
        torch.Tensor.cauchy_: lambda: t.clone().cauchy_(),
        torch.Tensor.log_normal_: lambda: t.clone().log_normal_(),
        torch.Tensor.geometric_: lambda: t.clone().geometric_(0.5),
    }


def test_every_random_function_the_mode_names_draws_from_its_generator_and_leaves_the_global_one() -> None:
    """`DrawsFrom` hands ``generator=`` to each of `RANDOM_FUNCTIONS`: each call must accept it (a
    torch whose function dropped the argument would raise), draw the same values from the same seed,
    and leave torch's global generator where it was."""
    from lance_lightning.transforms.augment import RANDOM_FUNCTIONS, DrawsFrom

    calls = _random_calls(torch.rand(4, 4))
    assert set(calls) == set(RANDOM_FUNCTIONS), "a function of the mode has no call here"
    generator = torch.Generator()
    for function, call in calls.items():
        torch.manual_seed(0)
        before = torch.get_rng_state()
        drawn = []
        for _ in range(2):
            generator.manual_seed(1)
            with DrawsFrom(generator):
                drawn.append(call())
        assert torch.equal(torch.get_rng_state(), before), f"{function} drew from the global generator"
        assert torch.equal(drawn[0], drawn[1]), f"{function} drew other values from the same seed"
