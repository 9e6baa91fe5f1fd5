"""The corpus of timm and torchvision architectures (:mod:`tvm_pesto.zoo.corpus`) and the
bench's model sources (:mod:`tvm_pesto.bench.sources`): every architecture builds at both
sizes' shapes, a model that fails is a row with its error."""
import functools

import numpy as np
import pytest
import torch

from tvm_pesto.bench.sources import ModelSource, bench_source, failed_row, run_isolated
from tvm_pesto.errors import GraphError
from tvm_pesto.zoo import corpus


def test_the_corpus_covers_the_families_users_bring():
    assert len(corpus.CORPUS) >= 30
    for family in ("ResNet", "RegNet", "EfficientNet", "MobileNetV3", "ConvNeXt", "ViT", "DeiT", "Swin", "BEiT",
                   "MLP-Mixer"):
        assert family in corpus.families()
    assert {a.library for a in corpus.CORPUS.values()} == {"timm", "torchvision"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(corpus.CORPUS))
def test_every_architecture_builds_small_with_random_weights_and_runs(name):
    arch = corpus.CORPUS[name]
    model, (x,) = arch.build("small")
    assert x.shape == arch.input_shape("small") and x.dtype == np.float32
    with torch.no_grad():
        y = model(torch.from_numpy(x))
    assert y.shape[0] == 1 and torch.isfinite(y).all()
    again, _ = arch.build("small")  # seeded: the same weights again
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_full_is_the_architectures_default_input():
    assert corpus.CORPUS["vit_base_patch16_224"].input_shape("full") == (1, 3, 224, 224)
    assert corpus.CORPUS["inception_v3"].input_shape("full") == (1, 3, 299, 299)
    assert corpus.CORPUS["squeezenet1_1"].input_shape("full") == (1, 3, 224, 224)
    with pytest.raises(GraphError, match="unknown corpus size 'huge'"):
        corpus.CORPUS["resnet18"].input_shape("huge")


def test_unknown_names_and_folders_are_named_in_the_error(tmp_path):
    with pytest.raises(GraphError, match="'resnet9000' is not in the corpus; corpus models: resnet18"):
        corpus.load("resnet9000")
    with pytest.raises(GraphError, match="does not exist"):
        corpus.model_files(tmp_path / "nowhere")
    with pytest.raises(GraphError, match="holds no .onnx or .pt2 file"):
        corpus.model_files(tmp_path)
    (tmp_path / "b.onnx").write_bytes(b"")
    (tmp_path / "a.pt2").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("")
    assert [p.rsplit("/", 1)[1] for p in corpus.model_files(tmp_path)] == ["a.pt2", "b.onnx"]


def _row(model, inputs, mod, onnx_path, *, seen):
    seen.append((type(model).__name__, inputs[0].shape, onnx_path))
    return {"ok": True}


def test_a_model_that_fails_to_load_is_a_row_with_its_error(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not an onnx file")
    seen = []
    row = bench_source(ModelSource("file", str(bad)).load, functools.partial(_row, seen=seen))
    assert row["error"].startswith("load: ") and "broken.onnx" in row["error"] and not seen
    assert row == failed_row(row["error"]) and row["ratio_vs_best_peer"] is None
    row = bench_source(ModelSource("corpus", "resnet18", "small").load, functools.partial(_row, seen=seen))
    assert row == {"ok": True} and seen == [("ResNet", (1, 3, 64, 64), None)]


def _crash(model, inputs, mod, onnx_path):
    import os

    os.abort()


def _hang(model, inputs, mod, onnx_path):
    import time

    time.sleep(600)


@pytest.mark.slow
def test_an_isolated_model_that_crashes_or_hangs_is_a_row_and_the_run_goes_on():
    source = ModelSource("outside", "vit", "small")
    crashed = run_isolated(source, _crash, timeout_s=300)
    assert crashed["error"].startswith("the process benching the model died (exit code -6)")
    hung = run_isolated(source, _hang, timeout_s=5)  # killed asleep, or still loading: a row either way
    assert hung["error"] == "timed out after 5 s (--model-timeout)"
    loaded = run_isolated(ModelSource("corpus", "no_such_model"), _crash, timeout_s=300)
    assert loaded["error"].startswith("load: ") and "not in the corpus" in loaded["error"]


def test_a_pt2_file_gives_the_peers_an_onnx_export_of_its_program(tmp_path):
    import onnxruntime as ort

    from tvm_pesto.zoo.export import to_onnx

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    x = torch.rand(1, 3, 8, 8)
    torch.export.save(torch.export.export(net, (x,)), tmp_path / "net.pt2")
    model, inputs, mod, onnx_path = ModelSource("file", str(tmp_path / "net.pt2")).load()
    assert onnx_path is None and mod is not None  # the peers export the program themselves
    path = to_onnx(model, [np.asarray(a) for a in inputs], tmp_path / "net.onnx")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    got, = sess.run(None, {"x": np.asarray(inputs[0])})
    want = net(torch.from_numpy(np.asarray(inputs[0]))).detach().numpy()
    assert np.abs(got - want).max() < 1e-5
