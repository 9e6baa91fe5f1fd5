"""The models cost-model rows come from: their names, their architecture families, their modules.

``tvm-pesto cost-model eval --holdout family`` trains without one family at a time and scores
it, so the families must say what a user would call an architecture: a zoo model, a model of
:mod:`tvm_pesto.zoo.outside` and a corpus model (:mod:`tvm_pesto.zoo.corpus`, rows named
``corpus:NAME``) of one architecture share a family (the zoo's ``resnet50`` and the corpus's
``resnet18`` are both ``ResNet``). The corpus names its own families (:attr:`Arch.family
<tvm_pesto.zoo.corpus.Arch>`); the zoo's and the outside models' are :data:`MODEL_FAMILIES`,
spelled as the corpus spells them. Shape sweeps (``sweep-*``) and MetaSchedule databases
(``tuning-db:*``) are :data:`TRAINING_ONLY`: no architecture, always trained on.
:func:`model_module` makes the Relax module of any such model name (``tvm-pesto profile``
and ``cost-model eval --flow`` take the same names).

Examples
--------
>>> model_family("resnet50:full"), model_family("corpus:resnet18"), model_family("corpus:vit_tiny_patch16_224:full")
('ResNet', 'ResNet', 'ViT')
>>> model_family("sweep-conv2d"), model_family("tuning-db:ms-small"), model_family("my_net")
('sweep', 'tuning-db', 'my_net')
>>> corpus_row_name("resnet18", "full"), corpus_arch("corpus:resnet18:full").name
('corpus:resnet18:full', 'resnet18')
"""
from __future__ import annotations

from tvm_pesto import zoo
from tvm_pesto.bench.sources import ModelSource
from tvm_pesto.errors import CostError
from tvm_pesto.zoo import MODELS as ZOO
from tvm_pesto.zoo import outside
from tvm_pesto.zoo.corpus import CORPUS, Arch
from tvm_pesto.zoo.outside import MODELS as OUTSIDE
from .dataset import base_model

#: How rows of a corpus model are named: ``corpus:NAME`` (``corpus:NAME:full`` at size full).
CORPUS_PREFIX = "corpus:"

#: The family of each zoo model and each model outside the zoo (the corpus's spelling).
MODEL_FAMILIES = {
    "bert": "BERT", "gpt2": "GPT-2", "inception_v3": "Inception", "mlp_mixer": "MLP-Mixer",
    "mobilenet_v2": "MobileNetV2", "resnet50": "ResNet", "vgg11": "VGG",
    "vit": "ViT", "text_encoder": "TextEncoder", "convnext": "ConvNeXt", "mobilenet_v3": "MobileNetV3",
}
assert set(MODEL_FAMILIES) == set(ZOO) | set(OUTSIDE), "every zoo and outside model has a family"

#: Families of rows that are no architecture: trained on in every fold, never held out.
TRAINING_ONLY = ("sweep", "tuning-db")


def corpus_row_name(name: str, size: str = "small") -> str:
    """The model name the profiler writes into the rows of corpus model ``name`` at ``size``."""
    return f"{CORPUS_PREFIX}{name}" + ("" if size == "small" else f":{size}")


def corpus_arch(row_model: str) -> Arch | None:
    """The corpus architecture a row's model name (:func:`corpus_row_name`) names, or None."""
    base = base_model(row_model)
    return CORPUS.get(base[len(CORPUS_PREFIX):]) if base.startswith(CORPUS_PREFIX) else None


def model_names(names) -> list[str]:
    """``names`` with ``zoo``, ``outside`` and ``corpus`` expanded to every model of each;
    every name checked (a zoo model, a model outside the zoo, or ``corpus:NAME``).

    Raises
    ------
    CostError
        A name of no such model, listing those there are.

    Examples
    --------
    >>> model_names(["gpt2", "corpus:resnet18"])
    ['gpt2', 'corpus:resnet18']
    >>> len(model_names(["corpus"])) == len(CORPUS)
    True
    """
    out = []
    for n in names:
        out.extend(list(ZOO) if n == "zoo" else list(OUTSIDE) if n == "outside"
                   else [corpus_row_name(a) for a in CORPUS] if n == "corpus" else [n])
    bad = [n for n in out if n not in ZOO and n not in OUTSIDE and n.removeprefix(CORPUS_PREFIX) not in CORPUS]
    if bad:
        raise CostError(f"unknown model {bad[0]!r}; use a zoo model ({', '.join(ZOO)}), zoo, a model outside the zoo "
                        f"({', '.join(OUTSIDE)}), outside, corpus:NAME (NAME of tvm_pesto.zoo.corpus: "
                        f"{', '.join(CORPUS)}) or corpus")
    return out


def model_module(name: str, size: str = "small"):
    """The Relax module of model ``name`` (a name :func:`model_names` accepts, without size)
    at ``size``: a zoo model, a model outside the zoo, or a corpus model (``corpus:NAME``,
    which needs timm and torchvision)."""
    if name.startswith(CORPUS_PREFIX):
        return ModelSource("corpus", name[len(CORPUS_PREFIX):], size).load()[2]
    if name in OUTSIDE:
        return outside.relax_module(name, size)
    return zoo.load(name, size).mod


def model_family(name: str) -> str:
    """The architecture family of a row's model name (any size); a name of no known model is
    its own family (without its size)."""
    base = base_model(name)
    if base.startswith("sweep"):
        return "sweep"
    if base.startswith("tuning-db"):
        return "tuning-db"
    arch = corpus_arch(base)
    if arch is not None:
        return arch.family
    return MODEL_FAMILIES.get(base, base)


def check_families(asked, present) -> list[str]:
    """``asked`` (family names), each checked against the families ``present`` in the rows.

    Raises
    ------
    CostError
        A family with no rows, naming those there are.
    """
    missing = sorted(set(asked) - set(present))
    if missing:
        raise CostError(f"no rows of famil{'y' if len(missing) == 1 else 'ies'} {', '.join(missing)}; the rows hold "
                         f"{', '.join(sorted(present))}: name one of those (or profile the family's models first)")
    return list(asked)


__all__ = ["CORPUS_PREFIX", "MODEL_FAMILIES", "TRAINING_ONLY", "check_families", "corpus_arch", "corpus_row_name",
           "model_family", "model_module", "model_names"]
