"""Token-label generation: values against an independent computation, resume, torchrun sharding, clear errors."""
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import torchvision.transforms.functional as TF
from PIL import Image

import backbones
from backbones import CheckpointError
from backbones.common.distributed import DistInfo
from backbones.common.errors import DataError, UsageError
from backbones.common.images import ImageReadError
from classification.data.augment import TrainTransform
from classification.data.folders import ImageFolderDataset, collate_skipping
from classification.token_labeling.annotate import dense_scores, generate_token_labels
from classification.token_labeling.label_store import DONE, TokenLabelError, TokenLabelStore, shard_marker
from classification.token_labeling.released_labels import import_released_labels
from helpers.cls_data import CLASSES, make_image_folder
from helpers.commands import run_tool, run_torchrun
from helpers.label_stores import assert_same_annotation, read_store

ANNOTATOR = 'resnet10t'
KWARGS = {'output_stride': 16}


@pytest.fixture(scope='module')
def annotated(tmp_path_factory):
    """A folder, a random-weight CNN annotator checkpoint, and its complete store (shards of 5 images)."""
    tmp = tmp_path_factory.mktemp('labels')
    data = make_image_folder(tmp / 'data')
    torch.manual_seed(0)
    model = timm.create_model(ANNOTATOR, num_classes=3, **KWARGS)
    torch.save({'state_dict': model.state_dict()}, tmp / 'annotator.pth')
    store = tmp / 'store'
    generate_token_labels(data, ANNOTATOR, store, DistInfo(), checkpoint=str(tmp / 'annotator.pth'), img_size=64,
                          topk=2, workers=0, shard_size=5, model_kwargs=KWARGS)
    return tmp, data, model.eval(), store


def independent_top_k(model, path: Path, k: int):
    """Whole image squashed to 64x64, normalised, the fc layer at every position of the last feature map."""
    img = Image.open(path).convert('RGB').resize((64, 64), Image.BICUBIC)
    cfg = model.pretrained_cfg
    x = TF.normalize(TF.to_tensor(img), cfg['mean'], cfg['std'])[None]
    with torch.no_grad():
        logits = model.fc(model.forward_features(x).permute(0, 2, 3, 1))[0]
    return logits.topk(k, dim=-1)


def test_store_holds_the_annotators_top_k_for_every_image(annotated):
    _, data, model, root = annotated
    store = TokenLabelStore(root)
    paths = sorted(p.relative_to(data).as_posix() for p in (data / 'train').rglob('*') if p.is_file())
    assert sorted(store.paths) == paths
    assert store.grid == (4, 4) and store.meta['topk'] == 2
    for path in paths[::7]:
        scores, classes = store.read(store.row_of(path))
        top = independent_top_k(model, data / path, 2)
        np.testing.assert_allclose(scores.astype(np.float32), top.values.numpy(), rtol=2e-3, atol=2e-3)
        assert (classes == top.indices.numpy()).all()
    assert 'whole image' in store.meta['preprocessing']


def test_an_annotator_checkpoint_of_ours_labels_at_the_size_it_was_trained_at(annotated, tmp_path):
    """A checkpoint of train_cls records its input size (64 px here): without --img-size the annotator labels at
    it, as the store made at 64 px explicitly (the model's own 224 px gave other maps)."""
    tmp, data, model, reference = annotated
    torch.save({'state_dict': model.state_dict(), 'args': {'classes': list(CLASSES), 'img_size': 64}},
               tmp_path / 'ours.pth')
    meta = generate_token_labels(data, ANNOTATOR, tmp_path / 'store', DistInfo(), checkpoint=str(tmp_path / 'ours.pth'),
                                 topk=2, workers=0, shard_size=5, model_kwargs=KWARGS)
    assert meta['img_size'] == 64 and meta['grid'] == [4, 4]
    for ours, theirs in zip(read_store(tmp_path / 'store'), read_store(reference)):
        np.testing.assert_array_equal(ours, theirs)


def test_dense_scores_of_a_token_model_use_every_patch_token():
    model = backbones.create_model('deit_small_patch16_224', num_classes=6, embed_dim=32, depth=1, num_heads=2).eval()
    x = torch.randn(2, 3, 64, 64)
    features = model.forward_features(x)
    expected = model.head(features[:, 1:]).view(2, 4, 4, 6)
    torch.testing.assert_close(dense_scores(model, x), expected)


def test_interrupted_generation_resumes_without_redoing_finished_shards(annotated, tmp_path):
    tmp, data, _, _ = annotated
    broken = tmp_path / 'data'
    make_image_folder(broken)
    victim = sorted((broken / 'train' / 'n002').iterdir())[1]
    victim.write_bytes(b'not an image')
    store = tmp_path / 'store'
    args = dict(checkpoint=str(tmp / 'annotator.pth'), img_size=64, topk=2, workers=0, shard_size=5,
                model_kwargs=KWARGS)
    with pytest.raises(ImageReadError, match=victim.name):
        generate_token_labels(broken, ANNOTATOR, store, DistInfo(), **args)
    with pytest.raises(TokenLabelError, match='incomplete'):
        TokenLabelStore(store)
    finished = {p.name: p.stat().st_mtime_ns for p in (store / DONE).iterdir()}
    assert 0 < len(finished) < 5

    make_image_folder(broken)  # the file is repaired; the same command, even without --shard-size, finishes the job
    del args['shard_size']
    generate_token_labels(broken, ANNOTATOR, store, DistInfo(), **args)
    after = {p.name: p.stat().st_mtime_ns for p in (store / DONE).iterdir()}
    assert len(after) == 5 and all(after[name] == t for name, t in finished.items())
    resumed, reference = TokenLabelStore(store), TokenLabelStore(annotated[3])
    for row in range(len(reference)):
        np.testing.assert_array_equal(resumed.read(row)[1], reference.read(row)[1])


@pytest.mark.slow
def test_torchrun_sharded_generation_equals_one_process(annotated, tmp_path):
    tmp, data, _, reference_root = annotated
    out = tmp_path / 'store'
    result = run_torchrun('generate_token_labels.py', [
        '--data-dir', data, '--annotator', ANNOTATOR, '--checkpoint', tmp / 'annotator.pth', '--output', out,
        '--img-size', '64', '--topk', '2', '--workers', '0', '--shard-size', '5', '--device', 'cpu',
        '--model-kwargs', 'output_stride=16'], processes=2)
    assert 'every image has its row' in result.stdout
    sharded, reference = TokenLabelStore(out), TokenLabelStore(reference_root)
    assert sharded.paths == reference.paths
    for row in range(len(reference)):
        np.testing.assert_allclose(sharded.read(row)[0].astype(np.float32),
                                   reference.read(row)[0].astype(np.float32), atol=1e-3)


def test_generation_refuses_to_mix_two_annotations(annotated):
    tmp, data, _, store = annotated
    common = dict(checkpoint=str(tmp / 'annotator.pth'), img_size=64, workers=0, model_kwargs=KWARGS)
    with pytest.raises(TokenLabelError, match=r'topk=2.*topk=3'):
        generate_token_labels(data, ANNOTATOR, store, DistInfo(), topk=3, shard_size=5, **common)
    # Another shard size would pair the finished-shard markers with other rows: refused, naming both values.
    with pytest.raises(TokenLabelError, match=r'shard_size=5.*shard_size=7'):
        generate_token_labels(data, ANNOTATOR, store, DistInfo(), topk=2, shard_size=7, **common)
    with pytest.raises(UsageError, match='--topk must be at least 1'):
        generate_token_labels(data, ANNOTATOR, store, DistInfo(), topk=0, **common)
    assert TokenLabelStore(store).meta['shard_size'] == 5


def test_bf16_generation_keeps_the_fp32_top_5(tmp_path):
    """--amp bf16: the scores within 2% of the largest, the top-5 classes the same wherever fp32's scores are clear
    of ties and at 95% of all positions and ranks (measured: 98-99% on random-weight annotators)."""
    data = make_image_folder(tmp_path / 'data', per_class={'train': 1}, size=64,
                             classes=[f'n{i:03d}' for i in range(10)])  # bf16 runs slowly on CPUs: 640 positions
    torch.manual_seed(0)
    torch.save(timm.create_model(ANNOTATOR, num_classes=10, **KWARGS).state_dict(), tmp_path / 'annotator.pth')
    common = dict(checkpoint=str(tmp_path / 'annotator.pth'), img_size=128, topk=5, workers=0, model_kwargs=KWARGS)
    for amp in ('none', 'bf16'):
        meta = generate_token_labels(data, ANNOTATOR, tmp_path / amp, DistInfo(), amp=amp, **common)
        assert meta['amp'] == amp and tuple(meta['grid']) == (8, 8)
    assert_same_annotation(tmp_path / 'none', tmp_path / 'bf16', tolerance=0.02, agreement=0.95)
    assert not np.array_equal(*(np.load(tmp_path / amp / 'scores.npy') for amp in ('none', 'bf16')))  # bf16 ran
    with pytest.raises(TokenLabelError, match=r"amp='none'.*amp='bf16'"):
        generate_token_labels(data, ANNOTATOR, tmp_path / 'none', DistInfo(), amp='bf16', **common)
    with pytest.raises(UsageError, match='--amp must be one of none, bf16'):
        generate_token_labels(data, ANNOTATOR, tmp_path / 'none', DistInfo(), amp='fp16', **common)


def test_store_made_before_amp_was_recorded_is_finished_as_fp32(annotated, tmp_path):
    tmp, data, _, root = annotated
    old = Path(shutil.copytree(root, tmp_path / 'old'))
    meta = json.loads((old / 'meta.json').read_text())
    del meta['amp']
    (old / 'meta.json').write_text(json.dumps({**meta, 'complete': False}))
    shard_marker(old, 1).unlink()
    common = dict(checkpoint=str(tmp / 'annotator.pth'), img_size=64, topk=2, workers=0, model_kwargs=KWARGS)
    with pytest.raises(TokenLabelError, match=r"amp='none'.*amp='bf16'"):
        generate_token_labels(data, ANNOTATOR, old, DistInfo(), amp='bf16', **common)
    assert generate_token_labels(data, ANNOTATOR, old, DistInfo(), **common)['complete']


def test_annotator_for_another_class_count_is_refused(annotated, tmp_path):
    tmp, data, _, _ = annotated
    torch.save(timm.create_model(ANNOTATOR, num_classes=5, **KWARGS).state_dict(), tmp_path / 'five.pth')
    with pytest.raises(CheckpointError, match='has 5 classes, the model 3'):
        generate_token_labels(data, ANNOTATOR, tmp_path / 'store', DistInfo(), checkpoint=str(tmp_path / 'five.pth'),
                              img_size=64, topk=2, workers=0, model_kwargs=KWARGS)


def test_damaged_stores_are_refused_naming_the_file(annotated, tmp_path):
    tmp, data, _, root = annotated
    truncated = Path(shutil.copytree(root, tmp_path / 'truncated'))
    (truncated / 'scores.npy').write_bytes((truncated / 'scores.npy').read_bytes()[:500])
    with pytest.raises(TokenLabelError, match='scores.npy'):
        TokenLabelStore(truncated)
    # Rows changed after their shard was written fail the verification that marks a store complete.
    altered = Path(shutil.copytree(root, tmp_path / 'altered'))
    classes = np.load(altered / 'classes.npy', mmap_mode='r+')
    classes[7] = (classes[7] + 1) % 3
    classes.flush()
    del classes
    with pytest.raises(TokenLabelError, match='rows 5-9 do not match'):
        generate_token_labels(data, ANNOTATOR, altered, DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                              img_size=64, topk=2, workers=0, model_kwargs=KWARGS)


def test_store_classes_must_be_the_data_sets_by_name(annotated, tmp_path):
    _, _, _, root = annotated
    renamed = make_image_folder(tmp_path / 'data')
    (renamed / 'train' / 'n003').rename(renamed / 'train' / 'n999')
    (renamed / 'val' / 'n003').rename(renamed / 'val' / 'n999')
    with pytest.raises(DataError, match=r'only in the token-label store .*: n003; only in .*: n999'):
        ImageFolderDataset(renamed, 'train', TrainTransform(32), label_store=TokenLabelStore(root))


def test_generation_can_skip_unreadable_images_and_lists_them(annotated, tmp_path):
    tmp, _, _, reference_root = annotated
    broken = make_image_folder(tmp_path / 'data')
    victim = sorted((broken / 'train' / 'n002').iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:60])  # truncated
    store = tmp_path / 'store'
    meta = generate_token_labels(broken, ANNOTATOR, store, DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                                 img_size=64, topk=2, workers=0, shard_size=5, model_kwargs=KWARGS,
                                 skip_unreadable=True)
    victim_path = victim.relative_to(broken).as_posix()
    assert meta['unreadable'] == [victim_path] == TokenLabelStore(store).meta['unreadable']
    labels, reference = TokenLabelStore(store), TokenLabelStore(reference_root)
    for row, path in enumerate(reference.paths):
        expected = reference.read(row)[1] * (path != victim_path)  # the unreadable image's row stays empty
        np.testing.assert_array_equal(labels.read(labels.row_of(path))[1], expected)


def test_generation_and_import_write_the_same_store_for_the_same_rows(annotated, tmp_path):
    """One writer behind generation and import: the rows an annotator gave, imported back as a released tree (an
    unreadable image at generation, a missing file at import: an empty row either way), make the same store file for
    file: arrays, image list, every shard's marker (its rows' digests, the paths it left empty)."""
    tmp, _, _, _ = annotated
    data = make_image_folder(tmp_path / 'data')
    victim = sorted((data / 'train' / 'n002').iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:60])  # truncated
    generated = tmp_path / 'generated'
    generate_token_labels(data, ANNOTATOR, generated, DistInfo(), checkpoint=str(tmp / 'annotator.pth'), img_size=64,
                          topk=2, workers=0, shard_size=5, model_kwargs=KWARGS, skip_unreadable=True)
    store = TokenLabelStore(generated)
    release = tmp_path / 'release'
    for row, path in enumerate(store.paths):
        if store.has_map(row):
            scores, classes = store.read(row)
            file = release / Path(path).relative_to('train').with_suffix('.pt')
            file.parent.mkdir(parents=True, exist_ok=True)
            torch.save(torch.stack([torch.from_numpy(scores), torch.from_numpy(classes.astype(np.float16))]).permute(
                0, 3, 1, 2).contiguous(), file)
    imported = tmp_path / 'imported'
    import_released_labels(data, release, imported, DistInfo(), fmt='relabel', workers=0, shard_size=5,
                           skip_missing=True)
    victim_path = victim.relative_to(data).as_posix()
    assert store.meta['unreadable'] == [victim_path] == TokenLabelStore(imported).meta['missing']
    for name in ('scores.npy', 'classes.npy', 'paths.txt'):
        assert (imported / name).read_bytes() == (generated / name).read_bytes(), name
    markers = sorted(path.name for path in (generated / DONE).iterdir())
    assert len(markers) == 5 and sorted(path.name for path in (imported / DONE).iterdir()) == markers
    for name in markers:
        assert json.loads((imported / DONE / name).read_text()) == json.loads((generated / DONE / name).read_text())


def test_training_set_errors_name_the_image(annotated, tmp_path):
    _, data, _, root = annotated
    copy = make_image_folder(tmp_path / 'data')
    extra = copy / 'train' / 'n003' / 'extra.png'
    Image.new('RGB', (40, 40)).save(extra)
    with pytest.raises(TokenLabelError, match='train/n003/extra.png'):
        ImageFolderDataset(copy, 'train', TrainTransform(32), label_store=TokenLabelStore(root))

    extra.unlink()
    bad = sorted((copy / 'train' / 'n001').iterdir())[0]
    bad.write_bytes(bad.read_bytes()[:40])  # truncated file
    strict = ImageFolderDataset(copy, 'train', TrainTransform(32), label_store=TokenLabelStore(root))
    index = list(strict.paths).index(f'train/n001/{bad.name}')
    with pytest.raises(ImageReadError, match=bad.name):
        strict[index]
    lenient = ImageFolderDataset(copy, 'train', TrainTransform(32), label_store=TokenLabelStore(root),
                                 skip_unreadable=True)
    batch = collate_skipping([lenient[index], lenient[index + 1]])
    assert batch['skipped'] == 1 and batch['image'].shape == (1, 3, 32, 32)
    assert batch['scores'].shape == (1, 4, 4, 2)


def test_a_file_name_the_image_list_cannot_hold_is_named(annotated, tmp_path):
    tmp, _, _, _ = annotated
    data = make_image_folder(tmp_path / 'data')
    odd = data / 'train' / 'n001' / 'two\nlines.png'
    Image.new('RGB', (40, 40)).save(odd, format='PNG')
    with pytest.raises(DataError, match='line break'):
        generate_token_labels(data, ANNOTATOR, tmp_path / 'store', DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                              img_size=64, topk=2, workers=0, model_kwargs=KWARGS)


def test_names_with_unicode_line_separators_or_other_bytes_are_listed_and_read_back(annotated, tmp_path):
    """U+2028, U+2029, U+0085 and a form feed end a line for `str.splitlines`, not for the store's list, and a name in
    Latin-1 (not UTF-8) is listed as its bytes: each image keeps its own row, the one the annotator's map of that image
    is in."""
    tmp, _, model, _ = annotated
    data = make_image_folder(tmp_path / 'data')
    names = ['a\u2028b.png', 'c\u2029d.png', 'e\x85f.png', 'g\x0ch.png', os.fsdecode(b'caf\xe9.png')]
    for i, name in enumerate(names):
        Image.fromarray(np.full((40, 40, 3), 40 * i, np.uint8)).save(data / 'train' / 'n002' / name, format='PNG')
    generate_token_labels(data, ANNOTATOR, tmp_path / 'store', DistInfo(), checkpoint=str(tmp / 'annotator.pth'),
                          img_size=64, topk=2, workers=0, shard_size=5, model_kwargs=KWARGS)
    store = TokenLabelStore(tmp_path / 'store')
    assert len(store.paths) == 12 * 2 + len(names)
    for name in names:
        scores, classes = store.read(store.row_of(f'train/n002/{name}'))
        top_scores, top_classes = independent_top_k(model, data / 'train' / 'n002' / name, 2)
        np.testing.assert_array_equal(classes, top_classes.numpy())
        np.testing.assert_allclose(scores, top_scores.numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.slow
def test_a_store_changed_after_it_was_made_is_refused_where_it_is_opened(annotated, tmp_path):
    """Two lines of paths.txt swapped, or five rows zeroed: opening the store (training, pictures) names the first
    bad shard; --no-verify (verify=False) opens it as it is."""
    _, data, _, root = annotated
    swapped = Path(shutil.copytree(root, tmp_path / 'swapped'))
    lines = (swapped / 'paths.txt').read_text().splitlines()
    lines[6], lines[7] = lines[7], lines[6]
    (swapped / 'paths.txt').write_text('\n'.join(lines) + '\n')
    with pytest.raises(TokenLabelError, match=r'paths.txt: lines 6-10 are not the image list .*shard 1'):
        TokenLabelStore(swapped)
    zeroed = Path(shutil.copytree(root, tmp_path / 'zeroed'))
    scores = np.load(zeroed / 'scores.npy', mmap_mode='r+')
    scores[12:17] = 0
    scores.flush()
    del scores
    with pytest.raises(TokenLabelError, match=r'rows 10-14 do not match what was written \(shard 2\).*--no-verify'):
        TokenLabelStore(zeroed)
    assert len(TokenLabelStore(zeroed, verify=False)) == len(lines)
    for store in (swapped, zeroed):
        result = run_tool('train_cls.py', ['deit_tiny_patch16_224', '--data-dir', data, '--token-label-dir', store,
                                           '--token-labeling', '--output', tmp_path / 'run', '--device', 'cpu'])
        assert result.returncode != 0 and str(store) in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and 'Traceback' not in result.stderr
