"""tvm_pesto.models.load_model: zoo names and model files (ONNX, .pt2, TVMScript), input shapes, errors.

The models outside the zoo come from tests/outside_zoo.py at their small size; their files are
written once per module. Each file form must load, compile with TVM and match PyTorch.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import tvm

import outside_zoo as oz
from tvm_pesto import zoo
from tvm_pesto.errors import GraphError, PestoError, UnsupportedModuleError
from tvm_pesto.frontend import INT_INPUT_RANGE, check_static
from tvm_pesto.models import SUFFIXES, LoadedModel, load_model, parse_input_shapes

pytestmark = pytest.mark.slow  # model files exported and imported in every form: out of the `-m "not slow"` lane


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every outside-zoo model as ONNX and .pt2; one as TVMScript (.py and .tvmscript);
    convnext with a dynamic batch axis in both exported forms."""
    d = tmp_path_factory.mktemp("models")
    out = {}
    for name in oz.list_models():
        out[name, "onnx"] = oz.write_onnx(name, d)
        out[name, "pt2"] = oz.write_pt2(name, d)
    out["text_encoder", "py"] = oz.write_tvmscript("text_encoder", d, suffix=".py")
    out["text_encoder", "tvmscript"] = oz.write_tvmscript("text_encoder", d, suffix=".tvmscript")
    out["convnext", "onnx_dynamic"] = oz.write_onnx("convnext", d, dynamic_batch=True)
    out["convnext", "pt2_dynamic"] = oz.write_pt2("convnext", d, dynamic_batch=True)
    out["dir"] = str(d)
    return out


def assert_matches_torch(m: LoadedModel, name: str) -> None:
    model, _ = oz.build(name, "small")
    ref = oz.torch_output(model, m.example_inputs)
    out = oz.tvm_output(m.mod, m.example_inputs)
    scale = float(np.abs(ref).max())
    assert out.shape == ref.shape
    assert scale > 0.05, scale  # a vanishing output would make the comparison vacuous
    assert np.abs(out - ref).max() <= 1e-4 * max(1.0, scale)


FORMS = [(name, form) for name in oz.list_models() for form in ("onnx", "pt2")]
FORMS += [("text_encoder", "py"), ("text_encoder", "tvmscript")]


@pytest.mark.parametrize("name,form", FORMS, ids=[f"{n}-{f}" for n, f in FORMS])
def test_file_forms_match_torch(files, name, form):
    path = files[name, form]
    m = load_model(path)
    assert (m.source, m.path, m.name) == ({"py": "tvmscript", "tvmscript": "tvmscript"}.get(form, form), path,
                                          os.path.splitext(os.path.basename(path))[0])
    check_static(m.mod)
    assert m.input_names == [oz.input_name(name)]
    (x,) = m.example_inputs
    (expected,) = oz.build(name, "small")[1]
    assert (x.shape, x.dtype) == (expected.shape, expected.dtype)
    assert_matches_torch(m, name)


def test_example_inputs_are_seeded_and_in_range(files):
    ids = load_model(files["text_encoder", "onnx"]).example_inputs[0]
    assert ids.dtype == np.int64 and INT_INPUT_RANGE[0] <= ids.min() and ids.max() < INT_INPUT_RANGE[1]
    a = load_model(files["vit", "pt2"], seed=3).example_inputs[0]
    b = load_model(files["vit", "pt2"], seed=3).example_inputs[0]
    c = load_model(files["vit", "pt2"], seed=4).example_inputs[0]
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert abs(float(a.std()) - 1.0) < 0.1  # ~N(0, 1)


def test_zoo_name_keeps_zoo_module_and_inputs():
    zm = zoo.load("mlp_mixer", "small")
    m = load_model("mlp_mixer")
    assert (m.source, m.path, m.name) == ("zoo", None, "mlp_mixer")
    assert m.mod is zm.mod
    assert all(a is b for a, b in zip(m.example_inputs, zm.example_inputs))
    # a shape equal to the zoo's is accepted; a different one is refused with the fix
    assert load_model("mlp_mixer", input_shapes={"x": (1, 3, 96, 96)}).mod is zm.mod
    with pytest.raises(GraphError, match=r"axis 0 is fixed at 1.*--size"):
        load_model("mlp_mixer", input_shapes={"x": (2, 3, 96, 96)})


@pytest.mark.parametrize("form", ["onnx_dynamic", "pt2_dynamic"])
def test_dynamic_batch_needs_and_takes_input_shape(files, form):
    path = files["convnext", form]
    with pytest.raises(UnsupportedModuleError) as err:
        load_model(path)
    msg = str(err.value)
    assert path in msg and "'x'" in msg and "axis 0" in msg
    assert "--input-shape x=1,3,32,32" in msg
    if form == "onnx_dynamic":
        assert "'batch'" in msg  # the ONNX dim_param
    m = load_model(path, input_shapes={"x": (3, 3, 32, 32)})
    check_static(m.mod)
    assert m.example_inputs[0].shape == (3, 3, 32, 32)
    assert_matches_torch(m, "convnext")


def test_pt2_dynamic_batch_outside_exported_range(files):
    with pytest.raises(GraphError, match=r"outside the range \[1, 64\].*choose a value in it"):
        load_model(files["convnext", "pt2_dynamic"], input_shapes={"x": (65, 3, 32, 32)})


SYMBOLIC_SCRIPT = '''
from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Model:
    @R.function
    def main(x: R.Tensor(("n", 4), "float32"), y: R.Tensor(("n", 4), "float32")) -> R.Tensor(("n", 4), "float32"):
        with R.dataflow():
            z = R.add(R.nn.relu(x), y)
            R.output(z)
        return z
'''


def test_tvmscript_symbolic_shape_bound_by_input_shape(tmp_path):
    path = tmp_path / "symbolic.py"
    path.write_text(SYMBOLIC_SCRIPT)
    with pytest.raises(UnsupportedModuleError, match=r"input 'x' of .*symbolic.py has dynamic shape \(n, 4\) "
                                                     r"\(axis 0 is 'n'\).*--input-shape x=1,4"):
        load_model(str(path))
    m = load_model(str(path), input_shapes={"x": (5, 4)})  # binding n also fixes y
    assert [p.ty.shape.values[0].value for p in m.mod["main"].params] == [5, 5]
    x, y = m.example_inputs
    np.testing.assert_allclose(oz.tvm_output(m.mod, m.example_inputs), np.maximum(x, 0) + y, rtol=1e-6)
    with pytest.raises(GraphError, match="values 5 and 6; give it one value"):
        load_model(str(path), input_shapes={"x": (5, 4), "y": (6, 4)})


def test_py_file_with_several_modules_needs_a_name(tmp_path):
    path = tmp_path / "two.py"
    path.write_text(SYMBOLIC_SCRIPT + "\nOther = Model\n")
    with pytest.raises(GraphError, match=r"several IRModules \(Model, Other\); pick one as .*two.py:Model"):
        load_model(str(path))
    assert load_model(f"{path}:Other", input_shapes={"x": (2, 4)}).input_names == ["x", "y"]
    with pytest.raises(GraphError, match="no IRModule named 'Third'; its IRModules: Model, Other"):
        load_model(f"{path}:Third")


# --- errors: what was typed ------------------------------------------------------------------


def test_unknown_name_lists_zoo_and_suffixes():
    with pytest.raises(GraphError) as err:
        load_model("resnet")
    msg = str(err.value)
    assert "'resnet'" in msg and all(n in msg for n in zoo.list_models()) and all(s in msg for s in SUFFIXES)


def test_missing_file_and_unknown_suffix(tmp_path):
    with pytest.raises(GraphError, match=r"model file '.*missing.onnx' does not exist"):
        load_model(str(tmp_path / "missing.onnx"))
    weights = tmp_path / "model.h5"
    weights.write_bytes(b"\0")
    with pytest.raises(GraphError, match=r"'.*model.h5' has an unknown suffix '.h5'; use one of .onnx, .pt2"):
        load_model(str(weights))


@pytest.mark.parametrize("spec", ["x", "x=", "=1,2", "x=1,a", "x=0,3", "x=1,,2", "x=1x3"])
def test_malformed_input_shape(spec):
    with pytest.raises(GraphError, match=r"malformed --input-shape .*expected NAME=D1,D2,\.\.\..*x=1,3,224,224"):
        parse_input_shapes([spec])


def test_parse_input_shapes():
    assert parse_input_shapes(None) == {}
    assert parse_input_shapes(["x=1,3,32,32", " ids = 2, 16 "]) == {"x": (1, 3, 32, 32), "ids": (2, 16)}
    with pytest.raises(GraphError, match="gives input 'x' twice"):
        parse_input_shapes(["x=1,2", "x=1,3"])


def test_input_shape_for_unknown_input_lists_inputs(files):
    path = files["convnext", "onnx_dynamic"]
    with pytest.raises(GraphError, match=r"names 'image', which is not an input of .*; its inputs are: x \(batch, 3, 32, 32\)"):
        load_model(path, input_shapes={"image": (1, 3, 32, 32)})
    with pytest.raises(GraphError, match=r"has rank 2, but input 'x' .* \(rank 4\); give 4 dimensions"):
        load_model(path, input_shapes={"x": (1, 3)})
    with pytest.raises(GraphError, match=r"sets axis 2 to 64.*axis 2 is fixed at 32; only dynamic axes can be set"):
        load_model(path, input_shapes={"x": (1, 3, 64, 32)})


# --- errors: what the file holds ---------------------------------------------------------------


@pytest.mark.parametrize("form,parser_says", [("onnx", "DecodeError"), ("pt2", "BadZipFile"),
                                               ("tvmscript", "DiagnosticError"), ("py", "SyntaxError")])
def test_corrupt_file_names_file_and_parser_error(files, tmp_path, form, parser_says):
    data = open(files["text_encoder", form], "rb").read()
    if form in ("onnx", "pt2"):
        data = data[: len(data) // 3]  # truncated
    elif form == "tvmscript":
        data = data.replace(b"R.take(", b"R.takke(", 1)  # an op TVMScript does not know
    else:
        data = data[: len(data) - 200]  # cut inside the last statement
    path = tmp_path / f"broken.{form}"
    path.write_bytes(data)
    with pytest.raises(UnsupportedModuleError) as err:
        load_model(str(path))
    msg = str(err.value)
    assert str(path) in msg and parser_says in msg
    if form == "tvmscript":
        assert "takke" in msg and "(line " in msg


class _Celu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.act = torch.nn.CELU()

    def forward(self, x):
        return self.act(self.fc(x))


class _Erfinv(_Celu):
    def forward(self, x):
        return torch.erfinv(torch.tanh(self.fc(x)))


def test_unsupported_op_named_with_file(tmp_path):
    onnx_path = str(tmp_path / "celu.onnx")
    torch.onnx.export(_Celu(), (torch.zeros(1, 4),), onnx_path, dynamo=False, input_names=["x"])
    with pytest.raises(UnsupportedModuleError, match=r"'.*celu.onnx' uses operator\(s\) the Relax ONNX importer "
                                                     r"does not support: Celu\. Replace them"):
        load_model(onnx_path)
    pt2_path = str(tmp_path / "erfinv.pt2")
    torch.export.save(torch.export.export(_Erfinv(), (torch.zeros(1, 4),)), pt2_path)
    with pytest.raises(UnsupportedModuleError, match=r"'.*erfinv.pt2' uses operator\(s\) the Relax PyTorch importer "
                                                     r"does not support: erfinv.default\. Replace"):
        load_model(pt2_path)


def test_py_file_without_module_or_failing(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(UnsupportedModuleError, match=r"'.*empty.py' defines no Relax IRModule"):
        load_model(str(empty))
    failing = tmp_path / "failing.py"
    failing.write_text("import tvm\nraise RuntimeError('weights not found')\n")
    with pytest.raises(UnsupportedModuleError, match=r"running '.*failing.py'.*RuntimeError: weights not found"):
        load_model(str(failing))


def test_errors_are_pesto_errors():
    assert issubclass(GraphError, PestoError) and issubclass(UnsupportedModuleError, PestoError)
    with pytest.raises(PestoError):
        load_model("not-a-model")


def test_loaded_module_is_an_irmodule(files):
    m = load_model(files["mobilenet_v3", "pt2"])
    assert isinstance(m.mod, tvm.IRModule)
    with pytest.raises(AttributeError):  # frozen
        m.name = "other"
