"""A placed model as a program of steps the executor runs (plain data, no compiler).

Steps: ``call`` (run a segment function on its device), ``copy`` (move a value to another
device), ``item`` (take a tuple field), ``tuple`` (build a tuple) and ``alias`` (a plain
variable copy). :func:`tvm_pesto.builder.program.read_program` reads one from a placed
module's ``main``; :meth:`Program.to_dict` / :meth:`Program.from_dict` store it with an
exported bundle, so a deployed model runs without TVM's compiler.

``input_devices`` says where each input lives (device 0 unless the placed module put it
elsewhere); ``state`` lists ``(output index, input index)`` pairs whose output is the next
value of that input (a training step's parameters), kept on its device between runs by
:meth:`tvm_pesto.run.runtime.PlacedRuntime.step`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import ExecutionError


@dataclass
class Step:
    kind: str  # call | copy | item | tuple | alias
    out: str
    args: list[str]
    device: int = 0
    func: str = ""
    index: int = 0
    deps: list[str] = field(default_factory=list)
    extern: str = ""  # a call whose segment is one library unit over its inputs: the unit's global name


@dataclass
class Program:
    inputs: list[str]
    steps: list[Step]
    output: object  # str key, or nested tuple of keys
    num_devices: int
    input_devices: list[int] = None  # device of each input (default: all on device 0)
    state: list = field(default_factory=list)  # (output index, input index): the input's next value

    def __post_init__(self):
        if self.input_devices is None:
            self.input_devices = [0] * len(self.inputs)
        self.input_devices = [int(d) for d in self.input_devices]
        self.state = [(int(o), int(i)) for o, i in self.state]

    def to_dict(self) -> dict:
        return {"inputs": list(self.inputs), "steps": [asdict(s) for s in self.steps],
                "output": _out_to_json(self.output), "num_devices": self.num_devices,
                "input_devices": list(self.input_devices), "state": [list(p) for p in self.state]}

    @classmethod
    def from_dict(cls, d: dict) -> "Program":
        try:
            steps = [Step(**s) for s in d["steps"]]
            return cls(list(d["inputs"]), steps, _out_from_json(d["output"]), int(d["num_devices"]),
                       d.get("input_devices"), [tuple(p) for p in d.get("state", [])])
        except (KeyError, TypeError, ValueError) as e:
            raise ExecutionError(f"the program description is malformed ({type(e).__name__}: {e}); "
                                 "export the placed model again") from e

    def calls(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "call"]


def _out_to_json(out):
    return [_out_to_json(o) for o in out] if isinstance(out, tuple) else out


def _out_from_json(out):
    return tuple(_out_from_json(o) for o in out) if isinstance(out, list) else out
