"""One CLI command per operator, with options generated from the workload models.

`pipetune model rank gemm --m ...`, `pipetune model rank softmax --rows ...`, and every later
command that takes a workload, build their per-operator commands here, so the options always
match the kernel families' workload types (every family's operators, model/family.py).
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import typer
from rich.markup import escape

from pipetune.clients.cli.errors import reported
from pipetune.model.family import op_families

_KW = inspect.Parameter.KEYWORD_ONLY


def _cli_type(annotation: Any) -> Any:
    """The type typer parses an option as: a Literal's values as text (the workload refuses
    the others, naming them), and an optional field's type without its pydantic metadata
    (typer does not look inside `Annotated[int, ...] | None`: softmax's `--queries 5`
    arrived as the text "5", which the strict integer refused)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return str
    if origin is typing.Annotated:
        return _cli_type(typing.get_args(annotation)[0])
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(operator.or_, map(_cli_type, typing.get_args(annotation)))
    return annotation


def _summary(model_cls: type, op: str) -> str:
    """The workload type's docstring's first paragraph on one line, its brackets kept from
    rich's markup (`x[r, :]`): its first line alone cut `reduce`'s sentence in two."""
    paragraph = (model_cls.__doc__ or op).strip().split("\n\n")[0]
    return escape(" ".join(paragraph.split()))


def every_op() -> dict[str, type]:
    """Every family's operators: op name -> workload type."""
    return {op: fam.ops[op] for op, fam in op_families().items()}


def shape_fields(op: str) -> list[str]:
    """The operator's required fields: its shape (the rest, e.g. b_layout, have defaults)."""
    fields = every_op()[op].model_fields.items()  # type: ignore[attr-defined]
    return [n for n, f in fields if n != "op" and f.is_required()]


def workload_parameters(
    op: str, shape_optional: bool = False, ops: Mapping[str, Any] | None = None
) -> list[inspect.Parameter]:
    """One option per workload field; with `shape_optional` the shape options may be left
    out (they arrive as None)."""
    ops = every_op() if ops is None else ops
    params = []
    for name, field in ops[op].model_fields.items():
        if name == "op":
            continue
        annotation = _cli_type(field.annotation)
        if field.is_required():
            default = None if shape_optional else ...
            annotation = annotation | None if shape_optional else annotation
        else:
            default = field.default
        option = typer.Option(default, f"--{name.replace('_', '-')}", help=field.description)
        params.append(inspect.Parameter(name, _KW, default=option, annotation=annotation))
    return params


def option(
    name: str,
    annotation: type,
    default: Any,
    *flags: str,
    help: str,
    parser: Callable[[str], Any] | None = None,
) -> inspect.Parameter:
    """An extra (non-workload) option for generated commands (`parser`: typer's, a value's
    own reading of its text)."""
    flags = flags or (f"--{name.replace('_', '-')}",)
    return inspect.Parameter(
        name,
        _KW,
        default=typer.Option(default, *flags, help=help, parser=parser),
        annotation=annotation,
    )


def add_workload_commands(
    app: typer.Typer,
    handler: Callable[..., None],
    extra: list[inspect.Parameter],
    summary: str,
    *,
    shape_optional: bool = False,
    ops: Mapping[str, Any] | None = None,
) -> None:
    """Register `<op>` commands on app; each calls handler(workload_dict, **extra_values).
    With `shape_optional` the shape options may be left out (None in the workload dict).
    `ops`: the operators to register (default every family's)."""
    ops = every_op() if ops is None else ops
    for op, model_cls in ops.items():
        fields = set(model_cls.model_fields) - {"op"}

        def command(_op: str = op, _fields: frozenset = frozenset(fields), **values: Any) -> None:
            workload = {"op": _op, **{k: v for k, v in values.items() if k in _fields}}
            handler(workload, **{k: v for k, v in values.items() if k not in _fields})

        params = workload_parameters(op, shape_optional, ops) + extra
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        app.command(op, help=f"{summary} {_summary(model_cls, op)}")(reported(command))
