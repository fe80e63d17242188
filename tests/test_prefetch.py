"""The prefetcher: batches prepared ahead on a thread of their own are the serial path's, bit for bit, token targets
included; each batch's draws are its own (not the process's streams); a batch that fails to prepare fails in turn."""
from pathlib import Path

import pytest
import torch

from backbones.common.distributed import DistInfo
from backbones.common.random_state import hash_seed
from classification.data.cifar import CifarInput
from classification.engine.prefetch import Prefetcher
from classification.engine.trainer import RunOptions
from classification.loaders import ImageData, make_loaders
from classification.recipes import recipe_for
from classification.token_labeling.label_store import TokenLabelStore
from classification.training_pieces import make_objective

DATA_CONFIG = {'mean': (0.485, 0.456, 0.406), 'std': (0.229, 0.224, 0.225), 'crop_pct': 0.9,
               'interpolation': 'bicubic'}


def token_labeling_pieces(labeled_images, workers: int):
    """The batched path's training loader (RandAugment, erasing, token labels from the store), its device half and
    the token-labeling objective, as train_cls builds them."""
    data, labels = labeled_images
    recipe = recipe_for('lvvit_s')
    recipe.img_size, recipe.batch_size, recipe.reprob = 32, 4, 1.0  # every image erased: the noise is compared too
    loader, _, classes, device_tf = make_loaders(ImageData(Path(data), Path(labels)), TokenLabelStore(labels),
                                                 recipe, DATA_CONFIG, DistInfo(), RunOptions(Path('unused'),
                                                                                             workers=workers),
                                                 'batched')
    objective = make_objective(recipe, len(classes))
    objective.token_grid = (2, 2)  # as learnt from a first forward: the targets are made ahead from the start
    return loader, device_tf, objective


def loader_for_epoch(loader, epoch: int, skip_batches: int = 0):
    loader.sampler.set_epoch(epoch)
    loader.sampler.skip(skip_batches * loader.batch_size)
    loader.dataset.set_epoch(0, epoch)
    return loader


def with_targets(batches: list[dict], objective) -> list[dict]:
    """The batches with the token targets the serial path makes in the loss, where they were not made ahead."""
    for batch in batches:
        if 'map_targets' not in batch:
            batch['map_targets'] = ((2, 2), objective.map_targets(batch, (2, 2), torch.device('cpu')))
    return batches


def assert_same_batches(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs) > 1
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        assert torch.equal(a['image'], b['image']) and torch.equal(a['label'], b['label'])
        assert a['map_targets'][0] == b['map_targets'][0]
        for x, y in zip(a['map_targets'][1], b['map_targets'][1]):
            assert torch.equal(x, y)


def test_prefetched_batches_are_the_serial_ones_bit_for_bit(labeled_images):
    """Two batches ahead on a thread of their own, the training thread drawing from the process's streams meanwhile
    (as MixToken and drop-path do), against the serial path: the same images (RandAugment, every image erased with
    noise), labels and token targets (made ahead), bit for bit. A pass resumed at its third batch continues with
    the same batches."""
    loader, device_tf, objective = token_labeling_pieces(labeled_images, workers=2)
    serial = Prefetcher(DistInfo(), device_tf, objective, depth=0)
    serial_batches = with_targets(list(serial(iter(loader_for_epoch(loader, 1)), seed=7)), objective)
    assert not any('map_targets' in batch for batch in serial(iter(loader_for_epoch(loader, 1)), seed=7))
    prefetch = Prefetcher(DistInfo(), device_tf, objective, depth=2, thread=True)  # a GPU's thread, on the CPU
    torch.manual_seed(1)
    prefetched = []
    for batch in prefetch(iter(loader_for_epoch(loader, 1)), seed=7):
        torch.rand(1000)  # the training thread's own draws, between the batches
        prefetched.append(batch)
    assert all('map_targets' in batch for batch in prefetched)
    assert_same_batches(prefetched, serial_batches)
    resumed = list(prefetch(iter(loader_for_epoch(loader, 1, skip_batches=2)), seed=7, first=2))
    assert_same_batches(resumed, serial_batches[2:])
    # the noise is the batch's own: another pass seed, other noise on the same images from the workers
    other = list(prefetch(iter(loader_for_epoch(loader, 1)), seed=8))
    assert not torch.equal(other[0]['image'], prefetched[0]['image'])


class FailsOnThird:
    """A batch transform whose third batch cannot be prepared (as a file the device's decoder refuses)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, images: torch.Tensor, seed: int | None = None) -> torch.Tensor:
        self.calls += 1
        if self.calls == 3:
            raise ValueError('batch 3 cannot be prepared')
        return images.float()


class NoTargetsAhead:
    def targets_ahead(self, batch: dict, device: torch.device) -> dict:
        return batch


@pytest.mark.parametrize('thread', [True, False])
def test_a_batch_that_fails_to_prepare_fails_in_its_turn_after_the_batches_before_it(thread):
    batches = ({'image': torch.full((2, 3), float(i)), 'label': torch.zeros(2)} for i in range(6))
    taken = []
    with pytest.raises(ValueError, match='batch 3'):
        for batch in Prefetcher(DistInfo(), FailsOnThird(), NoTargetsAhead(), depth=2, thread=thread)(batches, seed=0):
            taken.append(int(batch['image'][0, 0]))
    assert taken == [0, 1]


def test_cifar_augmentation_draws_from_the_batchs_seed_not_the_process_streams():
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    augment = CifarInput(32, (0.5,) * 3, (0.25,) * 3, train=True)
    torch.manual_seed(0)
    first = augment(images, seed=hash_seed(3, 1))
    torch.manual_seed(1)
    assert torch.equal(augment(images, seed=hash_seed(3, 1)), first)
    assert not torch.equal(augment(images, seed=hash_seed(3, 2)), first)


def test_a_batch_of_unreadable_images_passes_as_it_is_with_targets_made_ahead(labeled_images):
    """With --skip-unreadable a batch may hold no image at all: it is counted, not prepared (the token targets the
    prefetcher makes ahead need its geometry)."""
    _, device_tf, objective = token_labeling_pieces(labeled_images, workers=0)
    batches = [{'skipped': 4}, {'skipped': 4}]
    assert list(Prefetcher(DistInfo(), device_tf, objective, depth=2, thread=True)(iter(batches), seed=0)) == batches


class Counted:
    """A loader of `n` small batches that counts the ones read."""

    def __init__(self, n: int) -> None:
        self.n, self.read = n, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        for _ in range(self.n):
            self.read += 1
            yield {'image': torch.randn(2, 3, 32, 32), 'label': torch.tensor([0, 1]), 'skipped': 0}


@pytest.mark.parametrize('overlap', [True, False])
def test_batches_after_the_last_complete_update_are_not_read(overlap):
    """5 batches and updates of 2: the fifth would complete no update, so it is neither read nor prepared (a file the
    decoder refuses there would end the pass after its last update)."""
    import timm

    from classification.engine.steps import PassOptions, train_one_epoch
    from classification.engine.trainer import Optimization, optimization_state
    from classification.objectives.objective import LabelObjective
    model = timm.create_model('deit_small_patch16_224', num_classes=2, img_size=32, embed_dim=32, depth=1,
                              num_heads=2)
    state, _ = optimization_state(model, model, Optimization('momentum', 0.1, 0.0, epochs=1), 2, 'none')
    loader = Counted(5)
    train_one_epoch(model, loader, LabelObjective(2, 0.1), state, DistInfo(),
                    PassOptions(accumulate=2, overlap=overlap))
    assert (loader.read, state.num_updates) == (4, 2)
