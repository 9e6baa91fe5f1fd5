"""The losses and optimizers a training step can use, by name.

Losses are TVM's (:mod:`tvm.relax.training.loss`): ``mse``, ``l1``, ``cross_entropy``
(log-softmax + NLL on integer class labels) and ``categorical_cross_entropy`` (on one-hot
integer targets). Optimizers are TVM's (:mod:`tvm.relax.training.optimizer`): ``sgd``,
``momentum`` (momentum SGD) and ``adam``. ``auto`` picks cross entropy for an output of
shape ``(batch, classes)`` and MSE otherwise.

Examples
--------
>>> from tvm import relax
>>> from tvm_pesto.train.choices import make_loss, make_optimizer
>>> loss = make_loss("auto", relax.TensorType((4, 10), "float32"))
>>> loss.name, loss.target_type
('cross_entropy', R.Tensor((4,), dtype="int64"))
>>> make_optimizer("adam").lr
0.001
"""
from __future__ import annotations

from dataclasses import dataclass

from tvm import relax
from tvm.relax.training import loss as tvm_loss
from tvm.relax.training import optimizer as tvm_optimizer

from ..errors import TrainingError

__all__ = ["LOSSES", "OPTIMIZERS", "DEFAULT_LR", "LossChoice", "make_loss", "make_optimizer"]

LOSSES = ("mse", "l1", "cross_entropy", "categorical_cross_entropy")
OPTIMIZERS = ("sgd", "momentum", "adam")
#: Learning rate per optimizer when none is given.
DEFAULT_LR = {"sgd": 0.1, "momentum": 0.02, "adam": 1e-3}


class _NamedDtype:
    """TVM 0.27's optimizers keep their dtype as a ``DataType`` object, which ``Adam.init``
    hands to numpy (and numpy refuses); keep its name instead."""

    def _set_params_and_dtype(self, params):
        super()._set_params_and_dtype(params)
        self.dtype = str(getattr(self.dtype, "dtype", self.dtype))


class SGD(_NamedDtype, tvm_optimizer.SGD):
    pass


class MomentumSGD(_NamedDtype, tvm_optimizer.MomentumSGD):
    pass


class Adam(_NamedDtype, tvm_optimizer.Adam):
    pass


_OPTIMIZER_CLASSES = {"sgd": SGD, "momentum": MomentumSGD, "adam": Adam}


@dataclass
class LossChoice:
    """A TVM loss with what the step needs to call it.

    Attributes
    ----------
    name : str
    loss : tvm.relax.training.loss.Loss
    target_type : relax.TensorType
        The type of the targets (labels or values) the loss compares the output with.
    output_type : relax.TensorType
        The model's output type.
    """

    name: str
    loss: object
    target_type: relax.TensorType
    output_type: relax.TensorType

    @property
    def args(self) -> list:
        """SetupTrainer's ``loss_args``: the output type and the target type."""
        return [self.output_type, self.target_type]


def _shape(ty) -> tuple[int, ...]:
    return tuple(int(v) for v in ty.shape.values)


def make_loss(name: str, output_type: relax.TensorType) -> LossChoice:
    """The loss ``name`` (or ``auto``) for a model whose output has type ``output_type``.

    Raises
    ------
    TrainingError
        For an unknown name (the message lists the known ones), or a classification loss on
        an output that is not ``(batch, classes)``.
    """
    if not isinstance(output_type, relax.TensorType):
        raise TrainingError(f"the model returns {output_type}; training needs one output tensor (return the "
                            "tensor the loss compares, not a tuple)")
    shape = _shape(output_type)
    key = str(name).lower().replace("-", "_")
    if key == "auto":
        key = "cross_entropy" if len(shape) == 2 else "mse"
    if key not in LOSSES:
        raise TrainingError(f"unknown loss {name!r}; use one of {', '.join(('auto',) + LOSSES)}")
    if key in ("cross_entropy", "categorical_cross_entropy") and len(shape) != 2:
        raise TrainingError(f"loss {key} needs an output of shape (batch, classes), but the model returns "
                            f"{shape}; use --loss mse or l1 for this model")
    if key == "mse":
        return LossChoice(key, tvm_loss.MSELoss(), output_type, output_type)
    if key == "l1":
        return LossChoice(key, tvm_loss.L1Loss(), output_type, output_type)
    if key == "cross_entropy":
        return LossChoice(key, tvm_loss.CrossEntropyLoss(), relax.TensorType((shape[0],), "int64"), output_type)
    return LossChoice(key, tvm_loss.CategoricalCrossEntropyLoss(), relax.TensorType(shape, "int64"), output_type)


def make_optimizer(name: str, lr: float | None = None):
    """TVM's optimizer ``name`` with learning rate ``lr`` (default :data:`DEFAULT_LR`).

    Raises
    ------
    TrainingError
        For an unknown name (the message lists the known ones) or a learning rate <= 0.
    """
    key = str(name).lower().replace("-", "_")
    if key not in _OPTIMIZER_CLASSES:
        raise TrainingError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")
    lr = DEFAULT_LR[key] if lr is None else float(lr)
    if not lr > 0:
        raise TrainingError(f"the learning rate must be > 0, not {lr}; pass e.g. --lr {DEFAULT_LR[key]}")
    if key == "momentum":
        return MomentumSGD(lr, momentum=0.9)
    return _OPTIMIZER_CLASSES[key](lr)
