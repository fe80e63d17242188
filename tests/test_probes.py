"""The frozen-feature probes (classification/probes.py, tools/probe_features.py): DINOv2's weighted k-NN vote against
an independent NumPy one and a hand-computed case, the linear heads trained together as each would alone, the held-out
draw, and the tool end to end on a tiny ImageNet-layout folder."""
import json

import numpy as np
import pytest
import timm
import torch

from backbones.common.errors import CheckpointError
from classification import probes
from classification.probes import Features, HeadSpec, ProbeSettings, hold_out_part, knn_predictions
from helpers.cls_data import make_image_folder
from helpers.commands import one_line_error, run_tool, succeeded
from helpers.models import TINY_DEIT


def numpy_weighted_vote(train: np.ndarray, labels: np.ndarray, queries: np.ndarray, k: int, num_classes: int,
                        temperature: float) -> np.ndarray:
    """The vote written out plainly, one query at a time, in float64: sort by cosine similarity, add exp(sim / T)
    to each of the k nearest neighbours' class."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    predictions = []
    for query in queries:
        similarity = train @ (query / np.linalg.norm(query))
        scores = np.zeros(num_classes)
        for j in np.argsort(-similarity, kind='stable')[:k]:
            scores[labels[j]] += np.exp(similarity[j] / temperature)
        predictions.append(int(np.argmax(scores)))
    return np.array(predictions)


@pytest.mark.parametrize('temperature', [0.07, 0.5])
def test_knn_votes_as_an_independent_numpy_vote(temperature):
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 16))
    labels = rng.integers(0, 5, 300)
    train = centres[labels] + rng.normal(scale=1.5, size=(300, 16))  # overlapping classes: the vote matters
    query_labels = rng.integers(0, 5, 80)
    queries = centres[query_labels] + rng.normal(scale=1.5, size=(80, 16))
    ks = [1, 10, 20, 100, 200]
    found = knn_predictions(torch.from_numpy(train), torch.from_numpy(labels), torch.from_numpy(queries), ks, 5,
                            temperature, chunk=33)
    accuracies = set()
    for k in ks:
        expected = numpy_weighted_vote(train, labels, queries, k, 5, temperature)
        np.testing.assert_array_equal(found[k].numpy(), expected)
        accuracies.add(float((expected == query_labels).mean()))
    assert len(accuracies) > 1  # the k's give different answers: the comparison covers the cut at k


def test_knn_known_answer_by_hand():
    """Query (1, 0); neighbours (1, 0) of class 0 (similarity 1) and (0.8, +-0.6) of class 1 (0.8 each). k=1: class
    0. k=3 at T=1: class 1, as 2 e^0.8 = 4.45 > e^1 = 2.72; at T=0.07: class 0, as e^(1/0.07) > 2 e^(0.8/0.07)."""
    train = torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.8, -0.6]])
    labels, query = torch.tensor([0, 1, 1]), torch.tensor([[3.0, 0.0]])  # any length: cosine similarity
    assert knn_predictions(train, labels, query, [1, 3], 2, temperature=1.0) == {1: 0, 3: 1}
    assert knn_predictions(train, labels, query, [1, 3], 2, temperature=0.07)[3].item() == 0


def test_knn_with_flat_weights_is_scikit_learns_uniform_cosine_vote():
    from sklearn.neighbors import KNeighborsClassifier
    rng = np.random.default_rng(1)
    train, labels, queries = rng.normal(size=(120, 8)), rng.integers(0, 2, 120), rng.normal(size=(40, 8))
    for k in (1, 5, 15):  # odd k, two classes: no tied votes
        uniform = KNeighborsClassifier(k, metric='cosine', weights='uniform').fit(train, labels).predict(queries)
        found = knn_predictions(torch.from_numpy(train), torch.from_numpy(labels), torch.from_numpy(queries), [k], 2,
                                temperature=1e9)
        np.testing.assert_array_equal(found[k].numpy(), uniform)


def test_k_over_the_training_features_is_capped_and_said(caplog):
    assert probes.capped_ks([10, 20, 100, 200], 50) == [10, 20, 50]
    assert 'k 100, 200 > the 50 training features: capped at 50' in caplog.text


def test_a_head_trained_among_all_learns_what_it_learns_alone():
    rng = np.random.default_rng(2)
    inputs = {'cls1': torch.from_numpy(rng.normal(size=(90, 12)).astype(np.float32)),
              'cls1+avgpool': torch.from_numpy(rng.normal(size=(90, 20)).astype(np.float32))}
    labels = torch.from_numpy(rng.integers(0, 4, 90))
    specs = [HeadSpec(variant, lr) for variant in inputs for lr in (0.01, 0.1, 1.0)]
    together = probes.train_linear_heads(inputs, labels, specs, 4, epochs=3, batch_size=16, seed=5)
    alone = probes.train_linear_heads(inputs, labels, specs[4:5], 4, epochs=3, batch_size=16, seed=5)[0]
    assert torch.equal(together[4].weight, alone.weight) and torch.equal(together[4].bias, alone.bias)
    assert not torch.equal(together[3].weight[:, :12], together[0].weight)  # other lr, other variant: other heads
    other_seed = probes.train_linear_heads(inputs, labels, specs[4:5], 4, epochs=3, batch_size=16, seed=6)[0]
    assert not torch.allclose(other_seed.weight, alone.weight)
    untrained = probes.new_head(20, 4, seed=5)
    assert not torch.allclose(untrained.weight, alone.weight)  # it did train


def test_the_held_out_part_is_disjoint_stratified_and_seeded():
    labels = torch.from_numpy(np.repeat(np.arange(4), [30, 50, 10, 20]))
    features = Features(torch.arange(len(labels), dtype=torch.float32)[:, None], None, None, labels)
    fit, held = hold_out_part(features, ProbeSettings(held_out=0.1, split_seed=3))
    fit_rows, held_rows = set(fit.pooled[:, 0].tolist()), set(held.pooled[:, 0].tolist())
    assert fit_rows.isdisjoint(held_rows) and len(fit_rows | held_rows) == len(labels)
    assert np.bincount(held.labels.numpy()).tolist() == [3, 5, 1, 2]
    again = hold_out_part(features, ProbeSettings(held_out=0.1, split_seed=3))[1]
    other = hold_out_part(features, ProbeSettings(held_out=0.1, split_seed=4))[1]
    assert torch.equal(again.pooled, held.pooled) and not torch.equal(other.pooled, held.pooled)


TINY_PROBE = [*TINY_DEIT[:2], 'embed_dim=32', 'depth=4', 'num_heads=2', '--img-size', '32', '--workers', '0']


def test_the_tool_probes_a_tiny_folder_end_to_end(tmp_path):
    data = make_image_folder(tmp_path / 'data', {'train': 10, 'val': 4})
    out = tmp_path / 'probes.json'
    result = succeeded(run_tool('probe_features.py', [*TINY_PROBE, '--data-dir', data, '--json', out, '--epochs', '2',
                                                      '--lrs', '0.01', '0.1']))
    assert 'capped at 27' in result.stdout + result.stderr  # 30 training images, 3 held out
    results = json.loads(out.read_text())
    assert 'held-out 0.1 of each class of the training split' in results['chosen_on']
    assert results['test_split'] == 'val' and results['knn']['ks'] == [10, 20, 27]
    grid = results['linear']['grid']
    assert [row['features'] for row in grid[::2]] == ['cls1', 'cls4', 'cls1+avgpool', 'cls4+avgpool']
    accuracies = [*results['knn']['held_out'].values(), *results['knn']['test'].values(),
                  *(row['held_out'] for row in grid), results['linear']['chosen']['test']]
    assert all(0 <= a <= 100 for a in accuracies)
    assert results['knn']['chosen']['test'] == results['knn']['test'][str(results['knn']['chosen']['k'])]


def test_an_unknown_model_and_an_empty_split_are_one_line(tmp_path):
    data = make_image_folder(tmp_path / 'data', {'train': 4})
    (tmp_path / 'data' / 'val' / 'n001').mkdir(parents=True)
    assert 'no_such_model' in one_line_error(run_tool('probe_features.py', ['no_such_model', '--data-dir', data]))
    empty = one_line_error(run_tool('probe_features.py', [*TINY_PROBE, '--data-dir', data]))
    assert f'{data / "val"} has no class folders with images' in empty


def test_a_segmentors_checkpoint_is_refused_as_eval_cls_refuses_it(tmp_path):
    from mmengine.logging import HistoryBuffer

    from helpers.models import tiny_release
    model, _ = tiny_release('deit_small_patch16_224', tmp_path)
    path = tmp_path / 'iter_160.pth'
    torch.save({'meta': {'buffer': HistoryBuffer()}, 'state_dict': model.state_dict()}, path)
    data = make_image_folder(tmp_path / 'data', {'train': 4, 'val': 2})
    with pytest.raises(CheckpointError, match=r"an mmengine checkpoint \(a segmentor's"):
        probes.main(['deit_small_patch16_224', '--checkpoint', str(path), '--data-dir', str(data), '--workers', '0'])


def test_a_class_token_model_of_fewer_than_four_blocks_keeps_its_mean_patch_token():
    """Two blocks: no 4-block class tokens, but the last block's normalised patch tokens' mean (the +avgpool variants)
    as for a deeper model: timm's own forward_intermediates, averaged."""
    from classification.probes import extract_features
    model = timm.create_model('deit_tiny_patch16_224', img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                              num_classes=0).eval()
    images = torch.randn(3, 3, 32, 32)
    features = extract_features(model, [{'image': images, 'label': torch.tensor([0, 1, 2])}], torch.device('cpu'))
    assert features.blocks is None
    _, patches = model.forward_intermediates(images, indices=1, norm=True, output_fmt='NLC')
    torch.testing.assert_close(features.patch_mean, patches[-1].mean(dim=1))


def test_heads_trained_from_the_feature_cache_are_those_trained_live(tmp_path):
    """The cache's features are bit-identical to those extracted live, so the heads (same seed, fp32 CPU) train to
    the same weights."""
    from argparse import Namespace

    from classification.data.folders import ImageFolderDataset, config_eval_transform
    from classification.feature_cache import cached_features, feature_identity, weights_digest

    data = make_image_folder(tmp_path / 'data', {'train': 10})
    torch.manual_seed(0)
    model = timm.create_model('deit_tiny_patch16_224', num_classes=0, img_size=32, embed_dim=32, depth=4,
                              num_heads=2).eval()
    data_cfg = dict(input_size=(3, 32, 32), crop_pct=0.875, interpolation='bicubic', mean=(0.5,) * 3,
                    std=(0.5,) * 3)
    dataset = ImageFolderDataset(data, 'train', config_eval_transform(data_cfg))
    args = Namespace(batch_size=8, workers=0)
    identity = feature_identity({'name': 'deit_tiny'}, weights_digest(model), data_cfg, dataset.data_dir, dataset.paths,
                                dataset.labels)

    def extracted() -> Features:
        return probes.split_features(model, dataset, args, torch.device('cpu'))

    live = extracted()
    written = Features(**cached_features(tmp_path / 'train.pt', identity, lambda: vars(extracted())))
    read = Features(**cached_features(tmp_path / 'train.pt', identity, lambda: pytest.fail('extracted again')))
    for name in ('pooled', 'blocks', 'patch_mean', 'labels'):
        assert torch.equal(getattr(read, name), getattr(live, name)) and torch.equal(getattr(written, name),
                                                                                     getattr(live, name)), name
    heads = []
    for features in (live, read):
        inputs = probes.linear_inputs(features)
        specs = [HeadSpec(variant, 0.1) for variant in inputs]
        heads.append(probes.train_linear_heads(inputs, features.labels, specs, 3, epochs=2, batch_size=8, seed=0))
    assert all(torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias) for a, b in zip(*heads))


def test_the_weights_digest_is_sha256_over_every_tensor_a_zero_dimensional_count_included():
    """Known answer by hashlib over the tensors' NumPy bytes; a batch norm's 0-d step count is hashed (it once
    stopped the digest of every model with a batch norm, LV-ViT's stem among them)."""
    import hashlib

    from classification.feature_cache import weights_digest

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))
    expected = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        expected.update(f'{name} {tensor.dtype} {tuple(tensor.shape)}\n'.encode())
        expected.update(np.ascontiguousarray(tensor.numpy()).tobytes())
    assert weights_digest(model) == expected.hexdigest()
    model[1].num_batches_tracked += 1
    assert weights_digest(model) != expected.hexdigest()


def test_the_tool_reads_its_feature_cache_and_refuses_a_stale_one(tmp_path):
    """--feature-cache: the second run reads each split's features (the same results); a cache made by other
    weights, by another pipeline or of changed images is refused naming what differs, and left as it was."""
    data = make_image_folder(tmp_path / 'data', {'train': 10, 'val': 4})
    cache = tmp_path / 'cache'
    run = [*TINY_PROBE, '--data-dir', data, '--epochs', '2', '--lrs', '0.01', '0.1', '--feature-cache', cache,
           '--json', tmp_path / 'probes.json']
    first = succeeded(run_tool('probe_features.py', run))
    live = json.loads((tmp_path / 'probes.json').read_text())
    again = succeeded(run_tool('probe_features.py', run))
    assert f'features written to {cache / "train.pt"}' in first.stdout + first.stderr
    assert f'features read from {cache / "val.pt"}' in again.stdout + again.stderr
    assert json.loads((tmp_path / 'probes.json').read_text()) == live

    before = (cache / 'train.pt').read_bytes()
    for change, says in ((['--seed', '1'], 'weights'), (['--crop-pct', '0.5'], 'pipeline')):
        message = one_line_error(run_tool('probe_features.py', [*run, *change]))
        assert f'{cache / "train.pt"}: a feature cache whose {says} differ from this run\'s' in message
    image = sorted((data / 'train').rglob('*.*'))[0]
    image.write_bytes(image.read_bytes() + b'\0')  # the same name, other bytes
    assert 'a feature cache whose images differ' in one_line_error(run_tool('probe_features.py', run))
    assert (cache / 'train.pt').read_bytes() == before
    torch.save([1, 2, 3], cache / 'val.pt')  # a torch file of something else
    (cache / 'train.pt').unlink()
    assert f'{cache / "val.pt"}: not a feature cache' in one_line_error(run_tool('probe_features.py', run))
    assert 'is a file' in one_line_error(run_tool('probe_features.py', [*run[:-4], '--feature-cache', image]))
