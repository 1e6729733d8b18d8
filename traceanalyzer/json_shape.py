"""Small JSON inputs (profiler_info, profiler_metadata) read against a declared shape.

Nothing in such a file is trusted: it is read only if it is a regular file (after following a
link) within a size cap, decoded only if it is nested no deeper than a cap, and each declared
field is checked for its type. A field of the wrong type is dropped and named in the returned
problems ("config.experimental_config: expected an object, got a string"), so one odd field
costs that field, never the rank or the batch. What is not declared is kept as is (the store
keeps the whole document as JSON text).

A document of our own that an output folder holds (findings.json's overview) is declared as
dataclasses instead: :func:`to_json` writes it, :func:`from_json` reads it back typed, checked
the same way (an output folder may be someone else's).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

MAX_BYTES = 16 << 20  # torch_npu writes a few KB; a 16 MB info file is not one
MAX_DEPTH = 64  # nesting levels; the real files have four
MAX_TEXT = 4096  # characters of a declared string field
_INT = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only ("²".isdigit() is True)
T = TypeVar("T")


class InputFileError(ValueError):
    """A small input file that cannot be read as JSON of its kind; says why."""


def read_regular_file(path: Path, max_bytes: int = MAX_BYTES) -> bytes:
    """The bytes of ``path`` if it is a regular file (links followed) of at most ``max_bytes``.

    The file is opened without blocking and checked on the open descriptor, so a FIFO, a device
    (a link to /dev/urandom) or a directory is refused at once, never read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise InputFileError(f"cannot open ({exc.strerror or exc})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError("not a regular file (a device, FIFO, socket or directory)")
        if info.st_size > max_bytes:
            raise InputFileError(f"{info.st_size:,} bytes, over the {max_bytes:,}-byte cap")
        chunks, left = [], max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise InputFileError(f"unreadable ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:  # grew while read
        raise InputFileError(f"over the {max_bytes:,}-byte cap")
    return data


def _depth(doc: Any, max_depth: int) -> int:
    """How deep ``doc`` nests, counted without recursion and at most to ``max_depth + 1``: one
    level of containers at a time (a comprehension per container)."""
    deepest, depth = 0, 1
    level = [doc] if isinstance(doc, (dict, list)) else []
    while level and deepest <= max_depth:
        deepest = depth
        below: list[Any] = []
        for value in level:
            items = value.values() if isinstance(value, dict) else value
            below += [v for v in items if isinstance(v, (dict, list))]
        level, depth = below, depth + 1
    return deepest


def _integer_token(digits: str) -> int | str:
    """A JSON integer; one of absurd length stays text (the shapes then refuse it as a field,
    rather than the decoder refusing the whole file past 4,300 digits)."""
    return int(digits) if len(digits) <= 64 else digits


def load_json(path: Path, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Decode ``path`` (see :func:`read_regular_file`); :class:`InputFileError` says why not."""
    return loads(read_regular_file(path, max_bytes).decode("utf-8", errors="replace"), max_depth)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str, max_depth: int = MAX_DEPTH, *, constants: bool = True) -> Any:
    """Decode the JSON ``text`` of an input (a file's, a database value's), nested at most
    ``max_depth`` deep; ``constants=False`` refuses ``NaN`` and ``Infinity``, which JSON does
    not have. :class:`InputFileError` says why not."""
    strict = {} if constants else {"parse_constant": _no_constant}
    try:
        doc = json.loads(text, parse_int=_integer_token, **strict)
    except RecursionError as exc:  # the decoder recurses per level: 100,000 levels end here
        raise InputFileError(f"nested deeper than {max_depth} levels") from exc
    except ValueError as exc:
        raise InputFileError(f"not valid JSON ({exc})") from exc
    if _depth(doc, max_depth) > max_depth:
        raise InputFileError(f"nested deeper than {max_depth} levels")
    return doc


# --------------------------------------------------------------------------- shapes

# A leaf shape checks one value: returns the value to keep, or raises _Mismatch saying what is
# wrong; objects are declared with Obj and walked by conform().
Leaf = Callable[[Any], Any]


class _Mismatch(Exception):
    pass


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def text(value: Any) -> str:
    """A string of at most :data:`MAX_TEXT` characters."""
    if not isinstance(value, str):
        raise _Mismatch(f"expected a string, got {_kind(value)}")
    if len(value) > MAX_TEXT:
        raise _Mismatch(f"a string of {len(value):,} characters, over the {MAX_TEXT:,} cap")
    return value


def string(value: Any) -> str:
    """A string of any length (the file's size bounds it)."""
    if not isinstance(value, str):
        raise _Mismatch(f"expected a string, got {_kind(value)}")
    return value


def number(value: Any) -> float | int:
    """A finite JSON number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch(f"expected a number, got {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Mismatch("expected a finite number")
    return value


def one_of(*choices: str) -> Leaf:
    """One of the strings ``choices``."""

    def check(value: Any) -> str:
        if value not in choices:
            shown = repr(value[:20]) if isinstance(value, str) else _kind(value)
            raise _Mismatch(f"expected one of {', '.join(choices)}, got {shown}")
        return value

    return check


def name_of(valid: Callable[[str], bool], what: str) -> Leaf:
    """A string that ``valid`` accepts; ``what`` says what it must be ("a session id")."""

    def check(value: Any) -> str:
        if not isinstance(value, str) or not valid(value):
            shown = repr(value[:40]) if isinstance(value, str) else _kind(value)
            raise _Mismatch(f"expected {what}, got {shown}")
        return value

    return check


def integer(low: int, high: int) -> Leaf:
    """An integer in [low, high], written as a JSON number or a string of ASCII digits."""

    def check(value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _INT.fullmatch(value.strip()):
            number = int(value.strip())
        else:
            shown = repr(value[:20]) if isinstance(value, str) else _kind(value)
            raise _Mismatch(f"expected an integer, got {shown}")
        if not low <= number <= high:
            raise _Mismatch(f"{number} is outside [{low}, {high}]")
        return number

    return check


def list_of(item: Leaf, max_items: int = 1 << 20) -> Leaf:
    """A list whose items all fit ``item`` (or a lone item, as torch_npu writes one type)."""

    def check(value: Any) -> list[Any]:
        values = value if isinstance(value, list) else [value]
        if len(values) > max_items:
            raise _Mismatch(f"{len(values):,} items, over the {max_items:,} cap")
        return [item(v) for v in values]

    return check


@dataclass(frozen=True)
class Obj:
    """An object with declared ``fields`` (each optional, unless ``required``: present and not
    null); other keys are kept unchecked, or, with ``values``, every value is checked against
    that shape (a map keyed by name)."""

    fields: Mapping[str, Shape] = field(default_factory=dict)
    values: Shape | None = None
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Items:
    """A list of at most ``max_items`` items, each of shape ``item`` (an object, say)."""

    item: Shape
    max_items: int = 1 << 24


Shape = Leaf | Obj | Items


def conform(value: Any, shape: Shape, where: str = "") -> tuple[Any, list[str]]:
    """``value`` with every field that does not fit ``shape`` dropped, and one problem per
    dropped field ("config.experimental_config: expected an object, got a string")."""
    problems: list[str] = []
    if isinstance(shape, Items):
        if not isinstance(value, list) or len(value) > shape.max_items:
            shown = f"{len(value):,} items" if isinstance(value, list) else _kind(value)
            return None, [f"{where or 'top level'}: expected a list, got {shown}"]
        items = []
        for index, item in enumerate(value):
            fitted, found = conform(item, shape.item, f"{where}[{index}]")
            problems += found
            if not found or fitted is not None:
                items.append(fitted)
        return items, problems
    if not isinstance(shape, Obj):
        try:
            return shape(value), problems
        except _Mismatch as exc:
            return None, [f"{where or 'top level'}: {exc}"]
    if not isinstance(value, dict):
        return None, [f"{where or 'top level'}: expected an object, got {_kind(value)}"]
    problems += [
        f"{where}.{key}: missing" if where else f"{key}: missing"
        for key in shape.required
        if value.get(key) is None
    ]
    kept: dict[str, Any] = {}
    for key, item in value.items():
        sub = shape.fields.get(key, shape.values)
        if sub is None or item is None:  # undeclared, or null (absent)
            kept[key] = item
            continue
        fitted, found = conform(item, sub, f"{where}.{key}" if where else key)
        problems += found
        if not found or fitted is not None:
            kept[key] = fitted
    return kept, problems


_RANK = integer(-1, (1 << 31) - 1)
_NS = integer(0, (1 << 63) - 1)

PROFILER_INFO = Obj(
    {
        "rank_id": _RANK,
        "torch_npu_version": text,
        "cann_version": text,
        "config": Obj(
            {
                "experimental_config": Obj(
                    {"_export_type": list_of(text, 16), "_profiler_level": text}
                ),
            }
        ),
        "end_info": Obj({"collectionTimeEnd": _NS}),
    }
)
"""profiler_info_<rank>.json: the fields discovery reads."""

PROFILER_METADATA = Obj(
    {
        "parallel_group_info": Obj(
            values=Obj({"group_name": text, "group_rank": _RANK, "global_ranks": list_of(_RANK)})
        )
    }
)
"""profiler_metadata.json: free key-values (prof.add_metadata) plus the parallel groups."""


def read_shaped(path: Path, shape: Obj) -> tuple[dict[str, Any], list[str]]:
    """``path`` decoded and conformed to ``shape``: (the object, problems naming each dropped
    field). Raises :class:`InputFileError` when nothing of it is usable."""
    doc = load_json(path)
    if not isinstance(doc, dict):
        raise InputFileError(f"top level: expected an object, got {_kind(doc)}")
    return conform(doc, shape)


# --------------------------------------------------------------------------- typed documents

# A document of our own (findings.json's overview) is declared as frozen dataclasses: written
# field by field in their order, and read back into them, checked as any input is (an output
# folder may be someone else's). A missing or null field reads as its type's empty value (0,
# "", [], {}, None, a dataclass of empty fields); a field of another type too, with a problem
# naming it; a list or map item of another type is left out, with a problem.

FLATTEN = "flatten"
"""Field metadata: the keys of a mapping field that are written into its object's own keys."""

_DROP = object()  # a value that does not fit: its container leaves it out


def to_json(value: Any) -> Any:
    """``value`` (dataclasses, lists, tuples, dicts, JSON scalars) as JSON values: a dataclass
    as an object of its fields in their order, but the ones its ``json_absent()`` names (the
    fields a state of it does not write), a :data:`FLATTEN` field's items in its place."""
    if is_dataclass(value) and not isinstance(value, type):
        absent = value.json_absent() if hasattr(value, "json_absent") else ()
        out: dict[str, Any] = {}
        for f in fields(value):
            if f.name in absent:
                continue
            item = getattr(value, f.name)
            if FLATTEN in f.metadata:
                out.update((k, to_json(v)) for k, v in item.items())
            else:
                out[f.name] = to_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(kind: type[T], value: Any, where: str = "") -> tuple[T, list[str]]:
    """``value`` read as ``kind`` (a dataclass written by :func:`to_json`), and the problems of
    the fields that did not fit (each then read as its type's empty value)."""
    problems: list[str] = []
    read = _reader(kind)
    return (_empty(kind)() if value is None else read(value, where, problems)), problems


_Reader = Callable[[Any, str, list[str]], Any]


def _mismatch(problems: list[str], where: str, what: str, value: Any) -> object:
    problems.append(f"{where or 'top level'}: expected {what}, got {_kind(value)}")
    return _DROP


def _empty(kind: Any) -> Callable[[], Any]:
    """A maker of ``kind``'s empty value (what a missing or null field reads as)."""
    origin = get_origin(kind)
    if kind is Any or (origin in (Union, UnionType) and type(None) in get_args(kind)):
        return lambda: None
    if is_dataclass(kind):
        return lambda: _reader(kind)({}, "", [])
    return origin or kind  # list, dict, tuple, str, int, float, bool: called without arguments


@functools.cache
def _reader(kind: Any) -> _Reader:
    """How a value is read as ``kind`` (compiled once per type)."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return lambda v, w, p: v
    if origin in (Union, UnionType):
        (inner,) = (a for a in args if a is not type(None))  # X | None: the one union declared
        read = _reader(inner)
        return lambda v, w, p: None if v is None else read(v, w, p)
    if is_dataclass(kind):
        return _object_reader(kind)
    if origin is list:
        item = _reader(args[0])

        def read_list(v: Any, w: str, p: list[str]) -> Any:
            if not isinstance(v, list):
                return _mismatch(p, w, "a list", v)
            return [x for i, e in enumerate(v) if (x := item(e, f"{w}[{i}]", p)) is not _DROP]

        return read_list
    named = isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields")
    if origin is tuple or named:  # a fixed tuple, or a NamedTuple: written as a list
        hints = get_type_hints(kind) if named else {}
        items = [_reader(hints[f]) for f in kind._fields] if named else [_reader(a) for a in args]
        make = kind if named else lambda *values: values

        def read_tuple(v: Any, w: str, p: list[str]) -> Any:
            if not isinstance(v, list) or len(v) != len(items):
                return _mismatch(p, w, f"a list of {len(items)} items", v)
            pairs = enumerate(zip(items, v, strict=True))
            out = tuple(read(e, f"{w}[{i}]", p) for i, (read, e) in pairs)
            return _DROP if _DROP in out else make(*out)

        return read_tuple
    if origin is dict:
        value = _reader(args[1])

        def read_dict(v: Any, w: str, p: list[str]) -> Any:
            if not isinstance(v, dict):
                return _mismatch(p, w, "an object", v)
            return {k: x for k, e in v.items() if (x := value(e, f"{w}.{k}", p)) is not _DROP}

        return read_dict
    return _scalar_reader(kind)


def _scalar_reader(kind: Any) -> _Reader:
    if kind is float:
        accept, what = (int, float), "a number"
    else:
        accept, what = kind, {int: "an integer", str: "a string", bool: "a boolean"}[kind]

    def read(v: Any, w: str, p: list[str]) -> Any:
        fits = isinstance(v, accept) and (kind is bool or not isinstance(v, bool))
        if fits and (kind is not float or math.isfinite(v)):
            return v
        return _mismatch(p, w, what, v)

    return read


def _object_reader(kind: Any) -> _Reader:
    hints = get_type_hints(kind)
    plan = [
        (f.name, _reader(hints[f.name]), _empty(hints[f.name]), f.metadata.get(FLATTEN))
        for f in fields(kind)
    ]

    def read(v: Any, w: str, p: list[str]) -> Any:
        if not isinstance(v, dict):
            _mismatch(p, w, "an object", v)
            v = {}
        values = {}
        for name, read_field, empty, flattened in plan:
            if flattened is not None:  # its keys are the object's own
                v_field: Any = {k: v[k] for k in flattened if k in v}
            else:
                v_field = v.get(name)
            x = _DROP if v_field is None else read_field(v_field, f"{w}.{name}" if w else name, p)
            values[name] = empty() if x is _DROP else x
        return kind(**values)

    return read
