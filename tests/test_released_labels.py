"""Importing the released label sets (TokenLabeling's NFNet-F6 maps of the centre square, ReLabel's whole-image maps):
the store holds the files' values, the centre square is placed in image coordinates (known answer against RoIAlign of
the reference's dense map), damaged trees are refused naming the file, an interrupted import resumes, and the
imported stores train."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import roi_align

from backbones.common.distributed import DistInfo
from backbones.common.errors import DataError, UsageError
from classification.data.augment import CropGeometry
from classification.objectives.token_targets import TokenTargetBuilder
from classification.token_labeling.label_store import DONE, TokenLabelError, TokenLabelStore
from classification.token_labeling.released_labels import import_released_labels
from helpers.cls_data import CLASSES, make_image_folder
from helpers.commands import run_tool

pytestmark = pytest.mark.slow  # tools run end to end here: make test-fast leaves this file out

K = 3  # top-k of the tiny trees (three classes)
LAYOUTS = {'tokenlabeling': (18, torch.float16), 'relabel': (15, torch.float32)}


def write_release(data: Path, root: Path, layout: str, seed: int = 0) -> Path:
    """A released tree for `data`'s training images: root/<wnid>/<stem>.pt, [2, K, side, side] (scores, then class
    indices as floats), the best class mostly the image's own, scores falling along each row of the map."""
    side, dtype = LAYOUTS[layout]
    rng = np.random.default_rng(seed)
    for label, wnid in enumerate(CLASSES):
        (root / wnid).mkdir(parents=True, exist_ok=True)
        for image in sorted((data / 'train' / wnid).iterdir()):
            order = np.stack([rng.permutation(K) for _ in range(side * side)]).T.reshape(K, side, side)
            # the left half of every map ranks the image's class first
            order[:, :, : side // 2] = np.array([(label + i) % K for i in range(K)]).reshape(K, 1, 1)
            scores = np.sort(rng.normal(0, 2, (K, side, side)), axis=0)[::-1] + np.linspace(0, 1, side)
            torch.save(torch.stack([torch.from_numpy(scores.copy()), torch.from_numpy(order.astype(np.float64))]).to(
                dtype), root / wnid / f'{image.stem}.pt')
    return root


@pytest.fixture(scope='module')
def released(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('released')
    data = make_image_folder(tmp / 'data')
    trees = {layout: write_release(data, tmp / layout, layout) for layout in LAYOUTS}
    stores = {layout: tmp / f'store_{layout}' for layout in LAYOUTS}
    for layout in LAYOUTS:
        import_released_labels(data, trees[layout], stores[layout], DistInfo(), workers=2, shard_size=5)
    return tmp, data, trees, stores


@pytest.mark.parametrize('layout', list(LAYOUTS))
def test_the_store_holds_every_files_maps_and_what_they_cover(released, layout):
    _, data, trees, stores = released
    store = TokenLabelStore(stores[layout])
    side = LAYOUTS[layout][0]
    assert store.meta['format'] == layout and store.grid == (side, side) and store.meta['topk'] == K
    assert store.classes == list(CLASSES) and len(store) == 24
    for row, path in enumerate(store.paths):
        wnid, name = Path(path).parts[1:]
        value = torch.load(trees[layout] / wnid / f'{Path(name).stem}.pt', weights_only=True)
        scores, classes = store.read(row)
        np.testing.assert_array_equal(scores, value[0].permute(1, 2, 0).to(torch.float16).numpy())
        np.testing.assert_array_equal(classes, value[1].permute(1, 2, 0).numpy().astype(np.int64))
        width, height = Image.open(data / path).size
        s = min(width, height)
        expected = [-s / width, -s / height, s / width, s / height] if layout == 'tokenlabeling' else [-1, -1, 1, 1]
        np.testing.assert_allclose(store.extent(row), expected, rtol=1e-6)
    assert any(Image.open(data / p).size[0] != Image.open(data / p).size[1] for p in store.paths)  # wide images too


def reference_dense_map(value: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The reference's rule, with the suite's documented difference: the top-k of each position renormalised
    (softmax over the k stored logits), scattered into a dense (C, h, w) map."""
    probs = value[0].float().softmax(dim=0)
    dense = torch.zeros(num_classes, *value.shape[-2:])
    return dense.scatter_add_(0, value[1].long(), probs)


def test_token_targets_of_a_crop_inside_the_centre_square_are_roi_align_of_the_dense_map(released):
    """A wide image (60x40): its map covers x 10..50. The targets of a crop inside that square equal RoIAlign
    (aligned, 2x2 samples) of the dense map over the crop's box in the map's own coordinates."""
    _, data, trees, stores = released
    store = TokenLabelStore(stores['tokenlabeling'])
    path = next(p for p in store.paths if Image.open(data / p).size == (60, 40))
    row = store.row_of(path)
    wnid, name = Path(path).parts[1:]
    value = torch.load(trees['tokenlabeling'] / wnid / f'{Path(name).stem}.pt', weights_only=True)
    box_px = torch.tensor([14.0, 6.0, 44.0, 30.0])  # x1, y1, x2, y2 in image pixels, inside the square
    S = 4
    geometry = CropGeometry((box_px / torch.tensor([60.0, 40.0, 60.0, 40.0]))[None], torch.tensor([False]),
                            torch.eye(3)[:2][None])
    scores, classes = (torch.from_numpy(a)[None] for a in store.read(row))
    builder = TokenTargetBuilder(len(CLASSES), smoothing=0.0, samples=2)
    cls, tokens = builder(scores, classes.long(), geometry, (S, S), torch.from_numpy(store.extent(row))[None])

    in_map = (box_px - torch.tensor([10.0, 0.0, 10.0, 0.0])) * 18 / 40  # the square's pixels -> map cells
    expected = roi_align(reference_dense_map(value, len(CLASSES))[None], [in_map[None]], (S, S), 1.0, 2, True)[0]
    torch.testing.assert_close(tokens[0], expected.permute(1, 2, 0), atol=1e-5, rtol=1e-4)
    whole = roi_align(reference_dense_map(value, len(CLASSES))[None], [in_map[None]], (1, 1), 1.0, 2 * S, True)
    torch.testing.assert_close(cls[0], whole.flatten(), atol=1e-5, rtol=1e-4)


def test_tokens_outside_the_centre_square_take_the_class_token_target(released):
    """A crop over the whole wide image: the left and right thirds of its tokens lie outside the square; they get
    the class-token target, which is the average over the square only."""
    _, data, _, stores = released
    store = TokenLabelStore(stores['tokenlabeling'])
    path = next(p for p in store.paths if Image.open(data / p).size == (60, 40))
    row = store.row_of(path)
    scores, classes = (torch.from_numpy(a)[None] for a in store.read(row))
    whole_image = CropGeometry(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), torch.tensor([False]), torch.eye(3)[:2][None])
    builder = TokenTargetBuilder(len(CLASSES), smoothing=0.0)
    extent = torch.from_numpy(store.extent(row))[None]
    cls, tokens = builder(scores, classes.long(), whole_image, (6, 6), extent)
    torch.testing.assert_close(tokens[0, :, 0], cls.expand(6, -1))  # x 0..10 of 60: outside
    torch.testing.assert_close(tokens[0, :, 5], cls.expand(6, -1))  # x 50..60: outside
    assert not torch.allclose(tokens[0, :, 2], cls.expand(6, -1))  # inside: the map's own values
    # a crop of the square alone, its samples where the whole image's inside the square are (x every 5 px)
    square = CropGeometry(torch.tensor([[10 / 60, 0.0, 50 / 60, 1.0]]), torch.tensor([False]), torch.eye(3)[:2][None])
    torch.testing.assert_close(cls, builder(scores, classes.long(), square, (6, 4), extent)[0], atol=1e-6, rtol=0)
    # the whole-image reading of the same map (the reference loader's bug) gives other targets
    assert not torch.allclose(tokens, builder(scores, classes.long(), whole_image, (6, 6))[1], atol=1e-3)


def test_an_interrupted_import_resumes_without_rereading_finished_shards(released, tmp_path):
    _, data, trees, stores = released
    store = Path(shutil.copytree(stores['relabel'], tmp_path / 'store'))
    meta = json.loads((store / 'meta.json').read_text())
    (store / 'meta.json').write_text(json.dumps({**meta, 'complete': False}))
    for marker in ('000001', '000003'):
        (store / DONE / marker).unlink()
    scores = np.load(store / 'scores.npy', mmap_mode='r+')
    scores[5:10] = 0
    scores.flush()
    del scores
    with pytest.raises(TokenLabelError, match='incomplete'):
        TokenLabelStore(store)
    tree = Path(shutil.copytree(trees['relabel'], tmp_path / 'tree'))
    first = sorted((data / 'train' / CLASSES[0]).iterdir())[0]
    (tree / CLASSES[0] / f'{first.stem}.pt').write_bytes(b'damaged')  # its shard (0) is done: not read again
    import_released_labels(data, tree, store, DistInfo(), workers=0, shard_size=5)
    resumed, reference = TokenLabelStore(store), TokenLabelStore(stores['relabel'])
    for row in range(len(reference)):
        np.testing.assert_array_equal(resumed.read(row)[0], reference.read(row)[0])


def test_damaged_trees_are_refused_naming_the_file(released, tmp_path):
    _, data, trees, _ = released
    image = sorted((data / 'train' / CLASSES[1]).iterdir())[2]

    def damaged(change) -> Path:
        tree = Path(shutil.copytree(trees['tokenlabeling'], tmp_path / f'tree{len(list(tmp_path.iterdir()))}'))
        change(tree / CLASSES[1] / f'{image.stem}.pt')
        return tree

    def refused(tree: Path, match: str, error=DataError, **kwargs) -> None:
        with pytest.raises(error, match=match):
            import_released_labels(data, tree, tmp_path / f'out{len(list(tmp_path.iterdir()))}', DistInfo(),
                                   workers=0, **kwargs)

    file = f'{CLASSES[1]}/{image.stem}.pt'
    refused(damaged(lambda f: f.write_bytes(f.read_bytes()[:100])), f'{file}: not a readable tensor file')
    refused(damaged(lambda f: torch.save({'x': 1}, f)), f'{file}: holds a dict')
    refused(damaged(lambda f: torch.save(torch.zeros(2, K, 17, 18, dtype=torch.float16), f)),
            rf'{file}: a torch.float16 tensor of shape \[2, 3, 17, 18\]; this release')

    def out_of_range(f):
        value = torch.load(f, weights_only=True)
        value[1, 0, 3, 3] = 7
        torch.save(value, f)
    refused(damaged(out_of_range), f'{file}: class indices outside 0..2')

    def not_finite(f):
        value = torch.load(f, weights_only=True)
        value[0, 1, 2, 2] = float('nan')
        torch.save(value, f)
    refused(damaged(not_finite), f'{file}: scores that are not finite')
    refused(damaged(lambda f: f.unlink()), rf'1 image\(s\) of .* have no file in .*{image.name}.*--skip-missing')
    wrong_classes = damaged(lambda f: None)
    (wrong_classes / CLASSES[2]).rename(wrong_classes / 'n999')
    refused(wrong_classes, r'only in the released labels .*: n999; only in .*: n003')
    odd = damaged(lambda f: None)
    for f in sorted(odd.glob('*/*.pt')):
        torch.save(torch.zeros(2, K, 9, 9), f)
    refused(odd, 'neither release', error=UsageError)


def test_one_damaged_file_does_not_decide_the_release_and_format_must_fit_the_maps(released, tmp_path):
    """The release is read from files spread over the tree: a first file of ReLabel's size in an 18x18 tree is named
    as the odd one before any store is started (it once made the whole tree ReLabel's and blocked the rerun); and
    --format relabel on TokenLabeling's 18x18 maps is refused (it once placed them over the whole image)."""
    _, data, trees, _ = released
    tree = Path(shutil.copytree(trees['tokenlabeling'], tmp_path / 'tree'))
    first = sorted((tree / CLASSES[0]).iterdir())[0]
    torch.save(torch.zeros(2, K, 15, 15), first)
    with pytest.raises(DataError, match=rf'its files differ in shape \({CLASSES[0]}/{first.name}: \[2, 3, 15, 15\]; '
                                        rf'.*: \[2, 3, 18, 18\]\).*replace the damaged one'):
        import_released_labels(data, tree, tmp_path / 'store', DistInfo(), workers=0)
    assert not (tmp_path / 'store').exists()
    with pytest.raises(UsageError, match=r"--format relabel: .* holds 18x18 maps, the tokenlabeling release's \(the "
                                         r"relabel release's are 15x15\)"):
        import_released_labels(data, trees['tokenlabeling'], tmp_path / 'store', DistInfo(), fmt='relabel',
                               workers=0)
    assert not (tmp_path / 'store').exists()


def test_two_images_with_one_stem_in_a_class_are_refused(released, tmp_path):
    """x.JPEG and x.png of one class would both take x.pt: refused naming both, not imported as 'verified'."""
    _, data, trees, _ = released
    copy = Path(shutil.copytree(data, tmp_path / 'data'))
    jpeg = next(f for f in sorted((copy / 'train' / CLASSES[1]).iterdir()) if f.suffix == '.JPEG')
    Image.open(jpeg).save(jpeg.with_suffix('.png'))
    with pytest.raises(DataError, match=f'train/{CLASSES[1]}/{jpeg.name} and train/{CLASSES[1]}/{jpeg.stem}.png '
                                        f'would both take .*{CLASSES[1]}/{jpeg.stem}.pt'):
        import_released_labels(copy, trees['tokenlabeling'], tmp_path / 'store', DistInfo(), workers=0)


def test_images_without_a_file_train_on_their_label_with_skip_missing(released, tmp_path):
    _, data, trees, _ = released
    tree = Path(shutil.copytree(trees['tokenlabeling'], tmp_path / 'tree'))
    image = sorted((data / 'train' / CLASSES[1]).iterdir())[2]
    (tree / CLASSES[1] / f'{image.stem}.pt').unlink()
    torch.save(torch.zeros(1), tree / CLASSES[0] / 'not_an_image_of_the_set.pt')
    meta = import_released_labels(data, tree, tmp_path / 'store', DistInfo(), workers=0, skip_missing=True)
    path = image.relative_to(data).as_posix()
    assert meta['missing'] == [path] and meta['extra_files'] == 1
    store = TokenLabelStore(tmp_path / 'store')
    assert not store.has_map(store.row_of(path)) and store.mapped.sum() == len(store) - 1


TINY_LVVIT = ['lvvit_t', '--model-kwargs', 'embed_dim=32', 'depth=2', 'num_heads=2', 'stem_chs=8']


@pytest.mark.parametrize('layout', list(LAYOUTS))
def test_imported_stores_train_lvvit_with_token_labeling(released, tmp_path, layout):
    _, data, _, stores = released
    result = run_tool('train_cls.py', [*TINY_LVVIT, '--data-dir', data, '--token-label-dir', stores[layout],
                                       '--output', tmp_path / 'run', '--img-size', '32', '--batch-size', '4',
                                       '--epochs', '2', '--warmup-epochs', '0', '--workers', '0', '--device', 'cpu'])
    assert result.returncode == 0, result.stderr[-2000:]
    metrics = json.loads((tmp_path / 'run' / 'metrics.json').read_text())
    assert metrics['token_labeling'] and metrics['epochs'] == 2


def test_the_import_tool_names_a_bad_release_dir_in_one_line(released, tmp_path):
    _, data, _, _ = released
    result = run_tool('import_token_labels.py', ['--data-dir', data, '--release-dir', tmp_path / 'nothing',
                                                 '--output', tmp_path / 'out'])
    assert result.returncode == 2 and result.stderr.strip().count('\n') == 0
    assert f'no released label tree at {tmp_path / "nothing"}' in result.stderr


def test_label_pooling_learns_the_map_pooled_over_the_crop_mixed_by_cutmix(released):
    """--preset relabel's loss: soft cross-entropy with the crop's map pooled to one label (RoIAlign 1x1 of the
    dense map, smoothed), the targets mixed with lambda as CutMix mixed the images (box from image B-1-i)."""
    from classification.objectives.token_loss import soft_cross_entropy
    from classification.recipes import recipe_for
    from classification.training_pieces import make_objective
    recipe = recipe_for('lvvit_s', preset='relabel')
    assert recipe.label_pooling and not recipe.token_labeling and recipe.uses_score_maps
    assert (recipe.mixup, recipe.cutmix) == (0.0, 1.0) and recipe.lr_base / recipe.lr_base_batch == 1e-3 / 1024
    _, data, trees, stores = released
    store = TokenLabelStore(stores['relabel'])
    rows = [0, 9, 17]
    maps = [store.read(row) for row in rows]
    box = torch.tensor([[0.1, 0.2, 0.9, 0.7]] * 3)
    batch = {'scores': torch.stack([torch.from_numpy(s) for s, _ in maps]),
             'classes': torch.stack([torch.from_numpy(c.astype(np.int64)) for _, c in maps]),
             'geometry': (box, torch.zeros(3, dtype=torch.bool), torch.eye(3)[:2].expand(3, 2, 3)),
             'extent': torch.tensor([[-1.0, -1.0, 1.0, 1.0]] * 3), 'has_map': torch.ones(3, dtype=torch.bool),
             'label': torch.tensor([0, 1, 2])}
    objective = make_objective(recipe, 3)
    torch.manual_seed(0)
    np.random.seed(0)
    images = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 3, 16, 16)
    mixed, lam = objective.prepare(images, batch['label'])
    kept = mixed[0] == 0
    assert 0 < lam < 1 and kept.float().mean().item() == pytest.approx(lam, abs=1e-6)
    assert (mixed[0][~kept] == 2).all()  # the box comes from image B-1-i
    logits = torch.randn(3, 3)
    pooled = []
    paths = list(store.paths)  # in row order
    for row in rows:
        wnid, name = Path(paths[row]).parts[1:]
        value = torch.load(trees['relabel'] / wnid / f'{Path(name).stem}.pt', weights_only=True)
        box_cells = torch.tensor([0.1 * 15, 0.2 * 15, 0.9 * 15, 0.7 * 15])
        target = roi_align(reference_dense_map(value, 3)[None], [box_cells[None]], (1, 1), 1.0, 8, True).flatten()
        pooled.append(target * 0.9 + 0.1 / 3)
    pooled = torch.stack(pooled)
    expected = soft_cross_entropy(logits, lam * pooled + (1 - lam) * pooled.flip(0))
    torch.testing.assert_close(objective.loss(logits, batch, lam, torch.device('cpu')), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('preset', ['relabel', 'relabel-mixtoken'])
def test_relabel_presets_train_lvvit_on_an_imported_store(released, tmp_path, preset):
    _, data, _, stores = released
    result = run_tool('train_cls.py', [*TINY_LVVIT, '--data-dir', data, '--token-label-dir', stores['tokenlabeling'],
                                       '--preset', preset, '--output', tmp_path / 'run', '--img-size', '32',
                                       '--batch-size', '4', '--epochs', '2', '--warmup-epochs', '0', '--workers', '0',
                                       '--device', 'cpu'])
    assert result.returncode == 0, result.stderr[-2000:]
    checkpoint = torch.load(tmp_path / 'run' / 'last.pth', weights_only=True)
    has_token_head = any(key.startswith('aux_head') for key in checkpoint['state_dict'])
    assert has_token_head == (preset == 'relabel-mixtoken') and checkpoint['args']['preset'] == preset
    refused = run_tool('train_cls.py', [*TINY_LVVIT, '--data-dir', data, '--preset', preset, '--output',
                                        tmp_path / 'other', '--device', 'cpu'])
    assert refused.returncode == 2 and '--token-label-dir' in refused.stderr
